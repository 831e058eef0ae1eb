"""The ``gpu-idle`` step of ``python -m bench limits``: a clear refusal where no GPU can be read,
figures where one can."""

from __future__ import annotations

import json

import pytest

from bench import gpu_idle_power, suite
from bench.__main__ import main
from runtime.energy.gpu import NullGPUEnergy


def test_without_a_readable_gpu_it_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_idle_power, "probe_gpu_energy", lambda: NullGPUEnergy())
    with pytest.raises(SystemExit, match="no GPU that NVML can read"):
        gpu_idle_power.measure(0.01, 0.0, False)
    # the suite skips the step, saying why, and writes no figures for it
    monkeypatch.setattr(suite, "gpu_missing", lambda: "no GPU that NVML can read (here)")
    assert main(["limits", "--only", "gpu-idle", "--idle-s", "0.01", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gpu-idle: skipped, it needs a GPU: no GPU that NVML can read (here)" in out
    assert json.loads((tmp_path / "limits.json").read_text())["results"] == {}


def test_bad_durations_are_refused(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["limits", "--idle-s", "0", "--out", str(tmp_path)])
    assert "--idle-s 0.0 must be > 0" in capsys.readouterr().err


@pytest.mark.gpu
def test_an_idle_context_draws_at_least_the_bare_gpu(tmp_path):
    argv = ["limits", "--only", "gpu-idle", "--idle-s", "2", "--settle-s", "2", "--no-mps"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "limits.json").read_text())
    rows = doc["results"]["gpu-idle"]["mean_w"]
    bare, held = rows["no context"], rows["idle context"]
    assert set(bare) == set(held) and all(0 < bare[g] <= held[g] * 1.05 for g in bare)
