"""How ``autotune status`` draws a job's status document (``autotune.control.status``)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
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


def render_machine(console: Any, status: dict[str, Any]) -> None:
    """The machine the daemon shares out: its cores, GPUs, meters and what foreign processes
    take."""
    m = status.get("machine")
    if not m:
        return
    gpus = ", ".join(
        f"GPU {g['index']} {g['name']} ({g['sms']} SMs, MPS {'yes' if g['mps'] else 'no'})"
        for g in m["gpus"]
    )
    foreign = status.get("foreign") or {}
    line = (
        f"machine: cores {_cores(m['cores'])} to hand out (reserved {_cores(m['reserved'])}); "
        f"{gpus or 'no GPU'}; meters {m['meters'].get('gpu', '-')} (GPU), "
        f"{m['meters'].get('cpu', '-')} (CPU)"
    )
    if foreign.get("cores") or foreign.get("gpus"):
        line += f"; busy with other processes: {foreign['cores']} cores, GPUs {foreign['gpus']}"
    for offer in status.get("offers") or []:
        a = offer["allocation"]
        gpu = f", GPU {a['gpu']} at {a['mps_pct']} %" if a.get("gpu") is not None else ""
        line += (
            f"\nprocess {offer['pid']} sizing itself (probing) on cores {_cores(a['cores'])}"
            f"{gpu}, offered {offer['for_s']:.0f} s ago; not registered yet"
        )
    predicted = status.get("steps_per_joule_predicted")
    if predicted:
        line += (
            f"\nshare-out predicted {_fmt(predicted)} steps/J (equal split "
            f"{_fmt(status.get('equal_split_steps_per_joule'))})"
        )
    console.print(line)


def _cores(cores: list[int]) -> str:
    from autotune.control.cores import format_cores

    return format_cores(cores)


def render(console: Any, job: dict[str, Any], history: int = 20) -> None:
    """Draws one job's (or stored study's) status: header, knobs, best, last ``history``
    trials."""
    e = lambda v: escape(str(v))  # noqa: E731 (names from users and jobs are not markup)
    head = f"[bold]study {e(job['study'])}[/bold] in {e(job['storage'])}"
    if job.get("job"):
        trial = f" (trial {job['trial']})" if job.get("trial") is not None else ""
        head += (
            f"\njob {e(job['job'])} (pid {job['pid']}, {e(job['env'])}), objective "
            f"{e(job['objective'])}, phase {e(job['phase'])}{trial}"
        )
        head += f"\ncurrent config: {e(_values(job['config']))}"
    alloc = job.get("allocation")
    if alloc:
        share = "" if alloc["mps_pct"] is None else f", {alloc['mps_pct']} % of GPU {alloc['gpu']}"
        taken = "" if job.get("allocation_taken", True) else " (not taken yet)"
        if job.get("starting"):
            taken += "; starting: the running jobs keep their cores until it has trained"
        head += f"\nbudget: cores {_cores(alloc['cores'])}{share}{taken}"
    live = job.get("live")
    if live:
        trial = f", trial {live['trial']}" if live.get("trial") is not None else ""
        head += (
            f"\nnow (last {live['span_s']:.0f} s{trial}): {_fmt(live['steps_per_s'])} "
            f"steps/s, {_fmt(live['steps_per_joule'])} steps/J; GPU "
            f"{live['gpu_w']:.0f} W, CPU {live['cpu_w']:.0f} W "
            f"({live['cpu_source']})"
        )
    if job.get("noise_scale") is not None:
        when = "" if job.get("job") else " (at the latest trial)"
        head += f"\ngradient noise scale{when}: {job['noise_scale']:,.0f} samples"
    console.print(head)
    if job.get("nodes"):
        console.print(node_table(job["nodes"]))
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
        console.print(f"[red]{escape(str(job['unmet']))}[/red]")
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
    console.print(
        trial_table(rows[-history:] if history > 0 else [], knobs, len(rows), console.width)
    )
    if knobs:
        console.print("columns: " + ", ".join(f"{SHORT.get(k, k)}={k}" for k in knobs))


def trial_table(rows: list[dict[str, Any]], knobs: list[str], total: int, width: int) -> Table:
    """The trials, a column per knob where that fits ``width``, else the knobs as one column
    of ``name=value`` words that wraps between them. No number is ever split."""
    table = Table(title=f"trials ({total}; last {len(rows)})")
    first = [[str(r["number"]), r["state"][:8].lower()] for r in rows]
    per_knob = [[_knob(k, r["values"].get(k)) for k in knobs] for r in rows]
    last = [
        [_fmt(r["steps_per_s"]), _fmt(r["steps_per_joule"]), _fmt(r["objective"])] for r in rows
    ]
    knob_heads = [SHORT.get(k, k) for k in knobs]
    wide = [*zip(["#", "state", *knob_heads, "steps/s", "steps/J", "objective"], strict=True)]
    cells = [f + k + t for f, k, t in zip(first, per_knob, last, strict=True)]
    widths = [max([len(h[0]), *(len(c[i]) for c in cells)]) for i, h in enumerate(wide)]
    if sum(widths) + 3 * (len(widths) + 1) + 12 > width:  # the note needs room too: one column
        widths = [*widths[:2], 0, *widths[-3:]]
        cells = [
            [*f, " ".join(f"{h}={v}" for h, v in zip(knob_heads, k, strict=True)), *t]
            for f, k, t in zip(first, per_knob, last, strict=True)
        ]
        heads = ["#", "state", "config", "steps/s", "steps/J", "objective"]
    else:
        heads = [h[0] for h in wide]
    for head, w in zip(heads, widths, strict=True):
        if head == "config":
            table.add_column(head, ratio=2)  # wraps between its words
        else:
            table.add_column(head, no_wrap=True, min_width=w)
    table.add_column("note", overflow="fold", ratio=1)
    for c, r in zip(cells, rows, strict=True):
        table.add_row(*c, " ".join(filter(None, (r["note"], _returns(r)))))
    return table


def _returns(row: dict[str, Any]) -> str:
    """The mean return before a trial's change and at its window's end, where both are known."""
    before, after = row.get("return_before"), row.get("return_after")
    return "" if before is None or after is None else f"return {_fmt(before)} -> {_fmt(after)}"


def node_table(nodes: list[dict[str, Any]]) -> Table:
    """A cluster run's nodes: address, CPUs offered, the run's actors there, the steps they
    sampled, lost or not."""
    table = Table(title="cluster nodes", title_justify="left")
    numbers = ("CPUs", "actors", "steps")
    for head in ("node", "address", *numbers, "state"):
        table.add_column(head, justify="right" if head in numbers else "left")
    for n in nodes:
        state = "[red]lost[/red]" if n["lost"] else "up"
        row = (str(n["cpus"]), str(n["actors"]), f"{n['stepped']:,}")
        table.add_row(n["node"], escape(n["ip"]), *row, state)
    return table
