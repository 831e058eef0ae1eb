"""Tests for runtime.energy.gpu with pynvml replaced by a fake (patched in runtime.hw.nvml)."""

from __future__ import annotations

import itertools
import time
import types
from collections.abc import Iterator

import pytest

from runtime.energy import gpu
from runtime.hw import nvml


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


class FakeNotSupported(FakeNVMLError):
    """Stands in for pynvml.NVMLError_NotSupported."""


def make_fake_nvml(
    energy_mj: dict[int, int], power_mw: dict[int, int], init_fails: bool = False
) -> types.SimpleNamespace:
    """Builds a fake pynvml: GPUs in ``energy_mj`` have the counter, others only power."""
    count = len(set(energy_mj) | set(power_mw))

    def nvml_init() -> None:
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")

    def total_energy(handle: int) -> int:
        if handle not in energy_mj:
            raise FakeNotSupported("Not Supported")
        return energy_mj[handle]

    return types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVMLError_NotSupported=FakeNotSupported,
        nvmlInit=nvml_init,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEnergyConsumption=total_energy,
        nvmlDeviceGetPowerUsage=lambda h: power_mw[h],
    )


@pytest.fixture(autouse=True)
def _clear_probe_cache() -> Iterator[None]:
    gpu.probe_gpu_energy.cache_clear()
    yield
    gpu.probe_gpu_energy.cache_clear()


def test_total_energy_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    energy_mj = {0: 1_000, 1: 5_000}
    monkeypatch.setattr(nvml, "pynvml", make_fake_nvml(energy_mj, {}))
    source = gpu.probe_gpu_energy()
    assert isinstance(source, gpu.NVMLEnergy)
    assert source.source == "nvml"
    assert source.gpu_indices == [0, 1]
    assert source.sources == {0: "nvml", 1: "nvml"}
    assert source.read_energy_j() == {0: 1.0, 1: 5.0}
    energy_mj[1] += 2_500
    assert source.read_energy_j() == {0: 1.0, 1: 7.5}
    assert gpu.probe_gpu_energy() is source  # cached


def test_selected_indices_and_bad_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "pynvml", make_fake_nvml({0: 1, 1: 2_000}, {}))
    assert gpu.probe_gpu_energy((1,)).read_energy_j() == {1: 2.0}
    with pytest.raises(gpu.GPUEnergyError, match=r"\[3\]"):
        gpu.probe_gpu_energy((3,))


def test_runtime_error_is_translated(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_fake_nvml({0: 1_000}, {})
    monkeypatch.setattr(nvml, "pynvml", fake)
    source = gpu.NVMLEnergy([0])

    def broken(handle: int) -> int:
        raise FakeNVMLError("GPU is lost")

    fake.nvmlDeviceGetTotalEnergyConsumption = broken
    with pytest.raises(gpu.GPUEnergyError, match=r"GPU 0.*GPU is lost"):
        source.read_energy_j()


def test_unsupported_gpu_falls_back_to_power_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "pynvml", make_fake_nvml({0: 10_000}, {1: 200_000}))
    source = gpu.probe_gpu_energy()
    try:
        assert source.source == "nvml-power-polling"
        assert source.gpu_indices == [0, 1]
        assert source.sources == {0: "nvml", 1: "nvml-power-polling"}
        start = source.read_energy_j()
        t0 = time.monotonic()
        time.sleep(0.2)
        end = source.read_energy_j()
        elapsed_s = time.monotonic() - t0
        assert end[0] - start[0] == 0.0
        # Constant 200 W: the integral equals power * time up to timer jitter.
        assert end[1] - start[1] == pytest.approx(200.0 * elapsed_s, rel=0.05)
    finally:
        source.close()


def test_all_unsupported_gives_pure_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    power_mw = {0: 100_000}
    monkeypatch.setattr(nvml, "pynvml", make_fake_nvml({}, power_mw))
    source = gpu.probe_gpu_energy()
    try:
        assert isinstance(source, gpu.NVMLPowerPollingEnergy)
        start = source.read_energy_j()[0]
        time.sleep(0.12)
        power_mw[0] = 300_000  # held from the next sample on
        time.sleep(0.12)
        delta_j = source.read_energy_j()[0] - start
        assert 100.0 * 0.24 < delta_j < 300.0 * 0.3
    finally:
        source.close()


def test_polled_energy_never_goes_backwards_when_the_power_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read between samples counts the time since the last at its power, as the next sample
    does: the cumulative value a window ends on is never above a later one."""
    power_mw = {0: 300_000}
    monkeypatch.setattr(nvml, "pynvml", make_fake_nvml({}, power_mw))
    source = gpu.probe_gpu_energy()
    try:
        reads = [source.read_energy_j()[0]]
        for i in range(200):  # reads far more often than the samples, across the drop
            if i == 100:
                power_mw[0] = 50_000
            reads.append(source.read_energy_j()[0])
            time.sleep(0.002)
        assert all(b >= a for a, b in itertools.pairwise(reads)), reads
    finally:
        source.close()


def test_no_pynvml_gives_null(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "pynvml", None)
    source = gpu.probe_gpu_energy()
    assert isinstance(source, gpu.NullGPUEnergy)
    assert source.source == "none"
    assert source.read_energy_j() == {}


def test_init_failure_gives_null(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "pynvml", make_fake_nvml({0: 1}, {}, init_fails=True))
    source = gpu.probe_gpu_energy()
    assert source.source == "none"
    assert source.gpu_indices == []


def test_zero_gpus_gives_null(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "pynvml", make_fake_nvml({}, {}))
    assert gpu.probe_gpu_energy().source == "none"


@pytest.mark.gpu
def test_real_nvml_counter() -> None:
    if nvml.pynvml is None:
        pytest.skip("pynvml (nvidia-ml-py) is not installed")
    try:
        nvml.pynvml.nvmlInit()
    except nvml.pynvml.NVMLError as exc:
        pytest.skip(f"NVML init failed, no usable NVIDIA driver here: {exc}")
    source = gpu.probe_gpu_energy()
    try:
        assert source.source in ("nvml", "nvml-power-polling")
        first = source.read_energy_j()
        time.sleep(0.25)
        second = source.read_energy_j()
        assert set(first) == set(second) == set(source.gpu_indices)
        assert all(second[i] >= first[i] for i in first)
    finally:
        source.close()
