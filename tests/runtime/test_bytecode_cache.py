"""The bytecode cache for installs that have none (``runtime.cache_dirs.use_bytecode_cache``)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from runtime import cache_dirs
from runtime.cache_dirs import BYTECODE_ENV, bytecode_note, use_bytecode_cache


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A package on ``sys.path`` with no bytecode, the tool's cache under ``tmp_path``, no
    prefix set and bytecode allowed (whatever this shell's ``PYTHONDONTWRITEBYTECODE`` says)."""
    src = tmp_path / "site" / "nobytecode_pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(BYTECODE_ENV, "")  # recorded, so that teardown removes what a test sets
    monkeypatch.delenv(BYTECODE_ENV)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    allowed = types.SimpleNamespace(dont_write_bytecode=False)
    monkeypatch.setattr(
        cache_dirs,
        "sys",
        types.SimpleNamespace(flags=allowed, pycache_prefix=None, executable=sys.executable),
    )
    importlib.invalidate_caches()
    return "nobytecode_pkg"


def test_a_read_only_install_without_bytecode_gets_the_tools_folder_for_later_processes(
    package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_dirs, "_writable", lambda folder: False)
    folder = use_bytecode_cache(package)
    assert folder == tmp_path / "cache" / "bytecode" and folder.is_dir()
    # a process started afterwards reads and writes its bytecode there
    code = "import sys, nobytecode_pkg; print(sys.pycache_prefix)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(folder)
    assert list(folder.rglob("__init__*.pyc")), "the child wrote its import's bytecode there"
    assert use_bytecode_cache(package) == folder  # once set, it stays


@pytest.mark.parametrize("why", ["has bytecode", "writable", "no such module"])
def test_nothing_changes_where_python_keeps_bytecode_itself(
    why: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = package
    if why == "has bytecode":
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None
        target = Path(importlib.util.cache_from_source(spec.origin))
        target.parent.mkdir(parents=True)
        target.write_bytes(b"")
        monkeypatch.setattr(cache_dirs, "_writable", lambda folder: False)
    elif why == "writable":
        monkeypatch.setattr(cache_dirs, "_writable", lambda folder: True)
    else:
        name = "no_module_of_this_name_anywhere"
    assert use_bytecode_cache(name) is None
    assert BYTECODE_ENV not in os.environ


def test_a_user_who_asked_for_no_bytecode_gets_none(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_dirs, "_writable", lambda folder: False)
    flags = types.SimpleNamespace(dont_write_bytecode=True)
    fake_sys = types.SimpleNamespace(flags=flags, pycache_prefix=None, executable=sys.executable)
    monkeypatch.setattr(cache_dirs, "sys", fake_sys)
    assert use_bytecode_cache(package) is None
    assert BYTECODE_ENV not in os.environ


def test_a_prefix_set_already_stands(
    package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_dirs, "_writable", lambda folder: False)
    monkeypatch.setenv(BYTECODE_ENV, str(tmp_path / "mine"))
    assert use_bytecode_cache(package) == tmp_path / "mine"


def test_writable_follows_the_folder_or_its_parent(tmp_path: Path) -> None:
    assert cache_dirs._writable(tmp_path / "__pycache__")  # missing: Python would make it
    assert cache_dirs._writable(tmp_path)
    assert not cache_dirs._writable(Path("/proc/1/__pycache__"))


def test_the_user_is_told_how_to_compile_an_install_that_python_may_not_write_bytecode_for(
    package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert bytecode_note(package) is None  # bytecode allowed: Python writes it itself
    flags = types.SimpleNamespace(dont_write_bytecode=True)
    monkeypatch.setattr(
        cache_dirs,
        "sys",
        types.SimpleNamespace(flags=flags, pycache_prefix=None, executable=sys.executable),
    )
    note = bytecode_note(package)
    assert note is not None and "PYTHONDONTWRITEBYTECODE" in note
    compile_it = [sys.executable, "-m", "compileall", "-q", "-j", "0", str(tmp_path / "site")]
    assert note.endswith(shlex.join(compile_it))
    with monkeypatch.context() as m:  # a folder no one may write: the way that works instead
        m.setattr(cache_dirs, "_writable", lambda folder: False)
        note = bytecode_note(package)
        assert note is not None and "compileall" not in note
        folder = tmp_path / "cache" / "bytecode"
        assert note.endswith(f"keep their bytecode in {folder} (its folder cannot be written)")
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tmp_path / "site")],
        env={k: v for k, v in os.environ.items() if k != BYTECODE_ENV},
        check=True,
    )
    assert bytecode_note(package) is None  # compiled as the note says: nothing to tell


def test_a_prefix_given_on_the_command_line_reaches_the_processes_started_after(
    package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = types.SimpleNamespace(dont_write_bytecode=False)
    given = str(tmp_path / "given")
    monkeypatch.setattr(
        cache_dirs,
        "sys",
        types.SimpleNamespace(flags=flags, pycache_prefix=given, executable=sys.executable),
    )
    assert use_bytecode_cache(package) == Path(given)
    assert os.environ[BYTECODE_ENV] == given  # spawned children are not passed -X options


def test_the_runs_processes_probes_and_spares_get_the_folder_before_they_start(
    package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing as mp

    from runtime import probes
    from runtime.env_probes import ProbeError
    from runtime.gmi.spares import Spares
    from runtime.services import Services

    missing = tmp_path / "site" / "torch" / "__pycache__" / "__init__.cpython-312.pyc"
    monkeypatch.setattr(cache_dirs, "_missing_bytecode", lambda module: missing)
    monkeypatch.setattr(cache_dirs, "_writable", lambda folder: False)
    folder = str(tmp_path / "cache" / "bytecode")
    ctx = mp.get_context("spawn")
    Services(ctx)
    assert os.environ.pop(BYTECODE_ENV) == folder
    Spares(ctx, lambda name, proc: None)
    assert os.environ.pop(BYTECODE_ENV) == folder
    seen: dict[str, str] = {}

    def child(cmd, env, timeout_s, on_gpu_learner):
        seen.update(env)
        return 1, [], ["refused here"]

    monkeypatch.setattr(probes, "run_child", child)
    with pytest.raises(ProbeError, match="refused here"):
        probes.run_probes("CartPole-v1", "auto:8:auto", 8, {}, ["cpu"])
    assert seen[BYTECODE_ENV] == folder  # the probe child and what it starts read it


def test_train_tells_the_user_before_its_work(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from autotune.cli import train
    from autotune.cli.main import main

    monkeypatch.setattr(train, "bytecode_note", lambda: "torch has no bytecode [here]")
    assert main(["train", "--quiet", "--tune", "--in-process", "--cores", "0"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "note: torch has no bytecode [here]" in err  # the text as it is, not read as markup
