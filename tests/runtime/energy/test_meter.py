"""Tests for runtime.energy.meter with injected fake sources and a fake clock."""

from __future__ import annotations

import json
import time
import types

import pytest

from runtime.actor_pool import Incarnations
from runtime.config import TrainConfig
from runtime.curve import NoGuard
from runtime.energy import cpu as cpu_mod
from runtime.energy import meter as meter_mod
from runtime.energy.cpu import CPUEnergySource
from runtime.energy.gpu import GPUEnergySource
from runtime.energy.meter import EnergyMeter, Measurement
from runtime.results import Timeline, build_result
from runtime.telemetry import RunTelemetry


class FakeGPU(GPUEnergySource):
    """Cumulative joules per GPU, advanced by the test."""

    source = "nvml"

    def __init__(self, energy_j: dict[int, float]) -> None:
        super().__init__(energy_j)
        self.energy_j = dict(energy_j)

    def read_energy_j(self) -> dict[int, float]:
        return dict(self.energy_j)


class FakeCPU(CPUEnergySource):
    """Cumulative CPU joules, advanced by the test."""

    source = "model"

    def __init__(self) -> None:
        self.energy_j = 0.0

    def read_energy_j(self) -> float:
        return self.energy_j


class FakeClock:
    """Replaces time.monotonic in meter.py."""

    def __init__(self) -> None:
        self.t_s = 1000.0

    def __call__(self) -> float:
        return self.t_s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(meter_mod.time, "monotonic", fake)
    return fake


def test_window_gives_exact_joules_and_powers(clock: FakeClock) -> None:
    gpu, cpu = FakeGPU({0: 100.0, 1: 50.0}), FakeCPU()
    meter = EnergyMeter(gpu=gpu, cpu=cpu)
    meter.begin_window("a")
    clock.t_s += 10.0
    gpu.energy_j = {0: 1100.0, 1: 2050.0}
    cpu.energy_j = 300.0
    m = meter.end_window("a")
    assert m == Measurement(10.0, {0: 1000.0, 1: 2000.0}, 300.0, "nvml", "model")
    assert m.gpu_total_j == 3000.0
    assert m.total_j == 3300.0
    assert m.gpu_power_w == 300.0
    assert m.cpu_power_w == 30.0
    assert m.to_dict() == {
        "gpu_j": 3000.0,
        "cpu_j": 300.0,
        "gpu_source": "nvml",
        "cpu_source": "model",
        "elapsed_s": 10.0,
        "gpu_w": 300.0,
        "cpu_w": 30.0,
        "per_gpu_j": {"0": 1000.0, "1": 2000.0},
    }
    assert json.loads(json.dumps(m.to_dict())) == m.to_dict()
    assert meter.open_windows == []


def test_nested_windows_with_different_keys(clock: FakeClock) -> None:
    gpu, cpu = FakeGPU({0: 0.0}), FakeCPU()
    meter = EnergyMeter(gpu=gpu, cpu=cpu)
    meter.begin_window("outer")
    clock.t_s += 5.0
    gpu.energy_j[0] = 500.0
    meter.begin_window("inner")
    assert meter.open_windows == ["outer", "inner"]
    clock.t_s += 2.0
    gpu.energy_j[0] = 700.0
    cpu.energy_j = 20.0
    inner = meter.end_window("inner")
    clock.t_s += 3.0
    outer = meter.end_window("outer")
    assert (inner.elapsed_s, inner.gpu_energy_j, inner.cpu_energy_j) == (2.0, {0: 200.0}, 20.0)
    assert (outer.elapsed_s, outer.gpu_energy_j, outer.cpu_energy_j) == (10.0, {0: 700.0}, 20.0)
    assert outer.gpu_power_w == 70.0


def test_peek_reads_an_open_window_and_leaves_it_open(clock: FakeClock) -> None:
    gpu, cpu = FakeGPU({0: 0.0}), FakeCPU()
    meter = EnergyMeter(gpu=gpu, cpu=cpu)
    meter.begin_window("run")
    clock.t_s += 4.0
    gpu.energy_j[0] = 400.0
    first = meter.peek_window("run")
    clock.t_s += 6.0
    gpu.energy_j[0] = 1000.0
    assert (first.elapsed_s, first.gpu_total_j) == (4.0, 400.0)
    assert meter.open_windows == ["run"]
    assert meter.end_window("run").gpu_total_j == 1000.0
    with pytest.raises(ValueError, match="'run' is not open"):
        meter.peek_window("run")


def test_duplicate_begin_raises_and_names_key() -> None:
    meter = EnergyMeter(gpu=FakeGPU({}), cpu=FakeCPU())
    meter.begin_window("trial-1")
    meter.begin_window("trial-2")
    with pytest.raises(ValueError, match=r"'trial-1' is already open.*\['trial-1', 'trial-2'\]"):
        meter.begin_window("trial-1")


def test_unknown_end_raises_and_lists_open_windows() -> None:
    meter = EnergyMeter(gpu=FakeGPU({}), cpu=FakeCPU())
    meter.begin_window("trial-1")
    with pytest.raises(ValueError, match=r"'nope' is not open.*\['trial-1'\]"):
        meter.end_window("nope")
    meter.end_window("trial-1")
    with pytest.raises(ValueError, match="'trial-1' is not open"):
        meter.end_window("trial-1")


def test_zero_elapsed_guards_power(clock: FakeClock) -> None:
    gpu, cpu = FakeGPU({0: 0.0}), FakeCPU()
    meter = EnergyMeter(gpu=gpu, cpu=cpu)
    meter.begin_window("w")
    gpu.energy_j[0] = 5.0
    cpu.energy_j = 1.0
    m = meter.end_window("w")
    assert m.elapsed_s == 0.0
    assert (m.gpu_power_w, m.cpu_power_w) == (0.0, 0.0)


def test_default_sources_are_probed() -> None:
    meter = EnergyMeter()
    assert meter.gpu.source in ("nvml", "nvml-power-polling", "none")
    assert meter.cpu.source in ("rapl", "model")
    meter.begin_window("w")
    m = meter.end_window("w")
    assert m.elapsed_s >= 0.0
    assert m.gpu_source == meter.gpu.source


def fake_run(trained_steps: int) -> types.SimpleNamespace:
    """What ``build_result`` reads of a finished run: one CPU trainer, nothing else."""
    telemetry = RunTelemetry()
    telemetry.latest["trainer-0"] = {"trained_steps": trained_steps, "device": "cpu"}
    return types.SimpleNamespace(
        cfg=TrainConfig(),
        telemetry=telemetry,
        fleet=types.SimpleNamespace(sharing="cpu", mps_note=None, handovers=[], spares=None),
        resume=None,
        timeline=Timeline(),
        changes=[],
        interrupted=False,
        failure=None,
        ended=Incarnations(),
        restarts=0,
        supervisor=types.SimpleNamespace(replacements=[]),
        guard=NoGuard(),
        phases=None,
        trainer_names=lambda: ["trainer-0"],
        cpu_0=time.process_time(),
    )


def test_result_carries_both_cpu_models(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    busy = iter([0.0, 2.0, 10.0])  # busy core-seconds: the model's origin, begin, end
    monkeypatch.setattr(cpu_mod.CPUModelEnergy, "_system_busy_s", lambda self: next(busy))
    model = cpu_mod.CPUModelEnergy(
        10.0, idle_w=50.0, idle_source="tdp-table: Acme (200 W TDP) x 0.25 x 1 socket", clock=clock
    )
    gpu = FakeGPU({0: 0.0})
    meter = EnergyMeter(gpu=gpu, cpu=model)
    meter.begin_window("run")
    clock.t_s += 10.0
    gpu.energy_j[0] = 420.0
    m = meter.end_window("run")
    assert (m.cpu_energy_j, m.cpu_idle_j, m.cpu_busy_only_j) == (580.0, 500.0, 80.0)
    result = json.loads(json.dumps(build_result(fake_run(1000), 10.0, m)))
    energy = result["energy"]
    assert energy["cpu_source"] == "model"
    assert energy["cpu_model"] == {
        "name": "busy-cores+idle",
        "watts_per_busy_core": 10.0,
        "idle_w": 50.0,
        "idle_source": "tdp-table: Acme (200 W TDP) x 0.25 x 1 socket",
    }
    assert (energy["cpu_j"], energy["cpu_idle_j"], energy["cpu_j_busy_only"]) == (580, 500, 80)
    assert result["steps_per_joule"] == pytest.approx(1000 / (420 + 580))
    assert result["steps_per_joule_busy_only"] == pytest.approx(1000 / (420 + 80))


def test_measured_cpu_has_no_busy_only_figure(clock: FakeClock) -> None:
    meter = EnergyMeter(gpu=FakeGPU({0: 0.0}), cpu=FakeCPU())  # no idle part, like RAPL
    meter.begin_window("run")
    clock.t_s += 10.0
    meter.cpu.energy_j = 100.0
    m = meter.end_window("run")
    assert (m.cpu_idle_j, m.cpu_model, m.cpu_busy_only_j) == (None, None, None)
    result = build_result(fake_run(1000), 10.0, m)
    assert not {"cpu_model", "cpu_idle_j", "cpu_j_busy_only"} & set(result["energy"])
    assert "steps_per_joule_busy_only" not in result
    assert result["steps_per_joule"] == pytest.approx(10.0)


def test_a_failed_read_is_taken_at_the_last_reading_and_the_next_makes_up_for_it():
    """An NVML hiccup at a window's end neither loses the window nor fails the run: the
    source's last reading stands in, the miss is counted, and the cumulative counter's next
    read brings the energy in."""
    from runtime.energy.cpu import CPUModelEnergy
    from runtime.energy.gpu import GPUEnergyError, GPUEnergySource
    from runtime.energy.meter import EnergyMeter

    class Flaky(GPUEnergySource):
        source = "nvml"

        def __init__(self) -> None:
            super().__init__([0])
            self.j, self.fail = 0.0, False

        def read_energy_j(self) -> dict[int, float]:
            self.j += 100.0  # the GPU draws on whether or not the read works
            if self.fail:
                self.fail = False
                raise GPUEnergyError("NVML failed to read total energy of GPU 0: Unknown Error")
            return {0: self.j}

    gpu = Flaky()
    meter = EnergyMeter(gpu=gpu, cpu=CPUModelEnergy())
    meter.begin_window("run")
    meter.begin_window("trial")
    gpu.fail = True
    trial = meter.end_window("trial")  # its end could not be read: the last reading stands
    assert trial.gpu_total_j == 0.0 and meter.read_errors == 1
    assert meter.open_windows == ["run"]
    run = meter.end_window("run")
    assert run.gpu_total_j == 300.0  # 100 J a read after its first, the failed one made up
    fresh = EnergyMeter(gpu=Flaky(), cpu=CPUModelEnergy())
    fresh.gpu.fail = True
    with pytest.raises(GPUEnergyError):  # no reading yet to stand in: said at once
        fresh.begin_window("run")
