"""Where a service process's start goes: seconds per stage, from the process's creation.

A GMI that takes over from another (``runtime.gmi.fleet``) trains only once it has started: its
interpreter and imports, torch, the device's context, the learner and its compiled loss. The
old generation trains on meanwhile, but a tuner measures the new config only after it, so the
stages are reported (the trainer's telemetry ``startup``, the result's ``gmis``) to tell which
one a hand-over waits on.
"""

from __future__ import annotations

import os
import time

import psutil


def process_age_s() -> float:
    """Seconds since this process was created (its interpreter's start and the imports before
    the caller's code). On Linux from its start in clock ticks since boot and the uptime, both
    to 10 ms (``psutil``'s creation time adds a boot time in whole seconds: up to 1 s off);
    elsewhere from ``psutil``; 0 where neither can be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        return max(0.0, time.time() - psutil.Process().create_time())
    except (psutil.Error, OSError):
        return 0.0


class StartupClock:
    """Stages of a start, each ``took(stage)`` the seconds since the one before; the first
    (``boot``) counts from the process's creation, or from ``asked_at`` (``time.monotonic()``
    in the process that asked: on Linux one clock for the whole host) for a process started
    ahead and given its work later (``runtime.gmi.spares``), which also reports how long it
    had been up (``spare``)."""

    def __init__(self, asked_at: float | None = None) -> None:
        self.t0 = self._mark = time.monotonic()
        age = process_age_s()
        if asked_at is None:
            self.stages: dict[str, float] = {"boot": age}
        else:
            boot = min(max(0.0, self.t0 - asked_at), age)
            self.stages = {"boot": boot, "spare": age - boot}

    def took(self, stage: str) -> None:
        now = time.monotonic()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - self._mark
        self._mark = now

    def doc(self, inner: dict[str, float] | None = None) -> dict[str, float]:
        """``{stage}_s`` for every stage, ``inner`` ones (timed by the callee inside the last
        span) split out of the time since the last ``took``, and ``total_s``."""
        self.took("rest")
        inner = inner or {}
        stages = dict(self.stages)
        stages["rest"] = max(0.0, stages["rest"] - sum(inner.values()))
        stages.update(inner)
        total = stages["boot"] + self._mark - self.t0  # a spare's time up before is not in it
        return {**{f"{k}_s": round(v, 3) for k, v in stages.items()}, "total_s": round(total, 3)}
