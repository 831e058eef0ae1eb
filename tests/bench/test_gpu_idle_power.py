"""``bench.gpu_idle_power``: a clear refusal where no GPU can be read, figures where one can."""

from __future__ import annotations

import json

import pytest

from bench import gpu_idle_power
from runtime.energy.gpu import NullGPUEnergy


def test_without_a_readable_gpu_it_says_so(monkeypatch):
    monkeypatch.setattr(gpu_idle_power, "probe_gpu_energy", lambda: NullGPUEnergy())
    with pytest.raises(SystemExit, match="no GPU that NVML can read"):
        gpu_idle_power.main(["--seconds", "0.01"])


def test_bad_durations_are_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_idle_power.main(["--seconds", "0"])
    assert "--seconds 0.0 must be > 0" in capsys.readouterr().err


@pytest.mark.gpu
def test_an_idle_context_draws_at_least_the_bare_gpu(tmp_path):
    out = tmp_path / "idle.json"
    assert (
        gpu_idle_power.main(["--seconds", "2", "--settle-s", "2", "--no-mps", "--out", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())["mean_w"]
    bare, held = rows["no context"], rows["idle context"]
    assert set(bare) == set(held) and all(0 < bare[g] <= held[g] * 1.05 for g in bare)
