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
    assert doc["load"] == "cpu" and doc["busy"] == 1
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


def test_a_gpu_load_is_refused_where_no_gpu_is_visible(capsys):
    from runtime.hw.gpus import no_gpu_reason, torch_sees_gpu

    if no_gpu_reason() is None and torch_sees_gpu():
        pytest.skip("a GPU is visible here")
    with pytest.raises(SystemExit) as exc:
        probe_load.main(["--load", "gpu"])
    assert exc.value.code == 2
    assert "--load gpu needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.slow
def test_another_process_on_the_gpu_marks_the_probes_shared(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    out = tmp_path / "probe-load-gpu.json"
    assert probe_load.main(["--load", "gpu", "--batch", "1024", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["probes"]["gpu_shared"] for r in rows] == [0.0, 1.0, 0.0]


def test_the_gpu_load_ends_as_a_job_does_when_told():
    """The load's loop, run on the CPU here: it runs until its stdin closes, then finishes its
    last product and exits on its own (exit code 0), not killed."""
    proc = probe_load.start_gpu_load("cpu")
    assert proc.poll() is None  # running: its first product is done
    assert probe_load.end_gpu_load(proc) == 0
