"""Where a run's threads spend a window: per thread, CPU seconds, seconds runnable but waiting
for a core, context switches and migrations between cores (the kernel's ``schedstat``,
``status`` and ``sched`` files under ``/proc``), summed by process role and thread kind.

An actor's CPU per env step can be higher in a training run than in the raw-stepping loop with
the same backend (Humanoid-v5 on EnvPool: about 600 us against 450 us on a 16-core host), while
gymnasium's is not. This tells which thread takes the extra: an EnvPool actor is a Python
thread that hands each step to EnvPool's worker thread and waits for it, so a step costs two
hand-overs; a thread that waits for a core while runnable, or moves from core to core, shows
here.

    python -m bench.thread_sched --window-s 20 --json out/train.json -- \\
        autotune train --env Humanoid-v5 --env-backend envpool --max-wall-s 80
    python -m bench.thread_sched --window-s 20 --json out/raw.json -- \\
        python -m bench.raw_env_rate --env Humanoid-v5 --backend envpool --processes 16 \\
        --envs-per-process 32 --seconds 50

The command is started with ``--progress FILE`` added (both ``autotune train`` and
``bench.raw_env_rate`` write one), the window opens ``--warmup-s`` after its first counted step,
and the figures are divided by the steps counted inside it. Roles come from the process
titles (``autotune: actor 3`` is ``actor``; the command's own process is ``command``); a thread
is ``main`` (the process's first), ``zmq`` (ZeroMQ's I/O threads) or ``other`` (EnvPool's
workers, torch's and numpy's pools).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

from autotune.workflows.progress_log import read_progress

FIELDS = ("cpu_s", "wait_s", "slices", "voluntary", "involuntary", "migrations")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the thread or process ended between the listing and the read
        return None


def thread_stats(pid: int, tid: int) -> dict[str, float] | None:
    """One thread's counters since it started, or None where it is gone."""
    base = f"/proc/{pid}/task/{tid}"
    sched, status = _read(f"{base}/schedstat"), _read(f"{base}/status")
    if sched is None or status is None:
        return None
    run_ns, wait_ns, slices = (int(x) for x in sched.split()[:3])
    switches = dict(re.findall(r"^(\w+)_ctxt_switches:\s+(\d+)", status, re.M))
    detail = _read(f"{base}/sched") or ""  # kernels built without scheduler debug lack it
    moved = re.search(r"se\.nr_migrations\s*:\s*(\d+)", detail)
    return {
        "cpu_s": run_ns / 1e9,
        "wait_s": wait_ns / 1e9,
        "slices": float(slices),
        "voluntary": float(switches.get("voluntary", 0)),
        "involuntary": float(switches.get("nonvoluntary", 0)),
        "migrations": float(moved.group(1)) if moved else float("nan"),
    }


def role_of(proc: psutil.Process) -> str:
    """``actor`` for ``autotune: actor 3`` (``trainer`` for ``autotune: trainer 0.g0``); a
    multiprocessing child is ``worker`` (its resource tracker ``tracker``), anything else
    ``main``."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "gone"
    title = " ".join(cmd)
    if title.startswith("autotune: "):
        return title[len("autotune: ") :].split()[0]
    if "resource_tracker" in title:
        return "tracker"
    if "multiprocessing" in title:
        return "worker"
    return "main"


def kind_of(pid: int, tid: int) -> str:
    if tid == pid:
        return "main"
    comm = (_read(f"/proc/{pid}/task/{tid}/comm") or "").strip()
    return "zmq" if comm.startswith("ZMQbg") else "other"


def snapshot(root: int) -> dict[tuple[int, int], tuple[str, str, dict[str, float]]]:
    """Every thread of ``root`` and its descendants: (pid, tid) -> (role, kind, counters)."""
    out = {}
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return out
    for proc in procs:
        role = "command" if proc.pid == root else role_of(proc)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        except OSError:
            continue
        for tid in tids:
            stats = thread_stats(proc.pid, tid)
            if stats is not None:
                out[(proc.pid, tid)] = (role, kind_of(proc.pid, tid), stats)
    return out


def window_split(before: dict, after: dict, seconds: float, steps: int) -> dict[str, Any]:
    """Each role and thread kind's counters over the window (threads alive at both ends), per
    wall second and per env step."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0.0))
    threads: dict[str, int] = defaultdict(int)
    for key, (role, kind, end) in after.items():
        if key not in before:
            continue
        start = before[key][2]
        group = f"{role}/{kind}"
        threads[group] += 1
        for field in FIELDS:
            sums[group][field] += end[field] - start[field]
    groups = {}
    for group in sorted(sums):
        s = sums[group]
        groups[group] = {
            "threads": threads[group],
            "cores": round(s["cpu_s"] / seconds, 3),
            "waiting_cores": round(s["wait_s"] / seconds, 3),
            **{f"{f}_per_s": round(s[f] / seconds, 1) for f in FIELDS[2:]},
            "cpu_us_per_step": round(1e6 * s["cpu_s"] / steps, 2) if steps else None,
            "wait_us_per_step": round(1e6 * s["wait_s"] / steps, 2) if steps else None,
            "switches_per_1k_steps": (
                round(1e3 * (s["voluntary"] + s["involuntary"]) / steps, 2) if steps else None
            ),
        }
    return groups


def steps_at(progress: Path) -> tuple[float, int] | None:
    """The last progress line's time and steps, or None before the first."""
    lines = read_progress(progress) if progress.exists() else []
    return (lines[-1]["t"], int(lines[-1]["steps"])) if lines else None


def measure(command: list[str], window_s: float, warmup_s: float, timeout_s: float) -> dict:
    """Runs ``command`` with ``--progress``, takes the window, stops it (SIGINT) and returns
    the split, the machine's busy share over the window and the steps/s counted."""
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.jsonl"
        # its own process group: Ctrl-C reaches every process of it, as in a terminal
        proc = subprocess.Popen([*command, "--progress", str(progress)], start_new_session=True)
        try:
            return _window(proc, progress, window_s, warmup_s, timeout_s)
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C to the command's process group, then SIGKILL to what is left after a minute."""
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers too, the leader gone or not
    proc.wait()


def _window(proc, progress: Path, window_s: float, warmup_s: float, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while (first := steps_at(progress)) is None or first[1] <= 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the command counted no step (exit {proc.poll()})")
        time.sleep(0.2)
    time.sleep(warmup_s)
    busy0, t0, snap0 = psutil.cpu_times(), time.monotonic(), snapshot(proc.pid)
    mark0 = steps_at(progress)
    time.sleep(window_s)
    snap1, t1, busy1 = snapshot(proc.pid), time.monotonic(), psutil.cpu_times()
    mark1 = steps_at(progress)
    if proc.poll() is not None:
        raise SystemExit("the command ended inside the window: give it longer to run")
    steps = mark1[1] - mark0[1]
    idle = (busy1.idle + busy1.iowait) - (busy0.idle + busy0.iowait)
    total = sum(busy1) - sum(busy0)
    return {
        "window_s": round(t1 - t0, 2),
        "steps": steps,
        "steps_per_s": round(steps / max(mark1[0] - mark0[0], 1e-9), 1),
        "machine_busy_cores": round(psutil.cpu_count() * (1 - idle / total), 2) if total else None,
        "groups": window_split(snap0, snap1, t1 - t0, steps),
    }


def table(doc: dict) -> str:
    rows = [
        "| group | threads | cores | waiting cores | CPU us/step | wait us/step "
        "| switches /1k steps | migrations/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group, g in doc["groups"].items():
        rows.append(
            f"| {group} | {g['threads']} | {g['cores']} | {g['waiting_cores']} | "
            f"{g['cpu_us_per_step']} | {g['wait_us_per_step']} | {g['switches_per_1k_steps']} | "
            f"{g['migrations_per_s']} |"
        )
    head = (
        f"{doc['steps_per_s']:,.0f} steps/s over {doc['window_s']} s; machine busy "
        f"{doc['machine_busy_cores']} cores"
    )
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="per-thread CPU, waits for a core and switches of a command's processes "
        "over a window (the command after --)",
    )
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=5.0, help="after the first counted step")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="for the first counted step")
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("give the command to measure after --")
    if a.window_s <= 0 or a.warmup_s < 0:
        ap.error(f"--window-s {a.window_s} and --warmup-s {a.warmup_s}: need > 0 and >= 0")
    doc = {"command": command, **measure(command, a.window_s, a.warmup_s, a.timeout_s)}
    print(table(doc))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
