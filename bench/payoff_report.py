"""Whether tuning pays for itself: the figures of ``python -m bench peers`` runs that hold the
``learner`` arm and both tuned arms (``tuned``: the model sampler; ``tuned-tpe``: TPE).

For each run (one env and policy, side by side on one machine) it gives every arm's steps/J
over its measured window and over its whole run (start-up included), under both CPU models
(idle draw included, and busy cores only), as ratios to two limits:

* the raw-stepping limit (random actions on every core, no learning, GPU without a context);
* the second limit, which counts the learning: the raw limit's joules per step plus the
  learner's own joules per trained sample at its cheapest device and batch, measured alone
  (``bench/learner_limit.py``) and charged at the raw limit's step rate, the most its actors
  could feed it: a GPU's context draws its watts however few samples arrive, so spread over
  the learner's own rate alone (1.9M samples/s against 48k steps/s on Ant-v5) it would leave a
  limit no learner on that GPU can reach (``limit2_own_rate``, shown beside it).

And the goals: ``auto`` sizing (the ``default`` arm) at 0.8 of the raw limit; the model-tuned
run's whole-run steps/J at 0.9 of the best static config's (its steady window: a stricter
reference than the static run's own whole run); 0.95 of it reached within 120 s; after the
tuner's first 60 s no measured window under 0.7 of the incumbent; 1.3x TPE's whole-run
steps/J; 0.85 of the second limit. Plots: steps/J and the knobs over time for both tuners.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.compare_arms import UNTRAINED, arm_kind
from bench.compare_report import limit_reference
from bench.learner_limit import cheapest_at
from bench.report import ratio

GOAL_AUTO_VS_LIMIT = 0.8
GOAL_TUNED_VS_STATIC = 0.9
GOAL_REACH = (0.95, 120.0)
GOAL_FLOOR = (0.7, 60.0)
GOAL_VS_TPE = 1.3
GOAL_VS_LIMIT2 = 0.85
TRAILING_S = 20.0
"""The tuned run's steps/J when checking the 0.95 level: over this many trailing seconds."""


def applies(arms: dict[str, dict[str, Any]]) -> bool:
    return "learner" in arms or "tuned-tpe" in arms or "states" in arms


def learner_at(arms: dict[str, dict[str, Any]], rate: float) -> dict[str, Any] | None:
    """The learner arm's cheapest setting fed ``rate`` samples/s
    (``bench.learner_limit.cheapest_at``), or None without a learner measured."""
    doc = arms.get("learner", {}).get("learner") or {}
    best = doc.get("best")
    return cheapest_at(doc.get("settings") or ([best] if best else []), rate)


def with_learner(steps_per_joule: float, at: dict[str, Any]) -> float:
    """Steps/J with the learner's joules per sample at that rate added to each step's."""
    return 1 / (1 / steps_per_joule + at["j_per_sample"])


def second_limit(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The raw limit's steps/J (both CPU models) and the second limit's: the learner's
    cheapest setting fed the limit's step rate (``bench.learner_limit.cheapest_at``), and, as
    ``limit2_own_rate``, its cheapest at its own rate."""
    limit = limit_reference(arms)
    spj, rate = limit.get("steps_per_joule"), limit.get("steps_per_s") or None
    busy = arms.get("limit", {}).get("steps_per_joule_busy_only")
    best = (arms.get("learner", {}).get("learner") or {}).get("best")
    at = learner_at(arms, rate or 0.0)
    out = {"limit": spj, "limit_busy_only": busy, "learner_best": best, "rate": rate}
    if at:
        out["learner_at_rate"] = at
    for key, base in (("limit2", spj), ("limit2_busy_only", busy)):
        if base and at:
            out[key] = with_learner(base, at)
    if spj and best:
        out["limit2_own_rate"] = 1 / (1 / spj + best["marginal_j_per_sample"])
    return out


def at_states(arms: dict[str, dict[str, Any]], limits: dict[str, Any]) -> dict[str, Any] | None:
    """The most the ``default`` arm's states allow (the ``states`` arm: the actor's collect loop
    on every core acting with the arm's final policy, GPU without a context): that loop's
    steps/s and steps/J beside the limit's, the second limit at those states (the learner
    charged at the loop's rate, as the second limit charges it at the limit's) and the arm
    beside it. None without a states arm."""
    loops = arms.get("states", {}).get("loops") or {}
    collect, raw = loops.get("collect") or {}, loops.get("raw") or {}
    if not collect.get("steps_per_joule"):
        return None
    rate = collect["steps_per_s"]
    at = learner_at(arms, rate)
    limit2 = with_learner(collect["steps_per_joule"], at) if at else None
    default = arms.get("default", {})
    return {
        "collect": {k: collect.get(k) for k in ("steps_per_s", "steps_per_joule", "episode_len")},
        "raw": {k: raw.get(k) for k in ("steps_per_s", "steps_per_joule", "episode_len")},
        "envs_per_actor": (default.get("config") or {}).get("envs_per_actor"),
        "default_episode_len": (default.get("final_third") or {}).get("episode_len"),
        "steps_per_s_vs_limit": ratio(rate, limits.get("rate")),
        "limit2": limit2,
        "vs_limit2": ratio(limit2, limits.get("limit2")),
        "default_vs_it": ratio(default.get("steps_per_joule"), limit2),
    }


def _learner_line(lim: dict[str, Any]) -> str:
    """What the second limit charged for the learner, and how."""
    at = lim.get("learner_at_rate")
    if not at:
        return "no learner measured"
    where = f"{at.get('device', '-')}, batch {at.get('batch_size', '-')}"
    cost = f"{_n(at['j_per_sample'] * 1e6, 2)} uJ/sample ({where}"
    if not at["rest_measured"]:
        return f"the learner at its own best rate (its rest not measured): {cost})"
    parts = f"{_n(at['fixed_w'])} W held + {_n(at['busy_j_per_sample'] * 1e6, 2)} uJ busy"
    if not at["keeps_up"]:
        return (
            f"no learner setting keeps up with the limit's {_n(lim.get('rate'), 0)} steps/s; "
            f"the cheapest at its own {_n(at['samples_per_s'], 0)}: {cost}: {parts})"
        )
    return f"the learner fed the limit's {_n(lim.get('rate'), 0)} steps/s: {cost}: {parts})"


def reach_time(curve: list[dict[str, Any]], level: float) -> float | None:
    """Seconds from the arm's start to the first point where its steps/J over the trailing
    ``TRAILING_S`` reaches ``level``."""
    k = max(1, round(TRAILING_S / 10.0))
    for i in range(k - 1, len(curve)):
        values = [c["steps_per_joule"] or 0.0 for c in curve[i - k + 1 : i + 1]]
        if sum(values) / k >= level:
            return curve[i]["t"]
    return None


def floor_breaches(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Windows after the tuner's first ``GOAL_FLOOR[1]`` s under ``GOAL_FLOOR[0]`` x the
    incumbent at the time."""
    share, after = GOAL_FLOOR
    return [
        {"t": w["t"], "objective": w["objective"], "incumbent": w["incumbent"]}
        for w in windows
        if w["t"] >= after
        and w.get("incumbent")
        and w.get("objective") is not None
        and w["objective"] < share * w["incumbent"]
    ]


def summary(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    limits = second_limit(arms)
    statics = [d for n, d in arms.items() if arm_kind(n) == "exported" and d.get("steps_per_joule")]
    static = max(statics, key=lambda d: d["steps_per_joule"]) if statics else {}
    rows = {}
    for name, d in arms.items():
        if arm_kind(name) == "limit" or name in UNTRAINED or "error" in d:
            continue
        whole = d.get("whole_run") or {}
        rows[name] = {
            "steps_per_s": d.get("steps_per_s"),
            "steps_per_joule": d.get("steps_per_joule"),
            "steps_per_joule_busy_only": d.get("steps_per_joule_busy_only"),
            "whole_steps_per_joule": whole.get("steps_per_joule"),
            "whole_steps_per_joule_busy_only": whole.get("steps_per_joule_busy_only"),
            "whole_wall_s": whole.get("wall_s"),
            "vs_limit": ratio(d.get("steps_per_joule"), limits["limit"]),
            "vs_limit2": ratio(d.get("steps_per_joule"), limits.get("limit2")),
            "whole_vs_limit2": ratio(whole.get("steps_per_joule"), limits.get("limit2")),
            "config": d.get("config"),
        }
    tuned, tpe = arms.get("tuned", {}), arms.get("tuned-tpe", {})
    tuned_whole = (tuned.get("whole_run") or {}).get("steps_per_joule")
    static_spj = static.get("steps_per_joule")
    reach = reach_time(tuned.get("curve") or [], GOAL_REACH[0] * static_spj) if static_spj else None
    windows = (tuned.get("tuning") or {}).get("windows") or []
    breaches = floor_breaches(windows)
    best_ours = max((r["vs_limit2"] or 0.0 for r in rows.values()), default=None)
    goals = {
        "auto sizing steps/J vs limit": (
            rows.get("default", {}).get("vs_limit"),
            GOAL_AUTO_VS_LIMIT,
        ),
        "tuned whole-run steps/J vs best static": (
            ratio(tuned_whole, static_spj),
            GOAL_TUNED_VS_STATIC,
        ),
        "tuned whole-run steps/J vs TPE's": (
            ratio(tuned_whole, (tpe.get("whole_run") or {}).get("steps_per_joule")),
            GOAL_VS_TPE,
        ),
        "best steps/J vs second limit": (best_ours or None, GOAL_VS_LIMIT2),
    }
    out_goals = {
        name: {"value": v, "goal": g, "met": None if v is None else v >= g}
        for name, (v, g) in goals.items()
    }
    out_goals["tuned reaches 0.95 of best static (s)"] = {
        "value": reach,
        "goal": GOAL_REACH[1],
        "met": None
        if not static_spj or not tuned
        else (reach is not None and reach <= GOAL_REACH[1]),
    }
    out_goals["tuned windows under 0.7 of the incumbent after 60 s"] = {
        "value": len(breaches),
        "goal": 0,
        "met": None if not windows else not breaches,
        "breaches": breaches,
    }
    states = at_states(arms, limits)
    if states and states["vs_limit2"] is not None:
        out_goals["best steps/J vs second limit"]["at_most_at_its_states"] = states["vs_limit2"]
    return {
        "limits": limits,
        "states": states,
        "static": static.get("arm"),
        "rows": rows,
        "goals": out_goals,
    }


def _n(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def markdown(key: tuple[str, str, str], s: dict[str, Any]) -> str:
    run, env, policy = key
    lim = s["limits"]
    out = [
        f"**{env}**, policy `{policy}` (run `{run}`): limit {_n(lim['limit'])} steps/J "
        f"(busy cores only {_n(lim['limit_busy_only'])}); {_learner_line(lim)}; second limit "
        f"{_n(lim.get('limit2'))} steps/J (with the learner's cost at its own best rate: "
        f"{_n(lim.get('limit2_own_rate'))})",
        "",
        "| arm | config at the end | trained steps/s | steps/J window | busy-only "
        "| steps/J whole run | busy-only | whole s | window / limit | window / 2nd limit "
        "| whole / 2nd limit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in s["rows"].items():
        c = r["config"] or {}
        cfg = (
            f"{c.get('actors')}x{c.get('envs_per_actor')}, b{c.get('batch_size')}, "
            f"{c.get('trainer_device')}"
            if c
            else "-"
        )
        out.append(
            f"| {name} | {cfg} | {_n(r['steps_per_s'], 0)} | {_n(r['steps_per_joule'])} | "
            f"{_n(r['steps_per_joule_busy_only'])} | {_n(r['whole_steps_per_joule'])} | "
            f"{_n(r['whole_steps_per_joule_busy_only'])} | {_n(r['whole_wall_s'], 0)} | "
            f"{_n(r['vs_limit'], 2)} | {_n(r['vs_limit2'], 2)} | {_n(r['whole_vs_limit2'], 2)} |"
        )
    out.append("")
    for name, g in s["goals"].items():
        verdict = "not measured" if g["met"] is None else ("met" if g["met"] else "NOT met")
        most = g.get("at_most_at_its_states")
        beside = "" if most is None else f" (at most {_n(most, 2)} at the default arm's states)"
        out.append(f"- {name}: {_n(g['value'], 2)}, goal {g['goal']}: {verdict}{beside}")
    if st := s.get("states"):
        out.append(_states_line(st))
    return "\n".join(out) + "\n"


def _states_line(st: dict[str, Any]) -> str:
    """What the default arm's states allow, as one line of the section."""
    c, r = st["collect"], st["raw"]
    return (
        f"- at the default arm's states (the actor's loop on every core acting with its final "
        f"policy, {st['envs_per_actor']} envs per actor): {_n(c['steps_per_s'], 0)} steps/s, "
        f"{_n(c['steps_per_joule'])} steps/J, episodes of {_n(c['episode_len'])} steps (the "
        f"arm's final third: {_n(st['default_episode_len'])}; random actions at that shape: "
        f"{_n(r['steps_per_s'], 0)} steps/s, episodes of {_n(r['episode_len'])}); "
        f"{_n(st['steps_per_s_vs_limit'], 2)} of the limit's steps/s; the second limit at "
        f"those states {_n(st['limit2'])} steps/J, {_n(st['vs_limit2'], 2)} of the second "
        f"limit; the default arm at {_n(st['default_vs_it'], 2)} of it"
    )


def plot(key: tuple[str, str, str], arms: dict[str, dict[str, Any]], s: dict, path: Path) -> None:
    """Steps/J over time (10-s bins) and the knobs each tuner applied, for both tuners."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tuners = [n for n in ("tuned", "tuned-tpe") if arms.get(n, {}).get("curve")]
    fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    for name, color in zip(tuners, ("tab:blue", "tab:orange"), strict=False):
        d = arms[name]
        xs = [c["t"] for c in d["curve"]]
        axes[0].plot(xs, [c["steps_per_joule"] or 0 for c in d["curve"]], color=color, label=name)
        windows = (d.get("tuning") or {}).get("windows") or []
        t0 = d["started_unix"]
        wt = [w["at"] - t0 for w in windows]
        for ax, knob in zip(axes[1:], ("actors", "envs_per_actor", "batch_size"), strict=True):
            ax.step(
                wt, [w["values"].get(knob) for w in windows], where="post", color=color, marker="o"
            )
            ax.set_ylabel(knob, fontsize=8)
    for ax in axes[2:]:
        if ax.has_data():
            ax.set_yscale("log", base=2)
    for label, value, style in (
        ("best static", (arms.get(s["static"] or "", {}) or {}).get("steps_per_joule"), "--"),
        ("second limit", s["limits"].get("limit2"), ":"),
    ):
        if value:
            axes[0].axhline(value, color="grey", ls=style, lw=1, label=label)
    axes[0].set_ylabel("trained steps/J", fontsize=8)
    axes[0].legend(fontsize=7)
    axes[-1].set_xlabel("seconds since the run started (start-up included)")
    fig.suptitle(f"{key[1]}, policy {key[2]}: model-guided tuner vs TPE", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
