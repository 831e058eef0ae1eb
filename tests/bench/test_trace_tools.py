"""bench.trace_run's CPU split, train_config's --config handling, and bench/device_compare.sh's
command lines (a dry run with PYTHON=echo: nothing is run)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from autotune.cli.main import parse_args
from autotune.cli.train_config import train_config
from bench.trace_run import CpuSplit
from runtime.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _train_args(argv: list[str]):
    return parse_args(["train", *argv])


def test_train_config_takes_the_file_and_the_flags_given_over_it(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {"env": "CartPole-v1", "actors": 3, "envs_per_actor": 4, "trainer_device": "cpu"}
        )
    )
    cfg = train_config(_train_args(["--config", str(path), "--envs-per-actor", "6"]))
    assert (cfg.env, cfg.actors, cfg.envs_per_actor) == ("CartPole-v1", 3, 6)
    assert train_config(_train_args(["--actors", "5"])).actors == 5  # no file: the flags
    path.write_text(json.dumps({"actros": 3}))
    with pytest.raises(ConfigError, match="actros"):
        train_config(_train_args(["--config", str(path)]))


def test_cpu_split_shares_a_busy_process():
    me = psutil.Process()
    split = CpuSplit()
    split.sample({"me": os.getpid()}, [], keep=False)  # the first sample only sets the base
    wall, cpu = time.monotonic(), sum(me.cpu_times()[:2])
    while time.process_time() < cpu + 0.3:  # keep one core busy for 0.3 CPU seconds
        pass
    line = split.sample({"me": os.getpid(), "gone": 2**22 + 12345}, [os.getpid()], keep=True)
    # what this process used over the same span (on a loaded machine, less than a whole core)
    used = 100 * (sum(me.cpu_times()[:2]) - cpu) / (time.monotonic() - wall)
    shares = dict(x.rsplit(" ", 1) for x in line.split("% ") if x)
    assert used > 20 and abs(float(shares["me"]) - used) < 0.25 * used + 5, (line, used)
    assert "gone" not in shares  # a process that ended is left out, not an error
    assert "actors mean" in line and "machine busy" in line
    assert split.means().startswith("me ")


def _dry_run(part: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "bench/device_compare.sh", part],
        cwd=ROOT,
        env={**os.environ, "PYTHON": "echo", "OUT": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_device_compare_others_picks_workloads_rounds_and_own_exports(tmp_path):
    (tmp_path / "humanoid-export.json").write_text("{}")
    out = _dry_run(
        "others",
        tmp_path / "o",
        OTHERS="humanoid ant-heavy",
        ROUNDS="2",
        OWN_EXPORTS=str(tmp_path),
        ARMS="limit,exported",
    )
    runs = [x for x in out.stdout.splitlines() if x.startswith("-m bench.compare run")]
    assert len(runs) == 4, out.stdout + out.stderr
    assert all("--limit-again" in x and "--arms limit,exported" in x for x in runs)
    own = f"--exported own={tmp_path}/humanoid-export.json"
    assert [own in x for x in runs] == [True, True, False, False]
    assert runs[0].endswith("others/humanoid/round1") and runs[3].endswith("ant-heavy/round2")
    assert "--policy auto:1024:1024:512:auto" in runs[2]
    bad = _dry_run("others", tmp_path / "b", OTHERS="walker")
    assert bad.returncode == 2 and "unknown workload 'walker'" in bad.stderr
    bad = _dry_run("others", tmp_path / "b", ROUNDS="two")
    assert bad.returncode == 2 and "ROUNDS=two: a whole number >= 1" in bad.stderr


def test_device_compare_study_other_needs_a_workload(tmp_path):
    out = _dry_run("study-other", tmp_path, WORKLOAD="humanoid", STATE=str(tmp_path / "s"))
    study = [x for x in out.stdout.splitlines() if x.startswith("-m autotune.cli study")]
    assert len(study) == 1 and "--env Humanoid-v5" in study[0]
    assert "--trials 10 --confirm 3" in study[0]
    assert "--from bench/exports/ant-export.json" in study[0]
    assert (tmp_path / "s").is_dir()
    missing = _dry_run("study-other", tmp_path, WORKLOAD="")
    assert missing.returncode != 0 and "WORKLOAD" in missing.stderr


def test_device_compare_cpu_study_and_cpu_trainer_take_a_workload(tmp_path):
    out = _dry_run("cpu-study", tmp_path, WORKLOAD="humanoid", STATE=str(tmp_path / "s"))
    study = [x for x in out.stdout.splitlines() if x.startswith("-m autotune.cli study")]
    assert len(study) == 1, out.stdout + out.stderr
    assert "--env Humanoid-v5" in study[0] and "--study humanoid-study-cpu" in study[0]
    assert "--knob trainer_device=cpu" in study[0]
    assert "--knob trainer_precision=fp32" in study[0]
    out = _dry_run("cpu-study", tmp_path, STATE=str(tmp_path / "s"), PRECISIONS="fp32,bf16")
    assert "--knob trainer_precision=fp32,bf16" in out.stdout
    out = _dry_run("cpu-trainer", tmp_path)  # Ant by default, its export from cpu-study
    run = [x for x in out.stdout.splitlines() if x.startswith("-m bench.compare run")]
    assert len(run) == 1 and "--env Ant-v5" in run[0]
    assert f"cpu={tmp_path}/cpu-study/ant-export-cpu.json" in run[0]
