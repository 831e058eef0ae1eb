"""GPU inventory without a driver, and ``autotune gpu`` on this machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune.hw import gpus, nvml


def test_no_nvml_means_no_gpus(monkeypatch):
    monkeypatch.setattr(nvml, "pynvml", None)
    assert gpus.list_gpus() == []


def test_cli_gpu_reports_what_it_found(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "gpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
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
    assert gpus.sm_counts()[0] > 0
