"""A suite byte-compiles a torch installed without bytecode first (``bench.bytecode``)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from bench import bytecode
from bench.report import machine_doc
from runtime import cache_dirs
from runtime.cache_dirs import BYTECODE_ENV


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A package without bytecode on ``sys.path``, the tool's cache under ``tmp_path``, no
    prefix, and a fresh record."""
    src = tmp_path / "site" / "bench_nobytecode_pkg"
    (src / "sub").mkdir(parents=True)
    (src / "__init__.py").write_text("VALUE = 1\n")
    (src / "sub" / "__init__.py").write_text("OTHER = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(BYTECODE_ENV, "")  # recorded, so that teardown removes what a test sets
    monkeypatch.delenv(BYTECODE_ENV)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(bytecode, "STATE", {})
    importlib.invalidate_caches()
    return "bench_nobytecode_pkg"


def pycs(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.pyc"))


def test_an_install_without_bytecode_is_compiled_beside_its_sources(
    package: str, tmp_path: Path
) -> None:
    said = bytecode.ensure_bytecode(module=package)
    assert "compiled beside the sources" in said and "incomplete" not in said
    assert len(pycs(tmp_path / "site")) == 2  # the whole site-packages, as pip compiles it
    assert cache_dirs._missing_bytecode(package) is None
    assert BYTECODE_ENV not in os.environ
    assert machine_doc()["bytecode"] == {package: said}  # the result says what was done


def test_one_whose_folder_cannot_be_written_is_compiled_into_the_tools_cache(
    package: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_dirs, "_writable", lambda folder: False)
    said = bytecode.ensure_bytecode(module=package)
    folder = tmp_path / "cache" / "bytecode"
    assert f"compiled into {folder}" in said and "incomplete" not in said
    assert not pycs(tmp_path / "site") and len(pycs(folder)) == 2
    assert os.environ[BYTECODE_ENV] == str(folder)  # the suite's processes read it
    assert sys.pycache_prefix == str(folder)


def test_as_installed_and_a_compiled_install_are_left_alone(package: str, tmp_path: Path) -> None:
    said = bytecode.ensure_bytecode(compile_missing=False, module=package)
    assert "measured as installed" in said and not pycs(tmp_path / "site")
    bytecode.ensure_bytecode(module=package)
    assert bytecode.ensure_bytecode(module=package) == "installed with its bytecode"
    assert bytecode.ensure_bytecode(module="no_module_of_this_name") == "not installed"
