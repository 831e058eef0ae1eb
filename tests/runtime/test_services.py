"""The runner's service processes: a service that dies ends the run with an error that names
it, and nothing of the run is left behind."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from runtime.config import TrainConfig
from runtime.runner import Runner
from runtime.services import RunError, Services


def _exit_with(code: int) -> None:
    os._exit(code)


def _sleep() -> None:
    time.sleep(60)


def test_a_service_that_exits_before_its_final_report_is_named_with_its_exit_code():
    services = Services(multiprocessing.get_context("spawn"))
    services.spawn("compressor", _exit_with, (3,))
    services.spawn("migrator", _sleep, ())
    services.procs["compressor"].join(30)
    assert "compressor" in services and not services.all_alive()
    services.check(lambda name: name == "compressor")  # it had reported: a clean exit
    with pytest.raises(RunError, match=r"compressor process died \(exit code 3\)"):
        services.check(lambda name: False)
    services.kill_all()
    assert not any(p.is_alive() for p in services.values())


@pytest.mark.slow
def test_a_migrator_killed_mid_run_ends_the_run_with_an_error_and_no_child_left():
    cfg = TrainConfig(steps=10**9, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512)
    killed = []
    runner: Runner

    def kill_once(state):
        if not killed and state.trained_steps >= 1_000:
            proc = dict(runner.services.items())["migrator"]
            os.kill(proc.pid, signal.SIGKILL)
            killed.append(proc.pid)

    runner = Runner(cfg, cfg.validate(), on_progress=kill_once)
    with pytest.raises(RunError, match=r"migrator process died \(exit code -9\)") as err:
        runner.run()
    assert killed
    assert not any(p.is_alive() for p in runner.services.values())
    assert not any(s.process.is_alive() for s in runner.slots)
    # the error carries what the run had done: nothing trained is unaccounted for
    failed, killed_by_signal = err.value.result, err.value.killed
    assert killed_by_signal and failed["failed"] and "migrator" in failed["failure"]
    assert failed["env_steps"] >= 1_000
    assert failed["sampled_steps"] == (
        failed["env_steps"] + failed["discarded_steps"] + failed["lost_steps"]
    )
    assert failed["lost_steps"] >= 0
