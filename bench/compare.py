"""One arm of ``python -m bench peers``: its process run to its budget and its figures taken.

Each arm writes a progress curve (``autotune/workflows/progress_log.py``). Its figures are taken
over a window of that curve: from ``--warmup-s`` after its first trained step to its last line
(the ``tuned`` arm: the final third of its trained span, after the tuner has had its time). The
window's trained steps divided by its seconds and by the machine's joules in it (``MachineMeter``
samples) give steps/s, GPU W, CPU W and steps/J, charged the same way for every arm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from autotune.workflows.progress_log import latest_steps, read_progress
from bench.compare_arms import MIN_STEPS_WALL_FACTOR, PEERS, UNTRAINED, arm_command, arm_kind
from bench.machine_meter import MachineMeter
from bench.report import write_json
from runtime.results import timeline_rate

START_ALLOWANCE_S = 180.0
"""How long past its budget an arm may run (start-up, drain) before it is stopped."""


def cache_env(cache: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (the environment) with the tool's caches in ``cache``, the probes and the
    compiled kernels alike: a ``TORCHINDUCTOR_CACHE_DIR`` or ``TRITON_CACHE_DIR`` of the
    caller's is dropped (Triton's kernels go to the latter before the former), so a run given an
    empty folder compiles afresh too."""
    env = {**(os.environ if base is None else base), "AUTOTUNE_CACHE_DIR": str(cache)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("TRITON_CACHE_DIR", None)
    return env


def window(rows: list[dict[str, Any]], warmup_s: float, final_third: bool) -> tuple[dict, dict]:
    """The first and last progress lines of the measured span (see the module docstring)."""
    started = [r for r in rows if r["steps"] > 0]
    if len(started) < 2:
        raise ValueError("fewer than two progress lines after the first trained step")
    t0 = started[0]["t"] + warmup_s
    if final_third:
        t0 = max(t0, started[-1]["t"] - (started[-1]["t"] - started[0]["t"]) / 3)
    inside = [r for r in started if r["t"] >= t0]
    if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
        raise ValueError(
            f"fewer than two progress lines {warmup_s} s after the first trained "
            "step: run the arm longer (--seconds) or warm up less (--warmup-s)"
        )
    return inside[0], inside[-1]


def window_throttle(
    res: dict[str, Any], rows: list[dict[str, Any]], a: argparse.Namespace, tuned: bool
) -> float | None:
    """The share of the actors' time in the arm's window spent waiting on their in-flight
    budget (the result's timeline between the window's progress lines; the whole run's
    ``actor_waits`` also count the waits while the trainer starts). None where the timeline
    has no such column or the window holds fewer than two of its samples."""
    first, last = window(rows, a.warmup_s, tuned)
    start = (res.get("timeline") or {}).get("started_unix")
    actors = (res.get("config") or {}).get("actors")
    if not start or not actors:
        return None
    span = timeline_rate(res, first["t"] - start, last["t"] - start)
    if span is None or "actor_throttle_s" not in span:
        return None
    return span["actor_throttle_s"] / (actors * (span["to_s"] - span["from_s"]))


CURVE_S = 10.0
"""Bin width of an arm's steps/J curve (its plots and the time it takes to reach a level)."""


def _spj(steps: float, joules: float) -> float | None:
    return steps / joules if joules > 0 else None


def measure(
    rows: list[dict[str, Any]],
    meter: MachineMeter,
    warmup_s: float,
    final_third: bool = False,
    started: float | None = None,
) -> dict[str, Any]:
    """Trained steps/s, GPU W, CPU W and steps/J of one arm's window; with ``started`` (the
    arm's Unix start time), the whole run's figures too (start-up included, to its last
    progress line) and its steps/J curve in ``CURVE_S`` bins. Steps/J is given under both CPU
    models: with the packages' idle draw (``steps_per_joule``) and busy cores only."""
    a, b = window(rows, warmup_s, final_third)
    (ga, ca, ia), (gb, cb, ib) = meter.parts_at(a["t"]), meter.parts_at(b["t"])
    span, steps = b["t"] - a["t"], b["steps"] - a["steps"]
    joules = (gb - ga) + (cb - ca)
    busy_only = meter.has_idle_part  # none under RAPL
    doc: dict[str, Any] = {
        "window_s": span,
        "window_steps": steps,
        "episode_len": _episode_len(a, b),
        "steps_per_s": steps / span,
        "gpu_w": (gb - ga) / span,
        "cpu_w": (cb - ca) / span,
        "steps_per_joule": _spj(steps, joules),
        "steps_per_joule_busy_only": _spj(steps, joules - (ib - ia)) if busy_only else None,
        "final_return": rows[-1].get("return"),
        "final_steps": rows[-1]["steps"],
    }
    if started is not None:
        end = rows[-1]
        g0, c0, i0 = meter.parts_at(max(started, meter.samples[0][0]))
        g1, c1, i1 = meter.parts_at(end["t"])
        whole = (g1 - g0) + (c1 - c0)
        doc["whole_run"] = {
            "wall_s": end["t"] - started,
            "steps": end["steps"],
            "steps_per_s": end["steps"] / (end["t"] - started),
            "steps_per_joule": _spj(end["steps"], whole),
            "steps_per_joule_busy_only": _spj(end["steps"], whole - (i1 - i0))
            if busy_only
            else None,
        }
        doc["curve"] = curve(rows, meter, started)
    return doc


def _episode_len(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """Steps per finished episode between two progress lines (None where a peer does not count
    its episodes or none ended)."""
    if a.get("episodes") is None or b.get("episodes") is None or b["episodes"] <= a["episodes"]:
        return None
    return (b["steps"] - a["steps"]) / (b["episodes"] - a["episodes"])


def loop_figures(loop: dict[str, Any], meter: MachineMeter) -> dict[str, Any]:
    """A ``bench.actor_loop_rate`` loop's result with the machine's watts and steps/J over its
    measured span (from the meter's samples; the loop alone on the machine)."""
    t0, t1 = loop["started_unix"], loop["ended_unix"]
    (g0, c0, _), (g1, c1, _) = meter.parts_at(t0), meter.parts_at(t1)
    gpu_w, cpu_w = (g1 - g0) / (t1 - t0), (c1 - c0) / (t1 - t0)
    spj = _spj(loop["steps_per_s"], gpu_w + cpu_w)  # steps/s over watts
    return {**loop, "gpu_w": gpu_w, "cpu_w": cpu_w, "steps_per_joule": spj}


def curve(rows: list[dict[str, Any]], meter: MachineMeter, started: float) -> list[dict]:
    """Steps/s and steps/J in ``CURVE_S`` bins from the arm's start (``t``: the bin's end, in
    seconds since the start), interpolated on the progress lines."""
    import numpy as np

    ts = np.array([r["t"] for r in rows])
    steps = np.array([r["steps"] for r in rows], float)
    out = []
    edge = started + CURVE_S
    while edge <= ts[-1]:
        lo = edge - CURVE_S
        s0 = float(np.interp(lo, ts, steps, left=0.0))
        s1 = float(np.interp(edge, ts, steps))
        try:
            (g0, c0), (g1, c1) = meter.at(lo), meter.at(edge)
        except ValueError:
            edge += CURVE_S
            continue
        out.append(
            {
                "t": edge - started,
                "steps_per_s": (s1 - s0) / CURVE_S,
                "steps_per_joule": _spj(s1 - s0, (g1 - g0) + (c1 - c0)),
            }
        )
        edge += CURVE_S
    return out


def _measurable(progress: Path, min_steps: int, warmup_s: float) -> bool:
    """Whether an arm has trained ``min_steps`` and its progress file holds a window."""
    if latest_steps(progress) < min_steps:
        return False
    try:
        window(read_progress(progress), warmup_s, False)
    except (OSError, ValueError):
        return False
    return True


def _run_until(proc: subprocess.Popen, wall: float, done: Any, budget: float) -> None:
    """Once ``wall`` seconds have passed and ``done()`` holds, Ctrl-C drains ``proc`` (checked
    twice a second); ``budget`` bounds the wait."""
    start = time.monotonic()
    while proc.poll() is None and time.monotonic() - start < budget:
        time.sleep(0.5)
        if time.monotonic() - start >= wall and done():
            os.killpg(proc.pid, signal.SIGINT)
            return


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stops a run started with ``start_new_session=True`` and everything under it (actors,
    stages, trainers): SIGINT to its process group, so that it drains and writes its result,
    then SIGKILL after ``grace_s``."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_arm(arm: str, a: argparse.Namespace, meter: MachineMeter, out_dir: Path) -> dict:
    stem = f"{a.env}-{arm}"
    progress, result = out_dir / f"{stem}.progress.jsonl", out_dir / f"{stem}.result.json"
    cmd = arm_command(arm, a, progress, result)
    if arm in UNTRAINED:
        cmd += ["--json", str(result)]
    if "--checkpoint" in cmd:  # a run goes on from a state left there: this arm starts afresh
        shutil.rmtree(cmd[cmd.index("--checkpoint") + 1], ignore_errors=True)
    tuned = arm_kind(arm) == "tuned"
    budget = (a.tuned_s if tuned else a.seconds) + START_ALLOWANCE_S
    print(f"[{arm}] {' '.join(cmd)}", flush=True)
    doc: dict[str, Any] = {
        "arm": arm,
        "env": a.env,
        "policy": a.policy,
        "command": cmd,
        "started_unix": time.time(),
        **meter.sources,
    }
    log = (out_dir / f"{stem}.log").open("w")
    # each arm probes its workload afresh: its start-up is a first run's
    env = cache_env(out_dir / f"cache-{stem}")
    min_steps = getattr(a, "min_steps", 0) if arm_kind(arm) in ("default", "exported") else 0
    if min_steps:  # its own wall limit becomes a safety net; this process ends it
        at = cmd.index("--max-wall-s") + 1
        wall = float(cmd[at])
        cmd[at] = str(wall * MIN_STEPS_WALL_FACTOR)
        budget += wall * (MIN_STEPS_WALL_FACTOR - 1)
    elif arm in PEERS:  # the peer runs on past --seconds itself, until its window is measurable
        budget += a.seconds * (MIN_STEPS_WALL_FACTOR - 1)
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    try:
        if min_steps:  # and until its window can be measured: a lump of steps is not a window
            _run_until(proc, wall, lambda: _measurable(progress, min_steps, a.warmup_s), budget)
        doc["returncode"] = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        doc["returncode"] = proc.returncode
        doc["note"] = f"stopped after {budget:.0f} s"
    log.close()
    meter.sample()  # so the arm's last progress line lies inside the sampled span
    doc["wall_s"] = time.time() - doc["started_unix"]
    if arm in UNTRAINED:
        if not result.exists():
            doc["error"] = f"no result (log: {stem}.log)"
        elif arm == "learner":
            doc["learner"] = json.loads(result.read_text())
        else:  # each loop with the machine's draw while it ran
            loops = json.loads(result.read_text())["results"]
            doc["loops"] = {r["loop"]: loop_figures(r, meter) for r in loops}
    else:
        try:
            rows = read_progress(progress)
            doc.update(measure(rows, meter, a.warmup_s, tuned, doc["started_unix"]))
            if arm == "default":  # its policy's states at the end: what a states arm steps
                tail = measure(rows, meter, a.warmup_s, True)
                doc["final_third"] = {k: tail[k] for k in ("steps_per_s", "episode_len")}
        except (OSError, ValueError) as exc:
            doc["error"] = f"{exc} (log: {stem}.log)"
    if result.exists() and arm not in UNTRAINED:
        res = json.loads(result.read_text())
        doc["lost_steps"] = res.get("lost_steps")
        doc["config"] = {
            k: res["config"][k]
            for k in (
                "actors",
                "envs_per_actor",
                "batch_size",
                "trainers",
                "mps_pct",
                "trainer_device",
            )
        }
        if "sizing" in res:
            doc["sizing"] = {k: res["sizing"][k] for k in ("chosen", "predicted")}
        for key in ("actor_time", "cpu_time"):  # where the actors' time, the CPU went
            if res.get(key):
                doc[key] = res[key]
        if "window_s" in doc:
            doc["window_throttle"] = window_throttle(res, read_progress(progress), a, tuned)
        if "tuning" in res:
            doc["tuning"] = {
                k: res["tuning"].get(k) for k in ("sampler", "best", "trials", "windows")
            }
    write_json(out_dir / f"{stem}.json", doc)
    shown = {
        k: round(v, 2) if isinstance(v, float) else v
        for k, v in doc.items()
        if k in ("steps_per_s", "gpu_w", "cpu_w", "steps_per_joule", "returncode", "error")
    }
    print(f"[{arm}] {shown}", flush=True)
    return doc
