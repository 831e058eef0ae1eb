"""An EnvPool that is installed but does not load (a library of its own missing on the host,
as MuJoCo's libEGL on a GPU server without graphics libraries) is said, not passed over: an
explicit ``envpool`` backend is refused with the load error, ``auto`` warns and runs gymnasium."""

from __future__ import annotations

import logging
import sys

import pytest

from runtime import envpool_index
from runtime.env_backends import envpool_problem, resolve_backend
from runtime.envs import EnvError

LOAD_ERROR = "libEGL.so.1: cannot open shared object file: No such file or directory"


@pytest.fixture
def broken_envpool(tmp_path, monkeypatch):
    """An installed ``envpool`` package whose import fails as EnvPool's does without libEGL."""
    pkg = tmp_path / "envpool"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"raise ImportError({LOAD_ERROR!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "envpool" or m.startswith("envpool.")]:
        monkeypatch.delitem(sys.modules, name)
    envpool_index.index.cache_clear()
    yield
    envpool_index.index.cache_clear()


def test_an_explicit_envpool_backend_is_refused_with_the_load_error(broken_envpool):
    with pytest.raises(EnvError, match=r"EnvPool is installed but does not load: libEGL\.so\.1"):
        resolve_backend("CartPole-v1", "envpool")


def test_auto_runs_gymnasium_and_warns_with_the_load_error(broken_envpool, caplog):
    with caplog.at_level(logging.WARNING, logger="runtime.envpool_index"):
        assert resolve_backend("CartPole-v1", "auto") == "gymnasium"
    assert envpool_problem() == f"installed but does not load: {LOAD_ERROR}"
    assert [r.getMessage() for r in caplog.records] == [
        f"EnvPool is installed but does not load ({LOAD_ERROR}): actors use gymnasium"
    ]


def test_the_ids_are_kept_for_the_installed_envpool_and_read_back_without_importing_it(tmp_path):
    """Which ids EnvPool has is asked of EnvPool once (its import takes about a second) and
    kept in the cache folder for that EnvPool; a later process reads it there, and a file kept
    for another EnvPool (another version or place) is not used."""
    import json
    import os
    import subprocess

    pytest.importorskip("envpool")
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)}
    ask = (
        "import sys; from runtime.env_backends import envpool_ids; "
        "print(len(envpool_ids()), 'envpool' in sys.modules)"
    )

    def run() -> list[str]:
        cmd = [sys.executable, "-c", ask]
        return subprocess.run(
            cmd, capture_output=True, text=True, env=env, check=True
        ).stdout.split()

    first = run()
    assert int(first[0]) > 100 and first[1] == "True"  # asked of EnvPool, and kept
    assert run() == [first[0], "False"]  # read back: EnvPool not imported
    kept = tmp_path / envpool_index.IDS_FILE
    doc = json.loads(kept.read_text())
    kept.write_text(json.dumps({"key": "0.0|elsewhere|0", "families": {"x": ["Made-up-v0"]}}))
    assert run() == [first[0], "True"]  # another EnvPool's: asked again
    assert json.loads(kept.read_text()) == doc


def test_an_actor_imports_only_its_envs_family_and_the_package_is_whole_when_asked(tmp_path):
    """An EnvPool env is made with only its family's registration imported (``import envpool``
    imports every family, jumanji's renderer and matplotlib among them); the package is whole
    again for code that asks it for anything else."""
    import os
    import subprocess

    pytest.importorskip("envpool")
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)}
    ask = (
        "import sys; from runtime.env_backends import envpool_ids; from runtime.envs import "
        "envpool_make; envpool_ids(); p = envpool_make('CartPole-v1', num_envs=2); "
        "print(p.reset()[0].shape[0], 'envpool.jumanji' in sys.modules, "
        "'matplotlib' in sys.modules); import envpool; "
        "print(len(envpool.list_all_envs()) == len(envpool_ids()), "
        "'envpool.jumanji' in sys.modules)"
    )
    for kept in (False, True):  # asked of EnvPool (imported whole), then read back
        out = subprocess.run(
            [sys.executable, "-c", ask], capture_output=True, text=True, env=env, check=True
        ).stdout.split()
        assert out == ["2", str(not kept), str(not kept), "True", "True"], out
