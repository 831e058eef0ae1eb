"""The probes' GPU power readings (``runtime.power_probe``): a reading spans what ran since it
began, at least ``least_s``; on a GPU machine, the probes read the draw idle, with a context and
busy."""

from __future__ import annotations

import time

import pytest

from runtime.power_probe import Reading, busy_watts, gpu_meter


class Counter:
    """An energy counter that gains ``watts`` per second of wall time (NVML's, on a GPU)."""

    def __init__(self, watts: float) -> None:
        self.watts, self.t0 = watts, time.perf_counter()

    def read_energy_j(self) -> dict[int, float]:
        return {0: self.watts * (time.perf_counter() - self.t0)}


def test_a_reading_spans_at_least_its_least_seconds_and_what_ran_meanwhile():
    reading = Reading(Counter(80.0))
    start = time.perf_counter()
    assert reading.watts(least_s=0.2) == pytest.approx(80.0, rel=0.05)
    assert time.perf_counter() - start >= 0.2  # slept the rest
    calls = []
    assert busy_watts(Counter(150.0), lambda: calls.append(1), 0.05) == pytest.approx(
        150.0, rel=0.05
    )
    assert calls  # the work ran until the reading's seconds passed


@pytest.mark.gpu
@pytest.mark.skipif(gpu_meter() is None, reason="needs a GPU that NVML reads")
def test_the_probes_read_the_gpus_draw_idle_with_a_context_and_busy():
    from runtime.probes import GROUP_LEARNER, run_probes

    p = run_probes("CartPole-v1", "auto:64:64:auto", 32, {"epochs": 4}, ["cpu", "cuda"], procs=2)
    assert set(p.gpu_power) == {"idle_w", "context_w", "busy_w"}
    assert all(w > 0 for w in p.gpu_power.values())
    assert p.gpu_power["busy_w"] > p.gpu_power["idle_w"]
    assert {"cuda", GROUP_LEARNER, "cpu"} <= set(p.learners)
