"""How ``autotune status`` draws a job's status document (``autotune.control.status``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


SHORT = {
    "actors": "act",
    "envs_per_actor": "envs",
    "rollout_len": "roll",
    "batch_size": "batch",
    "chunk_bytes": "chunk",
    "trainers": "gmis",
    "mps_pct": "mps%",
    "trainer_device": "dev",
    "inference": "inf",
    "trainer_threads": "thr",
    "trainer_precision": "prec",
    "actor_nice": "nice",
}
"""Column headers of the trial table (``autotune status`` prints what they stand for)."""


def _knob(name: str, value: Any) -> str:
    if name == "chunk_bytes" and isinstance(value, int):
        return f"{value // 1024}K" if value < 1 << 20 else f"{value >> 20}M"
    return _fmt(value)


def _values(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(values.items()))


def render(console: Any, job: dict[str, Any], history: int = 20) -> None:
    """Draws one job's (or stored study's) status: header, knobs, best, last ``history``
    trials."""
    head = f"[bold]study {job['study']}[/bold] in {job['storage']}"
    if job.get("job"):
        trial = f" (trial {job['trial']})" if job.get("trial") is not None else ""
        head += (
            f"\njob {job['job']} (pid {job['pid']}, {job['env']}), objective "
            f"{job['objective']}, phase {job['phase']}{trial}"
        )
        head += f"\ncurrent config: {_values(job['config'])}"
        live = job.get("live")
        if live:
            head += (
                f"\nnow (last {live['span_s']:.0f} s): {_fmt(live['steps_per_s'])} "
                f"steps/s, {_fmt(live['steps_per_joule'])} steps/J; GPU "
                f"{live['gpu_w']:.0f} W, CPU {live['cpu_w']:.0f} W "
                f"({live['cpu_source']})"
            )
    console.print(head)
    if job.get("knobs"):
        tuned = set(job.get("tuned", []))
        fixed, absent = [], []
        for name, k in job["knobs"].items():
            if k["unavailable"]:
                absent.append(f"{name} ({k['unavailable']})")
            elif name not in tuned:
                why = "needs a new run" if k["apply"] == "restart" else "fixed"
                fixed.append(f"{name} ({why})")
        console.print(f"tuned: {', '.join(sorted(tuned)) or 'none'}")
        if fixed:
            console.print(f"not tuned: {', '.join(fixed)}")
        if absent:
            console.print(f"not on this machine: {', '.join(absent)}")
    if job.get("unmet"):
        console.print(f"[red]{job['unmet']}[/red]")
    best = job.get("best")
    console.print(
        "best so far: "
        + (
            f"{_values(best['values'])} -> {_fmt(best['objective'])} "
            f"(median of {best['measurements']})"
            if best
            else "none yet"
        )
    )
    rows = job.get("trials", [])
    knobs = sorted({k for r in rows for k in r["values"]})
    table = Table(title=f"trials ({len(rows)}; last {min(history, len(rows))})")
    for col in (
        "#",
        "state",
        *(SHORT.get(k, k) for k in knobs),
        "steps/s",
        "steps/J",
        "objective",
        "note",
    ):
        table.add_column(col, overflow="fold")
    for r in rows[-history:]:
        table.add_row(
            str(r["number"]),
            r["state"][:8].lower(),
            *(_knob(k, r["values"].get(k)) for k in knobs),
            _fmt(r["steps_per_s"]),
            _fmt(r["steps_per_joule"]),
            _fmt(r["objective"]),
            r["note"],
        )
    console.print(table)
    if knobs:
        console.print("columns: " + ", ".join(f"{SHORT.get(k, k)}={k}" for k in knobs))
