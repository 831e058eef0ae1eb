"""A killed run's private directory is removed by the next run; live runs' and other
programs' directories are left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from runtime import run_dirs


def test_only_directories_whose_owner_is_gone_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = {"pid": os.getpid(), "started": psutil.Process().create_time()}
    gone = {"pid": dead.pid, "started": 1.0}
    reused = {"pid": os.getpid(), "started": me["started"] - 100}  # the pid, another process
    owners = [("gone", gone), ("live", me), ("reused", reused), ("foreign", None)]
    ticks = run_dirs._boot_ticks(os.getpid())
    if ticks is not None:
        # the clock stepped by 5 s since the owner wrote its start: its ticks since boot did not
        owners.append(("stepped", {**me, "started": me["started"] - 5, "boot_ticks": ticks}))
        owners.append(("reused-ticks", {**me, "boot_ticks": ticks - 1000}))
    made = {}
    for name, owner in owners:
        d = tmp_path / f"{run_dirs.PREFIX}{name}"
        d.mkdir()
        (d / "experience").write_text("")  # as a socket file would be
        if owner is not None:
            (d / run_dirs.OWNER).write_text(json.dumps(owner))
        made[name] = d
    (tmp_path / "autotune-a-file").write_text("")
    removed = run_dirs.sweep(str(tmp_path))
    swept = ("gone", "reused") + (("reused-ticks",) if ticks is not None else ())
    assert sorted(removed) == sorted(str(made[n]) for n in swept)
    assert all(d.exists() for name, d in made.items() if name not in swept)


def test_a_run_dir_names_its_owner_and_is_removed_after(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dirs.tempfile, "tempdir", str(tmp_path))
    with run_dirs.run_dir() as path:
        owner = json.loads((tmp_path / os.path.basename(path) / run_dirs.OWNER).read_text())
        assert owner["pid"] == os.getpid()
        assert owner.get("boot_ticks") == run_dirs._boot_ticks(os.getpid())
        assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    assert not os.path.exists(path)
