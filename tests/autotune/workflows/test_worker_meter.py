"""A study worker's meter charges its own processes' CPU time and its share of the idle draw."""

from __future__ import annotations

import pytest

from autotune.workflows.worker_meter import worker_meter
from runtime.energy.cpu import CPUModelEnergy
from runtime.energy.cpu_idle import estimate_idle_w


def test_a_worker_is_charged_its_cores_share_of_the_packages_idle_draw():
    whole = estimate_idle_w(40.0)
    meter = worker_meter(None, 0.25, 40.0)()
    assert isinstance(meter.cpu, CPUModelEnergy)
    assert meter.cpu.idle_w == pytest.approx(whole.idle_w * 0.25) == pytest.approx(10.0)
    assert "this worker's cores" in meter.cpu.idle_source
    assert worker_meter(None, 3.0, 40.0)().cpu.idle_w == pytest.approx(40.0)  # at most whole
    _, idle_j = meter.cpu.read_energy_parts_j()
    assert idle_j > 0.0  # the idle term runs from the meter's start, busy or not
