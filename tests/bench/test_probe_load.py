"""``python -m bench.probe_load``: the probes quiet, under spinning processes and quiet again,
with the CPU update timed on both clocks beside them."""

from __future__ import annotations

import json

import pytest

from bench import probe_load


@pytest.mark.slow
def test_the_probes_are_measured_quiet_loaded_and_quiet_again(tmp_path, capsys):
    out = tmp_path / "probe-load.json"
    assert probe_load.main(["--busy", "1", "--batch", "1024", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["rows"]] == ["quiet", "1 busy processes", "quiet again"]
    for row in doc["rows"]:
        assert set(row["probes"]) == {"env_step_us", "forward32_us", "update_ms"}
        assert set(row["direct"]) == {"wall_ms", "thread_ms"}
        assert all(v > 0 for v in (*row["probes"].values(), *row["direct"].values()))
    assert set(doc["loaded_over_quiet"]) == {
        "probes.env_step_us",
        "probes.forward32_us",
        "probes.update_ms",
        "direct.wall_ms",
        "direct.thread_ms",
    }
    assert "loaded / quiet" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--busy", "0"], ["--batch", "8"]])
def test_bad_arguments_are_refused_saying_what_is_allowed(args, capsys):
    with pytest.raises(SystemExit) as exc:
        probe_load.main(args)
    assert exc.value.code == 2
    assert "--busy must be at least 1" in capsys.readouterr().err
