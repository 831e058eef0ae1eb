"""Tables, ratios, goals and plots from the arm documents of ``python -m bench peers``.

Arms are grouped by run directory, env and policy; every ratio is between arms of one group,
so between runs made side by side on one machine. Where an env and policy were measured in
several runs (repeated commands, ``--rounds``), a table across them lists
each run's ratios to its own limit, their median and how many runs met the goal.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.compare_arms import ARMS, LIMIT_END, OURS, UNTRAINED, arm_kind
from bench.report import ratio, write_json
from runtime.time_spent import cpu_parts

GOAL_RATE_VS_LIMIT = 0.8
GOAL_SPJ_VS_SB3 = 7.0
GOAL_SPJ_VS_LIMIT = 0.8


def load_groups(root: Path) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """``(run dir, env, policy) -> {arm: doc}`` for every arm document under ``root``."""
    groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for path in sorted(root.rglob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if (
            not isinstance(doc, dict)
            or arm_kind(str(doc.get("arm"))) not in ARMS
            or "command" not in doc
        ):
            continue
        key = (str(path.parent.relative_to(root)), doc["env"], doc["policy"])
        groups.setdefault(key, {})[doc["arm"]] = doc
    if not groups:
        raise SystemExit(f"no `python -m bench peers` arm documents under {root}")
    limits = {
        (k[0], k[1]): {n: arms[n] for n in ("limit", LIMIT_END) if n in arms}
        for k, arms in groups.items()
        if "limit" in arms
    }
    for (run, env, _), arms in groups.items():  # the limit takes no policy: share it in a run
        if "limit" not in arms and (run, env) in limits:
            arms.update(limits[(run, env)])
    return {
        k: arms
        for k, arms in groups.items()
        if not set(arms) <= {"limit", LIMIT_END}
        or not any(kk[:2] == k[:2] and kk != k for kk in groups)
    }


def ordered(arms: dict[str, Any]) -> list[str]:
    """Arm names in ``ARMS`` order (labelled exported arms after ``exported``, by label)."""
    return sorted(arms, key=lambda n: (ARMS.index(arm_kind(n)), n))


def limit_reference(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The limit the ratios are taken to: the limit arm's figures, or with a ``limit-end`` arm
    (``--limit-again``) the mean of the two, with ``drift`` = end / start steps/s."""
    start, end = arms.get("limit", {}), arms.get(LIMIT_END, {})
    keys = ("steps_per_s", "steps_per_joule")
    if not all(start.get(k) and end.get(k) for k in keys):
        return start
    return {
        **{k: (start[k] + end[k]) / 2 for k in keys},
        "drift": end["steps_per_s"] / start["steps_per_s"],
    }


def group_summary(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each arm's ratios to the limit and to the peers, and the issue's goals for the group."""
    limit = limit_reference(arms)
    sb3 = [arms[k] for k in ("sb3-cpu", "sb3-cuda") if arms.get(k, {}).get("steps_per_joule")]
    sb3_best = max(sb3, key=lambda d: d["steps_per_joule"]) if sb3 else {}
    rows = {}
    for name in ordered(arms):
        d = arms[name]
        rows[name] = {
            "steps_per_s_vs_limit": ratio(d.get("steps_per_s"), limit.get("steps_per_s")),
            "steps_per_joule_vs_limit": ratio(
                d.get("steps_per_joule"), limit.get("steps_per_joule")
            ),
            "steps_per_joule_vs_sb3_best": ratio(
                d.get("steps_per_joule"), sb3_best.get("steps_per_joule")
            ),
            "steps_per_joule_vs_cleanrl": ratio(
                d.get("steps_per_joule"), arms.get("cleanrl", {}).get("steps_per_joule")
            ),
        }
    ours = [d for k, d in arms.items() if arm_kind(k) in OURS and d.get("steps_per_joule")]
    goals: dict[str, Any] = {}
    if ours:
        fast = max(ours, key=lambda d: d["steps_per_s"])
        thrifty = max(ours, key=lambda d: d["steps_per_joule"])
        checks = (
            (
                "trained steps/s vs limit",
                fast,
                rows[fast["arm"]]["steps_per_s_vs_limit"],
                GOAL_RATE_VS_LIMIT,
            ),
            (
                "steps/J vs SB3 best",
                thrifty,
                rows[thrifty["arm"]]["steps_per_joule_vs_sb3_best"],
                GOAL_SPJ_VS_SB3,
            ),
            (
                "steps/J vs limit",
                thrifty,
                rows[thrifty["arm"]]["steps_per_joule_vs_limit"],
                GOAL_SPJ_VS_LIMIT,
            ),
        )
        for name, d, value, goal in checks:
            goals[name] = {
                "arm": d["arm"],
                "ratio": value,
                "goal": goal,
                "met": None if value is None else value >= goal,
            }
    return {
        "ratios": rows,
        "sb3_best": sb3_best.get("arm"),
        "goals": goals,
        "limit_drift": limit.get("drift"),
    }


def across_runs(summaries: list[tuple[tuple[str, str, str], dict[str, Any]]]) -> list[dict]:
    """For each env and policy measured in two or more runs, each arm's ratios to its own run's
    limit across those runs: every value in run order, the median, and how many met the goal."""
    by_workload: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for (run, env, policy), summary in summaries:
        by_workload.setdefault((env, policy), []).append((run, summary))
    out = []
    for (env, policy), runs in by_workload.items():
        if len(runs) < 2:
            continue
        arms: dict[str, dict[str, list[float]]] = {}
        for _, summary in runs:
            for arm, ratios in summary["ratios"].items():
                if arm_kind(arm) == "limit":
                    continue
                for key in ("steps_per_s_vs_limit", "steps_per_joule_vs_limit"):
                    if ratios.get(key) is not None:
                        arms.setdefault(arm, {}).setdefault(key, []).append(ratios[key])
        rows = {}
        for arm, values in arms.items():
            rows[arm] = {
                key: {
                    "values": v,
                    "median": statistics.median(v),
                    "met": sum(x >= goal for x in v),
                    "runs": len(v),
                }
                for key, goal in (
                    ("steps_per_s_vs_limit", GOAL_RATE_VS_LIMIT),
                    ("steps_per_joule_vs_limit", GOAL_SPJ_VS_LIMIT),
                )
                if (v := values.get(key))
            }
        out.append({"env": env, "policy": policy, "runs": [r for r, _ in runs], "arms": rows})
    return out


def across_markdown(entry: dict[str, Any]) -> str:
    head = (
        f"**{entry['env']}**, policy `{entry['policy']}`, across {len(entry['runs'])} runs "
        f"({', '.join(entry['runs'])}): each run's ratio to its own limit, in run order, "
        "the median, and the runs that met the goal (>= 0.8)"
    )
    lines = [
        head,
        "",
        "| arm | steps/s / limit | median | met | steps/J / limit | median | met |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for arm in ordered(entry["arms"]):
        cells = []
        for key in ("steps_per_s_vs_limit", "steps_per_joule_vs_limit"):
            r = entry["arms"][arm].get(key)
            cells += (
                ["-", "-", "-"]
                if r is None
                else [
                    ", ".join(f"{x:.2f}" for x in r["values"]),
                    f"{r['median']:.2f}",
                    f"{r['met']} of {r['runs']}",
                ]
            )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _num(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def markdown(key: tuple[str, str, str], arms: dict[str, dict], summary: dict[str, Any]) -> str:
    run, env, policy = key
    first = next(iter(arms.values()))
    out = [
        f"**{env}**, policy `{policy}` (run `{run}`; GPU energy {first['gpu']}, "
        f"CPU energy {first['cpu']})",
        "",
        "| arm | trained steps/s | GPU W | CPU W | steps/J | steps/s / limit | steps/J / limit "
        "| steps/J / SB3 best | steps/J / CleanRL | return at end (steps) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["ratios"].items():
        d = arms[name]
        if name in UNTRAINED:  # no trained steps: their figures are in the payoff section
            continue
        if "error" in d:
            out.append(f"| {name} | failed: {d['error']} |||||||||")
            continue
        ret = (
            "-"
            if d.get("final_return") is None
            else (f"{d['final_return']:,.0f} ({d['final_steps'] / 1e6:.2f}M)")
        )
        out.append(
            f"| {name} | {_num(d['steps_per_s'])} | {_num(d['gpu_w'])} | "
            f"{_num(d['cpu_w'])} | {_num(d['steps_per_joule'], 1)} | "
            f"{_num(r['steps_per_s_vs_limit'], 2)} | "
            f"{_num(r['steps_per_joule_vs_limit'], 2)} | "
            f"{_num(r['steps_per_joule_vs_sb3_best'], 2)} | "
            f"{_num(r['steps_per_joule_vs_cleanrl'], 2)} | {ret} |"
        )
    if summary["goals"] or summary.get("limit_drift"):
        out.append("")
    if summary.get("limit_drift"):
        out.append(
            f"- limit drift: {summary['limit_drift']:.3f} (limit-end / limit steps/s); "
            "the ratios are to the two limits' mean"
        )
    for name, g in summary["goals"].items():
        verdict = "not measured" if g["met"] is None else ("met" if g["met"] else "NOT met")
        out.append(f"- {name}: {_num(g['ratio'], 3)} ({g['arm']}), goal >= {g['goal']}: {verdict}")
    spent = {name: d["cpu_time"] for name, d in arms.items() if d.get("cpu_time")}
    if spent:
        out += ["", "CPU seconds over each whole run (the result's `cpu_time`):", ""]
        out += [
            f"- {name}: {cpu_parts(c)} of {c['core_s']:,.0f} core-s" for name, c in spent.items()
        ]
    return "\n".join(out) + "\n"


def _color(arm: str) -> str:
    """grey: the limit; blue: this project; orange: the peers."""
    kind = arm_kind(arm)
    if kind == "limit":
        return "grey"
    return "tab:blue" if kind in OURS else "tab:orange"


def plot(key: tuple[str, str, str], arms: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ordered(arms) if "error" not in arms[n] and n not in UNTRAINED]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * len(names) + 1.6))
    for ax, metric, label in (
        (axes[0], "steps_per_s", "trained steps/s"),
        (axes[1], "steps_per_joule", "trained steps/J"),
    ):
        values = [arms[n].get(metric) or 0.0 for n in names]
        colors = [_color(n) for n in names]
        ax.barh(names, values, color=colors)
        if "limit" in arms and arms["limit"].get(metric):
            ax.axvline(arms["limit"][metric], color="grey", ls="--", lw=1)
        ax.set_xlabel(label)
        ax.invert_yaxis()
    fig.suptitle(
        f"{key[1]}, policy {key[2]} (grey: limit, orange: peers, blue: autotune)", fontsize=9
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(root: Path, markdown_path: str | None, plots: str | None) -> dict[str, Any]:
    from bench import payoff_report as payoff

    groups = load_groups(root)
    text, doc = [], {"groups": [], "goals": {}}
    summaries = []
    for key, arms in groups.items():
        summary = group_summary(arms)
        summaries.append((key, summary))
        text.append(markdown(key, arms, summary))
        doc["groups"].append({"run": key[0], "env": key[1], "policy": key[2], **summary})
        doc["goals"][f"{key[1]} {key[2]} ({key[0]})"] = summary["goals"]
        slug = f"{key[0].replace('/', '_')}-{key[1]}-{key[2].replace(':', '_')}".strip(".-_")
        if plots:
            plot(key, arms, Path(plots) / f"compare-{slug}.png")
        if payoff.applies(arms):  # the learner or TPE arm: whether tuning pays for itself
            paid = payoff.summary(arms)
            doc["groups"][-1]["payoff"] = paid
            doc["goals"][f"{key[1]} {key[2]} ({key[0]}) payoff"] = paid["goals"]
            text.append(payoff.markdown(key, paid))
            if plots:
                payoff.plot(key, arms, paid, Path(plots) / f"payoff-{slug}.png")
    doc["across_runs"] = across_runs(summaries)
    text += [across_markdown(entry) for entry in doc["across_runs"]]
    if markdown_path:
        Path(markdown_path).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown_path).write_text("\n".join(text))
    write_json(root / "report.json", doc)
    return doc
