"""GPU inventory without a driver, and ``autotune gpu`` on this machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime.hw import gpus, nvml


def test_no_nvml_means_no_gpus(monkeypatch):
    monkeypatch.setattr(nvml, "pynvml", None)
    assert gpus.list_gpus() == []


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
