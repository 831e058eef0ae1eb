"""Where a run's time went: the actors' seconds (stepping, acting, waiting on the learner) and
every kind of process's CPU seconds, from the runner's telemetry."""

from __future__ import annotations

import os
import time
from typing import Any

from runtime.inference import NAME as INFERENCE


def actor_sums(tel: Any, keys: tuple[str, ...]) -> dict[str, float]:
    """Each of ``keys`` summed over the actors (every incarnation)."""
    sources = tel.actor_sources()
    return {
        key: round(sum(float(tel.source(a).get(key, 0.0) or 0.0) for a in sources), 3)
        for key in keys
    }


def actor_waits(tel: Any) -> dict[str, float]:
    """Seconds the actors (every incarnation, summed) spent not stepping: ``throttle_s``
    waiting for receipts with their in-flight budget full (the learner behind), ``dispatch_s``
    handing rollouts to the stages (blocked while those push back)."""
    return actor_sums(tel, ("throttle_s", "dispatch_s"))


def actor_time(tel: Any, stepped: int) -> dict[str, float | None]:
    """Where the actors' time went (every incarnation, summed): ``env_s`` stepping the envs
    (with the episode bookkeeping), ``policy_s`` getting actions (the forward on the actor's
    core, or the wait for the inference GMI), ``cpu_s`` the actor processes' CPU (every
    thread, an EnvPool's workers too), and ``cpu_us_per_step``: that per env step sampled
    (``stepped`` of them), what an actor-bound run's rate comes down to (compare the raw
    loop's, ``bench/actor_loop_rate.py``)."""
    out: dict[str, float | None] = {**actor_sums(tel, ("env_s", "policy_s", "cpu_s"))}
    out["cpu_us_per_step"] = round(1e6 * out["cpu_s"] / stepped, 1) if stepped else None
    return out


def cpu_time(runner: Any, wall_s: float) -> dict[str, float | int]:
    """Where the run's CPU seconds went (each process's every thread): ``actors`` (from their
    first step), ``compressor`` and ``migrator`` (the stages with processes of their own;
    each actor's dispenser and each trainer's batcher are inside those), ``trainers`` (every
    GMI of every generation, start-up included), ``inference`` (with ``inference='gmi'``) and
    ``runner`` (this process, from the runner's making); ``core_s`` is what the run's cores
    could give over ``wall_s``. What an actor-bound run lacks against raw stepping is the
    cores the rest takes."""
    tel = runner.telemetry
    out: dict[str, float | int] = {"actors": actor_sums(tel, ("cpu_s",))["cpu_s"]}
    out.update(tel.service_cpu_s())
    out["trainers"] = round(sum(tel.total_float(n, "cpu_s") for n in tel.trainer_sources()), 2)
    if runner.cfg.inference == "gmi":
        out["inference"] = round(tel.total_float(INFERENCE, "cpu_s"), 2)
    out["runner"] = round(time.process_time() - runner.cpu_0, 2)
    out["cores"] = len(os.sched_getaffinity(0))
    out["core_s"] = round(out["cores"] * wall_s, 1)
    return out


def cpu_parts(cpu: dict[str, Any]) -> str:
    """A ``cpu_time`` document as one line: each kind of process's CPU seconds (the compressor
    and the migrator together as ``stages``)."""
    stages = cpu.get("compressor", 0.0) + cpu.get("migrator", 0.0)
    parts = [f"actors {cpu['actors']:,.0f}", f"stages {stages:,.0f}"]
    parts += [f"{k} {cpu[k]:,.0f}" for k in ("trainers", "inference", "runner") if k in cpu]
    return ", ".join(parts)
