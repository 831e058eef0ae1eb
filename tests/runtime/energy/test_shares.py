"""A job's share of the machine's energy: whole while its shares are 1, its own busy cores and
a share of the idle draw (or of measured packages, or of the GPU) once they are not, changes
applying from the reading after them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import wait_until

from runtime.energy.cpu import CPUEnergySource, CPUModelEnergy
from runtime.energy.gpu import GPUEnergySource
from runtime.energy.meter import EnergyMeter
from runtime.energy.shares import SharedCPU, SharedGPU, set_shares, shares_doc


class Counter(GPUEnergySource):
    """A GPU counter the test advances."""

    source = "nvml"

    def __init__(self) -> None:
        super().__init__((0,))
        self.j = 0.0

    def read_energy_j(self) -> dict[int, float]:
        return {0: self.j}


class Packages(CPUEnergySource):
    """Measured packages (RAPL-like, no idle part) the test advances."""

    source = "rapl"

    def __init__(self) -> None:
        self.j = 0.0

    def read_energy_j(self) -> float:
        return self.j


def test_whole_shares_read_as_the_sources_and_a_share_applies_from_the_next_reading():
    gpu, cpu = Counter(), Packages()
    meter = EnergyMeter(gpu=SharedGPU(gpu), cpu=SharedCPU(cpu))
    meter.begin_window("w")
    gpu.j, cpu.j = 100.0, 50.0
    assert meter.peek_window("w").gpu_total_j == 100.0
    assert set_shares(meter, gpu=0.25, cpu=0.5)
    gpu.j, cpu.j = 200.0, 150.0  # 100 J more of each, charged at the new shares
    m = meter.end_window("w")
    assert m.gpu_total_j == pytest.approx(100.0 + 25.0)
    assert m.cpu_energy_j == pytest.approx(50.0 + 50.0)
    doc = shares_doc(meter)
    assert [(c["gpu"], c["cpu"]) for c in doc["changes"]] == [(0.25, 0.5)]
    with pytest.raises(ValueError, match=r"energy share is within 0\.\.1"):
        set_shares(meter, gpu=1.5, cpu=0.5)
    assert shares_doc(EnergyMeter(gpu=SharedGPU(Counter()), cpu=SharedCPU(Packages()))) is None


def test_under_the_model_a_job_pays_its_own_busy_cores_and_its_share_of_idle(tmp_path):
    """A busy process outside the job's tree is charged to the machine's model, not to the
    job once it shares the machine; the idle draw is charged at the job's share."""
    t = [0.0]
    machine = CPUModelEnergy(10.0, idle_w=40.0, clock=lambda: t[0])  # every core on the host
    meter = EnergyMeter(gpu=SharedGPU(Counter()), cpu=SharedCPU(machine))
    set_shares(meter, gpu=0.0, cpu=0.25)
    before = machine.read_energy_parts_j()
    meter.begin_window("w")
    done = tmp_path / "done"
    spin = (
        "import time, pathlib\nend = time.process_time() + 0.5\n"
        f"while time.process_time() < end: pass\npathlib.Path({str(done)!r}).touch()"
    )
    # started through a parent that exits at once: the spinner is not in this job's tree
    launcher = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {spin!r}])"
    subprocess.run([sys.executable, "-c", launcher], check=True)
    wait_until(done.exists, timeout_s=120, what="the foreign process's CPU time")
    t[0] += 10.0
    m = meter.end_window("w")
    after = machine.read_energy_parts_j()
    assert m.cpu_idle_j == pytest.approx(0.25 * 40.0 * 10.0)
    machine_busy = (after[0] - after[1]) - (before[0] - before[1])
    job_busy = m.cpu_energy_j - m.cpu_idle_j
    assert machine_busy - job_busy >= 10.0 * 0.5 * 0.8  # the foreign 0.5 s is not the job's


class TwoGPUs(GPUEnergySource):
    source = "nvml"

    def __init__(self) -> None:
        super().__init__((0, 1))
        self.j = {0: 0.0, 1: 0.0}

    def read_energy_j(self) -> dict[int, float]:
        return dict(self.j)


def test_a_job_is_charged_its_share_of_its_own_gpu_only():
    gpus = TwoGPUs()
    meter = EnergyMeter(gpu=SharedGPU(gpus), cpu=SharedCPU(Packages()))
    set_shares(meter, gpu=0.5, cpu=1.0, gpu_index=1)
    meter.begin_window("w")
    gpus.j = {0: 300.0, 1: 100.0}  # the neighbour's GPU works harder
    m = meter.end_window("w")
    assert m.gpu_energy_j == pytest.approx({0: 0.0, 1: 50.0})
    assert shares_doc(meter)["changes"][-1]["gpu_index"] == 1
