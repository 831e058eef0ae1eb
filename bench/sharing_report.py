"""The table and the plot of ``python -m bench sharing`` (``bench/suites/sharing.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import ratio


def _f(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def limits_beside(
    results: dict[str, Any], ways: list[str], key: str = "steps_per_joule"
) -> dict[str, list[float]]:
    """Each way's limits' ``key`` (steps/J, or steps/s): the one measured just before it and
    the next one after (the next way's, else the closing one)."""
    names = [f"limit:{w}" for w in ways] + ["limit-end"]
    out = {}
    for i, way in enumerate(ways):
        pair = [(results.get(n) or {}).get(key) for n in names[i : i + 2]]
        out[way] = [v for v in pair if v]
    return out


def of_limit(results: dict[str, Any], ways: list[str]) -> dict[str, float]:
    """Each way's steps/J over the mean of the limits beside it."""
    out = {}
    for way, pair in limits_beside(results, ways).items():
        spj = (results.get(way) or {}).get("steps_per_joule")
        if spj and pair:
            out[way] = spj / (sum(pair) / len(pair))
    return out


def trained_s(way: dict[str, Any]) -> float:
    """Seconds of a way's span in which at least one job trained: the union over its jobs of
    the time from each one's first trained batch to its last progress line."""
    spans = sorted(
        (j["started_s"] + j["first_trained_s"], j["progress"][-1]["t"])
        for j in way.get("jobs", {}).values()
        if j.get("first_trained_s") is not None and j.get("progress")
    )
    total, end = 0.0, float("-inf")
    for a, b in spans:
        a = max(a, end)
        if b > a:
            total, end = total + b - a, b
    return total


def ceilings(results: dict[str, Any], ways: list[str]) -> dict[str, float]:
    """Each way's steps/J had its machine trained at the raw-stepping rate of the limits beside
    it whenever a job trained, on the joules it drew: the most its start-ups (probes, first
    compile, a job's wait for its first batch) leave it. The limit steps the first job's
    workload with random actions, so where a later job's env costs more per step the real
    ceiling is lower still."""
    out = {}
    for way, rates in limits_beside(results, ways, "steps_per_s").items():
        r = results.get(way) or {}
        joules = (r.get("gpu_j") or 0.0) + (r.get("cpu_j") or 0.0)
        if rates and joules > 0 and r.get("jobs"):
            out[way] = sum(rates) / len(rates) * trained_s(r) / joules
    return out


def table(results: dict[str, Any], goals: dict[str, float], ways: list[str]) -> str:
    """The ways side by side (machine figures, whole span), each also over the limits beside
    it, the limits, each job, and the goals (raw, and each way to its own limits)."""
    frac, top = of_limit(results, ways), ceilings(results, ways)
    lines = [
        "| way | jobs | span s | trained s | trained steps | steps/s | GPU J | CPU J | steps/J "
        "| busy-only | / limits beside | at the limit's rate | / that | lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for way in ways:
        r = results.get(way)
        if not r:
            continue
        lines.append(
            f"| {way} | {len(r['jobs'])} | {_f(r['seconds'], 0)} | {_f(trained_s(r), 0)} | "
            f"{r['steps']:,} | {_f(r['steps_per_s'], 0)} | {_f(r['gpu_j'], 0)} | "
            f"{_f(r['cpu_j'], 0)} | {_f(r['steps_per_joule'])} | "
            f"{_f(r['steps_per_joule_busy_only'])} | {_f(frac.get(way), 2)} | "
            f"{_f(top.get(way))} | {_f(ratio(r['steps_per_joule'], top.get(way)), 2)} | "
            f"{r['lost_steps']} |"
        )
    for name in [f"limit:{w}" for w in ways] + ["limit-end"]:
        r = results.get(name) or {}
        lines.append(
            f"| {name} (raw stepping) | | | | | {_f(r.get('steps_per_s'), 0)} | | | "
            f"{_f(r.get('steps_per_joule'))} | {_f(r.get('steps_per_joule_busy_only'))} "
            "| | | | |"
        )
    lines += [
        "",
        "| way | job | started s | probes s | first batch s | trained steps | steps/s "
        "| invariant | error |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for way in ways:
        for name, j in (results.get(way) or {}).get("jobs", {}).items():
            lines.append(
                f"| {way} | {name} ({j['env']}) | {_f(j['started_s'], 0)} | "
                f"{_f(j.get('probe_s'))} | {_f(j.get('first_trained_s'))} | {j['steps']:,} | "
                f"{_f(j['steps_per_s'], 0)} | {'holds' if j['invariant'] else 'BROKEN'} | "
                f"{j['error'] or ''} |"
            )
    lines.append("")
    spj = {w: (results.get(w) or {}).get("steps_per_joule") for w in goals_ways(goals)}
    for goal, threshold in goals.items():
        num, den = (w.strip() for w in goal.split("/"))
        if spj.get(num) and spj.get(den):
            value = spj[num] / spj[den]
            met = "met" if value >= threshold else "NOT met"
            own = (
                f"; each to the limits beside it {frac[num] / frac[den]:.2f}"
                if num in frac and den in frac
                else ""
            )
            reach = (
                f"; at most {top[num] / spj[den]:.2f} at this way's start-ups "
                f"({num} at the limit's rate whenever a job trained)"
                if num in top
                else ""
            )
            lines.append(f"- {goal} steps/J: {value:.2f} (goal >= {threshold}): {met}{own}{reach}")
        else:
            lines.append(f"- {goal} steps/J: not measured")
    lines.append(floor_line(results))
    return "\n".join(lines)


def floor_line(results: dict[str, Any], min_share: float = 0.8) -> str:
    """Each job's steps/s under the daemon over its steps/s started together with the others
    (the kernel's share-out, the measured stand-in for an equal split), against the default
    fairness floor."""
    daemon, together = ((results.get(w) or {}).get("jobs", {}) for w in ("daemon", "together"))
    ratios = {
        name: j["steps_per_s"] / together[name]["steps_per_s"]
        for name, j in daemon.items()
        if j.get("steps_per_s") and (together.get(name) or {}).get("steps_per_s")
    }
    if not ratios:
        return "- fairness floor (daemon / together steps/s per job): not measured"
    each = ", ".join(f"{n} {r:.2f}" for n, r in ratios.items())
    met = "met" if min(ratios.values()) >= min_share else "NOT met"
    return f"- fairness floor (daemon / together steps/s per job, >= {min_share}): {each}: {met}"


def goals_ways(goals: dict[str, float]) -> set[str]:
    return {w.strip() for g in goals for w in g.split("/")}


def _binned(progress: list[dict[str, Any]], bin_s: float = 10.0) -> tuple[list, list]:
    """Trained steps/s in ``bin_s`` bins of a job's progress lines (``t`` from the span's
    start)."""
    import numpy as np

    if len(progress) < 2:
        return [], []
    ts = np.array([r["t"] for r in progress])
    steps = np.array([r["steps"] for r in progress], float)
    edges = np.arange(ts[0], ts[-1] + 1e-9, bin_s)
    s = np.interp(edges, ts, steps)
    return list(edges[1:]), list(np.diff(s) / bin_s)


def plot_timeline(result: dict[str, Any], path: Path) -> Path:
    """Each job's cores (its budget, as the daemon reported it) and its trained steps/s (from
    its progress file) over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for job, doc in sorted(result["jobs"].items()):
        rows = [e for e in result["timeline"] if e["job"] == job]
        if rows:
            t = [e["t"] for e in rows]
            top.step(t, [len(e["cores"] or []) for e in rows], where="post", label=job)
        t, rate = _binned(doc["progress"])
        bottom.plot(t, rate, label=job)
    top.set_ylabel("cores in its budget")
    bottom.set_ylabel("trained steps/s")
    bottom.set_xlabel("seconds since the first job started")
    top.legend(loc="upper right", fontsize=8)
    top.set_title("jobs under the daemon: budgets and throughput")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
