"""``autotune status``: what is being tuned, how it runs now, the best so far and every trial.

The daemon builds the document (``Daemon.status``); with no daemon running, the same trial
history is read straight from a study's storage. ``render`` draws either with rich.
"""

from __future__ import annotations

from typing import Any

from autotune.tuning.counters import Counters


def live_rates(readings: list[Counters], span_s: float) -> dict[str, Any] | None:
    """Trained steps/s, GPU and CPU watts and steps per joule over the last ``span_s`` of a
    job's reports (None until two reports span some time)."""
    if len(readings) < 2:
        return None
    last = readings[-1]
    first = next((r for r in readings if last.t_s - r.t_s <= span_s), readings[0])
    dt = last.t_s - first.t_s
    if dt <= 0:
        return None
    steps = last.trained_steps - first.trained_steps
    gpu_j, cpu_j = last.gpu_j - first.gpu_j, last.cpu_j - first.cpu_j
    return {
        "span_s": dt,
        "steps_per_s": steps / dt,
        "gpu_w": gpu_j / dt,
        "cpu_w": cpu_j / dt,
        "steps_per_joule": steps / (gpu_j + cpu_j) if gpu_j + cpu_j > 0 else None,
        "cpu_source": last.cpu_source,
    }


def _note(t: Any) -> str:
    attrs = t.user_attrs
    if "error" in attrs:
        return f"refused: {attrs['error']}"
    if t.state.name == "FAIL":
        return attrs.get("skipped") or attrs.get("interrupted", "tuner restarted")
    if t.state.name == "PRUNED":
        return "pruned (past envs_per_actor saturation)"
    if attrs.get("feasible") is False:
        return "infeasible (constraint)"
    return ""


def study_summary(study: Any, best: dict[str, Any] | None = None) -> dict[str, Any]:
    """The best config (the tuner's median-based one if given, else the study's best trial)
    and one row per trial."""
    trials = study.get_trials(deepcopy=False)
    rows = [
        {
            "number": t.number,
            "state": t.state.name,
            "values": dict(t.params),
            "objective": t.value,
            "steps_per_s": t.user_attrs.get("steps_per_s"),
            "steps_per_joule": t.user_attrs.get("steps_per_joule"),
            "gpu_j": t.user_attrs.get("gpu_j"),
            "cpu_j": t.user_attrs.get("cpu_j"),
            "note": _note(t),
        }
        for t in trials
    ]
    if best is None:
        done = [r for r in rows if r["state"] == "COMPLETE" and "infeasible" not in r["note"]]
        if done:
            top = max(done, key=lambda r: r["objective"])
            best = {"values": top["values"], "objective": top["objective"], "measurements": 1}
    return {"best": best, "trials": rows}


def stored_status(storage: str, study_name: str) -> dict[str, Any]:
    """The status document of a study read from its storage (no daemon, no live figures).

    Raises:
        autotune.tuning.online_tuner.StudyError: if the storage cannot be opened or holds no such study.
    """
    import optuna

    from autotune.tuning.storage import StudyError, storage_url

    storage = storage_url(storage)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except Exception as exc:  # SQLAlchemy and Optuna raise many kinds; all mean "cannot read"
        raise StudyError(
            f"cannot read study {study_name!r} from {storage!r}: {type(exc).__name__}: {exc}"
        ) from None
    return {"job": None, "storage": storage, "study": study_name, **study_summary(study)}


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
    from rich.table import Table

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
