"""Runs ``autotune train`` arguments and prints the trainers' and migrator's counters each second.

    python -m bench end-to-end --trace \\
        --train-args "--env Ant-v5 --actors 15 --trainers 2 --max-wall-s 25"

For a run that is slower than expected or seems stuck: one line per second with trained and
sampled steps, each GMI's queued steps and version, and the migrator's pending messages and
per-trainer credits. ``--dump-at S`` also sends SIGUSR1 to every service (compressor, migrator,
trainer GMIs) at S seconds, which
prints their Python stacks to stderr. ``--cpu`` adds, each second, the share of a core each
process used (the runner, every service and GMI, the actors' mean, min and max) and the whole
machine's busy share; the run's means after ``--cpu-warmup-s`` close the trace. An actor well
under 100 % waits on the pipeline or the trainer; a service near 100 % is a bottleneck.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import psutil

from autotune.cli.main import parse_args
from autotune.cli.train_config import train_config
from runtime.runner import Runner, RunState


class CpuSplit:
    """Each process's CPU seconds per wall second between two calls of ``sample``."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.t = time.monotonic()
        self.sums: dict[str, float] = {}
        self.samples = 0
        psutil.cpu_percent()  # starts the machine-wide counter

    @staticmethod
    def _cpu_s(pid: int) -> float | None:
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        return t.user + t.system

    def sample(self, procs: dict[str, int], actors: list[int], keep: bool) -> str:
        """One line of per-process core shares (%); ``keep`` adds them to the run's means."""
        now = time.monotonic()
        dt, self.t = max(now - self.t, 1e-6), now
        share: dict[str, float] = {}
        actor_share: list[float] = []
        for name, pid in [*procs.items(), *((f"actor{i}", p) for i, p in enumerate(actors))]:
            cpu = self._cpu_s(pid)
            if cpu is None:
                continue
            before, self.last[pid] = self.last.get(pid), cpu
            if before is None:
                continue
            pct = 100.0 * (cpu - before) / dt
            if name.startswith("actor"):
                actor_share.append(pct)
            else:
                share[name] = pct
        if actor_share:
            share["actors mean"] = sum(actor_share) / len(actor_share)
            share["actors min"], share["actors max"] = min(actor_share), max(actor_share)
            share["actors sum"] = sum(actor_share)
        share["machine busy"] = psutil.cpu_percent()
        if keep:
            self.samples += 1
            for k, v in share.items():
                self.sums[k] = self.sums.get(k, 0.0) + v
        return " ".join(f"{k} {v:.0f}%" for k, v in share.items())

    def means(self) -> str:
        n = max(self.samples, 1)
        return " ".join(f"{k} {v / n:.0f}%" for k, v in self.sums.items())


def trace(
    train_argv: list[str], dump_at: float | None, cpu: bool, cpu_warmup_s: float
) -> dict[str, Any]:
    """Runs ``autotune train`` with ``train_argv``, tracing it on stderr; returns its figures."""
    args = parse_args(["train", *[x for x in train_argv if x != "--"]])
    cfg = train_config(args)  # --config files too, with the flags given over them
    runner = Runner(cfg, cfg.validate(), mps_changes=args.mps_change)
    marks = {"next": 1.0, "dumped": False}
    split = CpuSplit() if cpu else None

    def show(state: RunState) -> None:
        if dump_at is not None and not marks["dumped"] and state.elapsed_s >= dump_at:
            marks["dumped"] = True
            for proc in runner.services.values():
                if proc.pid:
                    os.kill(proc.pid, signal.SIGUSR1)
        if state.elapsed_s < marks["next"]:
            return
        marks["next"] += 1.0
        tel = runner.telemetry
        gmis = {
            n: (tel.source(n).get("queued_steps"), tel.source(n).get("version"))
            for n in tel.trainer_sources()
        }
        mig = tel.source("migrator")
        credits = {k: v.get("credits") for k, v in (mig.get("trainers") or {}).items()}
        print(
            f"{state.elapsed_s:5.1f}s trained {state.trained_steps:>9,} sampled "
            f"{state.sampled_steps:>9,} gmis {gmis} pending {mig.get('pending')} "
            f"credits {credits}",
            file=sys.stderr,
            flush=True,
        )
        if split is not None:
            procs = {
                "runner": os.getpid(),
                **{n: p.pid for n, p in runner.services.items() if p.pid},
            }
            actors = [s.process.pid for s in runner.slots if s.process.pid]
            line = split.sample(procs, actors, keep=state.elapsed_s >= cpu_warmup_s)
            print(f"{state.elapsed_s:5.1f}s cpu {line}", file=sys.stderr, flush=True)

    runner.on_progress = show
    result = runner.run()
    doc = {
        k: result[k]
        for k in (
            "env_steps",
            "sampled_steps",
            "lost_steps",
            "steps_per_s",
            "gmi_sharing",
            "weights_identical",
        )
    }
    print(doc)
    if split is not None:
        print(f"cpu means after {cpu_warmup_s:g} s: {split.means()}")
        doc["cpu_means"] = split.means()
    return doc
