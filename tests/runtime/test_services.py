"""The runner's service processes: a dead compressor, migrator, trainer or inference GMI is
replaced and the run finishes exact; a stuck one is killed and replaced; too many deaths end the
run with an error that names the process."""

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


def _stopped_once(marker: str, *args) -> None:
    """The migrator, stopped (SIGSTOP) before its first report the first time it starts."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)
    from runtime.stages.migrator import migrator_main

    migrator_main(*args)


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
def test_with_an_inference_gmi_a_killed_trainer_and_a_killed_inference_gmi_are_replaced():
    """With ``inference='gmi'``: a trainer's death replaces the inference GMI as well (it held
    weights newer than the recovered ones), and the inference GMI's own death replaces it with
    the pipeline and the actors; the run drains exact."""
    from runtime.gmi.role import recovery_file

    cfg = TrainConfig(
        steps=10**9, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512, inference="gmi"
    )
    victims = ["trainer-0.g0", "inference"]
    at_kill: list[int] = []
    runner: Runner

    def fault(state):
        if runner.supervisor.busy or state.trained_steps < (at_kill[-1] if at_kill else 0) + 1_536:
            return
        if len(at_kill) == len(victims):
            runner.stop_requested = True
        elif os.path.exists(recovery_file(runner.run_dir)):
            os.kill(dict(runner.services.items())[victims[len(at_kill)]].pid, signal.SIGKILL)
            at_kill.append(state.trained_steps)

    runner = Runner(cfg, cfg.validate(), on_progress=fault)
    result = runner.run()
    assert [r["process"] for r in result["service_replacements"]] == victims
    assert result["env_steps"] >= at_kill[-1] + 1_536 and result["failure"] is None
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    )
    assert result["lost_steps"] >= 0
    assert result["inference"]["requests"] > 0  # the last inference GMI answered the actors


def test_pipeline_replacements_back_off_and_stop_at_the_limit():
    """Each death within the window doubles the wait before the replacement; the LIMIT-th
    ends the run's supervision of the pipeline with a reason (the run then stops, drained)."""
    from runtime import supervisor as sup_mod

    sup = sup_mod.Supervisor(None, None, None, None, lambda: (1, 1.0))
    waits = []
    for _ in range(sup_mod.LIMIT - 1):
        before = time.monotonic()
        sup._died("compressor", -9)
        waits.append(sup._due - before)
        sup._dead = sup._due = None  # as after a replacement
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8], abs=0.05)
    assert sup.failure is None
    sup._died("migrator", 1)
    assert sup.failure and "5th time within 60 s" in sup.failure and sup._due is None


@pytest.mark.slow
def test_the_compressor_killed_the_migrator_stuck_and_a_trainer_killed_are_replaced(monkeypatch):
    """One run, three faults, each once the run has trained on after the previous: the
    compressor SIGKILLed, then the migrator SIGSTOPped (reported as stalled, then killed as
    stuck), then the trainer GMI SIGKILLed (once it has a recovery state). Each is replaced
    (the pipeline with every actor; the trainer as a new generation from the lead GMI's
    recovery state, so the learner's version does not start over), and the run drains with the
    step accounting exact."""
    from runtime import supervisor, telemetry
    from runtime.gmi.role import recovery_file

    monkeypatch.setattr(telemetry, "STALL_S", 1.0)
    monkeypatch.setattr(supervisor, "STALL_KILL_S", 3.0)
    cfg = TrainConfig(steps=10**9, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512)
    faults = [("compressor", signal.SIGKILL), ("migrator", signal.SIGSTOP)]
    faults.append(("trainer-0.g0", signal.SIGKILL))
    at_fault: list[int] = []
    runner: Runner

    def fault(state):
        if (
            runner.supervisor.busy
            or state.trained_steps < (at_fault[-1] if at_fault else 0) + 2_048
        ):
            return  # the last replacement is not settled, or too little trained since
        if len(at_fault) == len(faults):
            runner.stop_requested = True  # drains, as Ctrl-C does
            return
        victim, sig = faults[len(at_fault)]
        if victim.startswith("trainer") and not os.path.exists(recovery_file(runner.run_dir)):
            return
        if len(runner.supervisor.replacements) < len(at_fault):
            return  # the stuck migrator is not replaced yet
        os.kill(dict(runner.services.items())[victim].pid, sig)
        at_fault.append(state.trained_steps)

    runner = Runner(cfg, cfg.validate(), on_progress=fault)
    result = runner.run()
    replaced = result["service_replacements"]
    assert [r["process"] for r in replaced] == [v for v, _ in faults]
    assert {r["exit_code"] for r in replaced} == {-signal.SIGKILL}
    (stall,) = [s for s in result["stalls"] if s["process"] == "migrator"]
    assert stall["killed"] and stall["silent_s"] >= 3.0
    assert runner.trainer_names() == ["trainer-0.g1"] and result["failure"] is None
    assert [p["generation"] for p in result["phases"]] == [0, 1]  # the new one opened a phase
    assert result["env_steps"] >= at_fault[-1] + 2_048  # it trained on after the last fault
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    )
    assert result["lost_steps"] >= 0
    assert runner.restarts == 0  # the actors were replaced, not counted as deaths
    # the new generation went on from a saved state: more updates than it made itself
    new = runner.telemetry.source("trainer-0.g1")
    assert new["version"] > new["trained_steps"] // cfg.batch_size


@pytest.mark.slow
def test_a_compressor_that_keeps_dying_ends_the_run_with_an_error_and_a_failed_result():
    """Killed again as soon as each replacement is up: the fifth death within a minute ends the
    run with an error whose result says why, with the counts so far and nothing left running."""
    cfg = TrainConfig(steps=10**9, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512)
    kills: list[int] = []
    runner: Runner

    def kill_again(state):
        proc = dict(runner.services.items())["compressor"]
        replaced = len(kills) == len(runner.supervisor.replacements)  # the last one is up
        if state.trained_steps >= 1_000 and replaced and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            kills.append(proc.pid)

    runner = Runner(cfg, cfg.validate(), on_progress=kill_again)
    with pytest.raises(RunError, match=r"compressor died .* for the 5th time within 60 s") as err:
        runner.run()
    assert len(kills) == 5 and len(runner.supervisor.replacements) == 4
    failed = err.value.result
    assert failed["failed"] and "5th time" in failed["failure"]
    assert len(failed["service_replacements"]) == 4
    assert failed["sampled_steps"] == (
        failed["env_steps"] + failed["discarded_steps"] + failed["lost_steps"]
    )
    assert not any(p.is_alive() for p in runner.services.values())
    assert not any(s.process.is_alive() for s in runner.slots)


@pytest.mark.slow
def test_a_migrator_stopped_before_its_first_report_is_killed_and_replaced(monkeypatch, tmp_path):
    """A stage that hangs as it starts, before it has reported once, is seen as stalled once
    ``STALL_S + START_S`` have passed since it was started, killed as stuck and replaced; the
    run then trains to its target with the step accounting exact."""
    import functools

    from runtime import supervisor, telemetry

    monkeypatch.setattr(telemetry, "STALL_S", 1.0)
    monkeypatch.setattr(supervisor, "STALL_KILL_S", 3.0)
    stopped = functools.partial(_stopped_once, str(tmp_path / "stopped"))
    monkeypatch.setattr(supervisor, "migrator_main", stopped)
    cfg = TrainConfig(steps=4_096, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512)
    result = Runner(cfg, cfg.validate()).run()
    assert (tmp_path / "stopped").exists()
    assert [r["process"] for r in result["service_replacements"]] == ["migrator"]
    (stall,) = [s for s in result["stalls"] if s["process"] == "migrator"]
    assert stall["killed"] and stall["silent_s"] >= 1.0 + telemetry.START_S
    assert result["failure"] is None and result["env_steps"] >= cfg.steps
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    )
