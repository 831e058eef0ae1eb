"""The model-guided tuner on the simulated job (``bench.tuner_sim``): it reaches 95 % of the
surface's optimum within 20 windows in at least 9 of 10 seeds; TPE's counts on the same seeds
are reported by ``python -m bench.tuner_sim``."""

from __future__ import annotations

import json

from bench import tuner_sim


def test_the_model_tuner_reaches_95_percent_of_the_optimum_in_20_windows(tmp_path):
    doc = tuner_sim.run(seeds=10, windows=20, samplers=("model",))
    reached = [w for w in doc["samplers"]["model"]["windows_to_95"] if w is not None]
    assert len(reached) >= 9, doc["samplers"]["model"]


def test_the_script_writes_both_samplers_figures(tmp_path):
    out = tmp_path / "sim.json"
    assert tuner_sim.main(["--json", str(out), "--seeds", "1", "--windows", "3"]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["samplers"]) == {"model", "tpe"} and doc["optimum"] > 0
    for r in doc["samplers"].values():
        assert len(r["windows_to_95"]) == 1 and len(r["regret"]) == 1
