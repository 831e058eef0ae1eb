"""GPU inventory without a driver, and ``autotune gpu`` on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from runtime.hw import gpus, nvml


def test_no_nvml_means_no_gpus(monkeypatch):
    monkeypatch.setattr(nvml, "pynvml", None)
    assert gpus.list_gpus() == []


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


def _fake_nvml():
    """Two GPUs: GPU 0 answers every query, GPU 1 only the required ones."""

    def only_gpu0(value):
        def read(h):
            if h != 0:
                raise FakeNVMLError("Not Supported")
            return value

        return read

    return types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"GPU",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=16 * 2**30),
        nvmlDeviceGetPowerUsage=only_gpu0(70_000),
        nvmlDeviceGetEnforcedPowerLimit=only_gpu0(350_000),
        nvmlDeviceGetTotalEnergyConsumption=only_gpu0(5),
        nvmlDeviceGetMigMode=only_gpu0((1, 1)),
        nvmlDeviceGetComputeMode=only_gpu0(3),
        nvmlDeviceGetCudaComputeCapability=only_gpu0((9, 0)),
        nvmlDeviceGetComputeRunningProcesses=only_gpu0([types.SimpleNamespace(pid=5)]),
    )


def test_optional_readings_nvml_refuses_are_none_or_unsupported(monkeypatch):
    monkeypatch.setattr(nvml, "pynvml", _fake_nvml())
    full, bare = gpus.list_gpus()
    assert (full.name, full.uuid, full.memory_total_mib) == ("GPU", "GPU-0", 16384)
    assert (full.power_w, full.energy_counter, full.mig_mode) == (70.0, True, "enabled")
    assert (full.power_limit_w, bare.power_limit_w) == (350.0, None)
    assert (full.compute_mode, full.compute_capability) == ("exclusive-process", (9, 0))
    assert (bare.power_w, bare.energy_counter, bare.mig_mode) == (None, False, "unsupported")
    assert (bare.compute_mode, bare.compute_capability) == ("unknown", None)
    assert gpus.gpus_used_by([5]) == {0} and gpus.gpus_used_by([6]) == set()


def test_no_gpu_reason_says_why_or_nothing(monkeypatch):
    """What the ``gpu`` test marker and the GPU bench steps skip by."""
    monkeypatch.setattr(nvml, "pynvml", None)
    assert "pynvml is not installed" in gpus.no_gpu_reason()
    fake = _fake_nvml()
    monkeypatch.setattr(nvml, "pynvml", fake)
    assert gpus.no_gpu_reason() is None
    fake.nvmlDeviceGetCount = lambda: 0
    assert gpus.no_gpu_reason() == "NVML reports no GPUs"

    def no_driver():
        raise FakeNVMLError("Driver Not Loaded")

    fake.nvmlInit = no_driver
    assert "Driver Not Loaded" in gpus.no_gpu_reason()


def test_a_failed_required_reading_raises_nvml_unavailable(monkeypatch):
    fake = _fake_nvml()

    def lost(h):
        raise FakeNVMLError("GPU is lost")

    fake.nvmlDeviceGetName = lost
    monkeypatch.setattr(nvml, "pynvml", fake)
    with pytest.raises(nvml.NVMLUnavailable, match=r"read the name: GPU is lost \(FakeNVMLError\)"):
        gpus.list_gpus()


def _nvml_gpu(index: int, uuid: str) -> gpus.GPUInfo:
    return gpus.GPUInfo(index, "GPU", uuid, 80_000, None, True, "disabled", "default")


def test_sm_counts_go_to_the_nvml_gpu_of_the_same_uuid_or_else_of_the_same_bus_position():
    nv = [_nvml_gpu(0, "GPU-aaaa-1"), _nvml_gpu(1, "GPU-bbbb-2"), _nvml_gpu(2, "GPU-cccc-3")]
    # CUDA's uuids come without the prefix; a GPU CUDA does not show is left out
    found = [(132, "BBBB-2"), (108, "aaaa-1")]
    assert gpus.pair_sm_counts(nv, found) == {0: 108, 1: 132}
    assert gpus.pair_sm_counts(nv, [(108, ""), (132, "")]) == {0: 108, 1: 132}
    assert gpus.pair_sm_counts(nv, []) == {}


@pytest.mark.parametrize(
    ("visible", "indices"),
    [
        (None, [0, 1, 2]),
        ("2,0", [2, 0]),
        ("1,7,2", [1]),  # CUDA stops at the first entry that names no GPU
        ("GPU-cccc", [2]),  # a UUID's start names the GPU it starts
        ("GPU-", []),
        ("MIG-aaaa-1/1/0", []),
        ("", []),
        ("-1", []),
    ],
)
def test_the_gpus_cuda_visible_devices_leaves_a_process(monkeypatch, visible, indices):
    nv = [_nvml_gpu(0, "GPU-aaaa-1"), _nvml_gpu(1, "GPU-bbbb-2"), _nvml_gpu(2, "GPU-cccc-3")]
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [g.index for g in gpus.visible(nv)] == indices


def test_the_daemon_sees_only_the_gpus_cuda_visible_devices_names_with_their_own_sms(
    monkeypatch,
):
    from autotune.control import machine

    monkeypatch.setattr(nvml, "pynvml", _fake_nvml())  # GPU-0 and GPU-1
    monkeypatch.setattr(gpus, "sm_counts_of", lambda nv: {g.index: 100 + g.index for g in nv})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    view = machine.detect()
    assert [(g.index, g.sms) for g in view.gpus] == [(1, 101)]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [(g.index, g.sms) for g in machine.detect().gpus] == [(0, 100), (1, 101)]


def test_cli_gpu_reports_what_it_found(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "gpu", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc) == {"gpus", "mps"}
    assert doc["mps"]["mode"] in ("mps", "shared")
    assert "MPS control daemon:" in proc.stdout
    if not doc["gpus"]:
        assert "no NVIDIA GPU" in proc.stdout


@pytest.mark.gpu
def test_inventory_on_a_real_gpu_reads_energy_counter_and_sms():
    found = gpus.list_gpus()
    assert found and all(g.memory_total_mib > 0 for g in found)
    assert all(g.mig_mode in ("enabled", "disabled", "unsupported") for g in found)
    assert all(g.compute_capability is not None and g.compute_capability >= (3, 0) for g in found)
    assert gpus.sm_counts()[0] > 0
    whole = [g for g in found if g.mig_mode != "enabled"]
    assert sorted(gpus.sm_counts_of(found)) == [g.index for g in whole]


def _gpu(name, capability):
    return gpus.GPUInfo(
        index=0,
        name=name,
        uuid="GPU-x",
        memory_total_mib=16384,
        power_w=None,
        energy_counter=True,
        mig_mode="unsupported",
        compute_mode="default",
        compute_capability=capability,
    )


def test_bf16_is_refused_only_where_no_gpu_has_capability_8():
    assert gpus.bf16_problem([_gpu("NVIDIA H100", (9, 0))]) is None
    assert gpus.bf16_problem([_gpu("NVIDIA A100", (8, 0)), _gpu("Tesla T4", (7, 5))]) is None
    assert gpus.bf16_problem([_gpu("Tesla T4", None)]) is None  # unknown: not refused
    assert gpus.bf16_problem([]) is None
    problem = gpus.bf16_problem([_gpu("Tesla V100", (7, 0)), _gpu("Tesla T4", (7, 5))])
    assert "compute capability 8.0 or later" in problem
    assert "Tesla V100 (7.0), Tesla T4 (7.5)" in problem and "trainer_precision='fp32'" in problem


def test_where_nvml_sees_no_gpu_the_cpu_is_resolved_without_importing_torch():
    """``trainer_device`` auto resolves to cpu where NVML sees no GPU, and neither it nor the
    knob space's machine imports torch for it (seconds a process); where NVML sees one, torch
    says whether CUDA is usable."""
    code = (
        "import sys\n"
        "from runtime.config import TrainConfig\n"
        "from runtime.hw.gpus import no_gpu_reason, torch_sees_gpu\n"
        "from autotune.tuning.knobs import Machine\n"
        "device, gpus = TrainConfig().resolved_device(), Machine.here().gpus\n"
        "print(no_gpu_reason() is None, device, gpus, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    if out[0] == "False":  # no GPU that NVML reads
        assert out[1:] == ["cpu", "0", "False"]
    else:
        import torch

        cuda = torch.cuda.is_available()
        assert out[1:3] == [
            "cuda" if cuda else "cpu",
            str(torch.cuda.device_count() if cuda else 0),
        ]
