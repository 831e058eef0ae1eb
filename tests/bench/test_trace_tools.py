"""The trace of ``python -m bench end-to-end --trace``: its CPU split, and train_config's --config
handling that it shares with ``autotune train``."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from autotune.cli.main import parse_args
from autotune.cli.train_config import train_config
from bench.trace_run import CpuSplit
from runtime.config import ConfigError


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
