"""Output paths are checked before a command's work starts, and written whole or not at all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autotune.cli.output import OutputPathError, check_output, write_json

CLI = [sys.executable, "-m", "autotune.cli"]


def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    (tmp_path / "a-file").write_text("")
    for path, said in (
        (tmp_path, "is a directory; give a file path"),
        (tmp_path / "a-file" / "r.json", "a-file is a file, not a directory"),
    ):
        out = subprocess.run(
            [*CLI, "train", "--env", "CartPole-v1", "--steps", "512", "--json", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2 and said in " ".join(out.stderr.split()), out.stderr
        assert "sizing" not in out.stderr  # refused before its probes


def test_json_is_written_whole_with_the_usual_permissions(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "r.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})  # over a good file: replaced at once
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(path.parent) == ["r.json"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(TypeError):
        write_json(path, {1j: 1})  # a key JSON cannot hold
    assert json.loads(path.read_text()) == {"a": 2}  # the good file is kept
    assert os.listdir(path.parent) == ["r.json"]
    check_output(None, "--json")
    check_output(tmp_path / "new" / "x.json", "--json")  # folders to be made are fine
    with pytest.raises(OutputPathError, match=r"--json .*: is a directory"):
        check_output(tmp_path, "--json")
    # a folder where nothing can be made (root included): refused at the start
    with pytest.raises(
        OutputPathError, match=r"--json /proc/a\.json: (cannot write in|/proc is not)"
    ):
        check_output(Path("/proc/a.json"), "--json")
    # a write that fails at the end says so, not with a traceback
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OutputPathError, match=r"a-file/x\.json: cannot write it \(") as cut:
        write_json(tmp_path / "a-file" / "x.json", {"a": 1})
    # ... and keeps the document elsewhere, naming where: the run's record is not lost
    kept = Path(re.search(r"kept at (\S+) instead", str(cut.value)).group(1))
    assert json.loads(kept.read_text()) == {"a": 1} and kept.parent.stat().st_mode & 0o077 == 0
    assert kept.parent.parent == tmp_path


def test_a_document_is_kept_only_in_a_folder_of_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "a-file").write_text("")
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / f"autotune-unsaved-{os.getuid()}").symlink_to(other)  # not the user's folder
    with pytest.raises(OutputPathError, match="kept at") as cut:
        write_json(tmp_path / "a-file" / "x.json", {"steps": 7})
    kept = Path(re.search(r"kept at (\S+) instead", str(cut.value)).group(1))
    assert kept.parent.parent == tmp_path and not kept.is_relative_to(other)
    assert json.loads(kept.read_text()) == {"steps": 7} and kept.parent.stat().st_mode & 0o077 == 0
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "a-file"))  # no temporary folder
    with pytest.raises(OutputPathError, match=r"nor could it be kept .*: it is lost"):
        write_json(tmp_path / "a-file" / "x.json", {"steps": 7})


def test_a_plots_folder_that_cannot_be_made_is_refused_before_the_export(tmp_path):
    from autotune.cli.output import check_output_dir

    (tmp_path / "a-file").write_text("")
    check_output_dir(None, "--plots")
    check_output_dir(tmp_path, "--plots")  # there, and writable
    check_output_dir(tmp_path / "new" / "plots", "--plots")  # to be made
    for path, said in (
        (tmp_path / "a-file", "is a file; give a directory"),
        (tmp_path / "a-file" / "plots", "a-file is a file, not a directory"),
    ):
        with pytest.raises(OutputPathError, match=said):
            check_output_dir(path, "--plots")
    plots = ["--plots", str(tmp_path / "a-file" / "plots")]
    out = subprocess.run(
        [*CLI, "export", "--study", "none", "--storage", f"sqlite:///{tmp_path}/s.db", *plots],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--plots" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (a disk always full)")
def test_a_progress_curve_on_a_full_disk_fails_the_run_and_its_result_says_why(tmp_path):
    # not a service's death (RunError) but a fault in the run's own loop: its result is
    # written all the same, with the error and its type, and nothing it sampled is lost
    result = tmp_path / "r.json"
    cmd = [*CLI, "train", "--env", "CartPole-v1", "--steps", "20000", "--trainer-device", "cpu"]
    cmd += ["--actors", "1", "--envs-per-actor", "4", "--quiet", "--json", str(result)]
    out = subprocess.run(
        [*cmd, "--progress", "/dev/full"], capture_output=True, text=True, timeout=300
    )
    text = " ".join(out.stdout.split() + out.stderr.split())
    assert out.returncode == 1, text
    assert "run failed: OSError: [Errno 28]" in text and "(failed)" in text
    assert "progress curve incomplete: [Errno 28]" in text  # its close failed as well
    doc = json.loads(result.read_text())
    assert doc["failed"] and doc["failure"].startswith("OSError: [Errno 28]"), doc["failure"]
    assert doc["lost_steps"] == 0 and doc["config"]["actors"] == 1


def test_an_output_path_that_is_the_study_storages_file_is_refused(tmp_path):
    """Writing a result there would replace every study in the storage."""
    db = tmp_path / "studies.db"
    db.write_bytes(b"")
    for storage in (f"sqlite:///{db}", f"sqlite+pysqlite:///{db}"):
        for path in (db, Path(f"{db}-wal"), Path(f"{db}.ask-lock"), tmp_path / "." / "studies.db"):
            with pytest.raises(OutputPathError, match="is a file of the study storage"):
                check_output(path, "--out", storage)
    check_output(tmp_path / "export.json", "--out", f"sqlite:///{db}")  # another file: fine
    check_output(db, "--json", "postgresql://u@h/db")  # not a SQLite storage's file
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "export",
            "--study",
            "s",
            "--storage",
            f"sqlite:///{db}",
            "--out",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "is a file of the study storage" in " ".join(
        proc.stderr.split()
    )
    assert db.read_bytes() == b""
