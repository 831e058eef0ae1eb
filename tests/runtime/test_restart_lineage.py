"""A trainer generation restarted in place of a dead one goes on from the learner state kept
that has come furthest (the recovery file, a hand-over file, the file the dead generation
started from, or the run's checkpoint), whatever the files' times; a checkpoint is never taken
back to an older learner; and the trained steps a restart rolls back are said, not counted as
learned."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pytest
import torch

from runtime import checkpoint, wire
from runtime.checkpoint import Resume
from runtime.config import TrainConfig
from runtime.gmi.fleet import GMIFleet
from runtime.gmi.role import recovery_file, state_file
from runtime.learner_state import Saved
from runtime.runner import Runner
from runtime.supervisor import Supervisor
from runtime.telemetry import RunTelemetry


def state_of(trained_steps: int, version: int) -> dict:
    """A learner ``state()``'s shape, with a one-tensor model."""
    return {
        "model": {"w": torch.full((2,), float(version))},
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3}]},
        "version": version,
        "trained_steps": trained_steps,
    }


def put(path, trained_steps: int, version: int, mtime: float) -> str:
    """Writes a learner state file as a GMI does, dated ``mtime``."""
    torch.save(state_of(trained_steps, version), str(path))
    os.utime(path, (mtime, mtime))
    return str(path)


class Fleet(GMIFleet):
    """A fleet whose GMI processes are recorded, not started."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.resumed_from: list[str | None] = []
        spawn = lambda name, target, args: self.resumed_from.append(args[3].resume_from)  # noqa: E731
        super().__init__(cfg, cfg.validate(), spawn)


def fleet_for(tmp_path, **over) -> Fleet:
    cfg = TrainConfig(env="CartPole-v1", trainer_device="cpu", trainers=1, **over)
    return Fleet(cfg)


def test_a_restart_goes_on_from_a_checkpoint_newer_than_the_recovery_file(tmp_path):
    """The checkpoint (saved every ``checkpoint_every_s``) holds version 10; the recovery file
    (every 10 s) version 6, written later by the file times: the restart takes version 10."""
    run_dir, ck = tmp_path / "run", tmp_path / "ck"
    run_dir.mkdir()
    fleet = fleet_for(tmp_path, checkpoint=str(ck))
    info = fleet.info
    fleet.start(None, str(run_dir), None)
    checkpoint.save(str(ck), state_of(5120, 10), fleet.cfg, info)
    os.utime(ck / checkpoint.STATE_NAME, (1_000, 1_000))
    put(recovery_file(str(run_dir)), 3072, 6, mtime=2_000)
    saved = fleet.restart(None, str(run_dir), None)
    assert fleet.resumed_from[-1] == str(ck / checkpoint.STATE_NAME)
    assert saved == Saved(str(ck / checkpoint.STATE_NAME), 10, 5120)
    assert fleet.generation == 1


def test_a_generation_that_dies_before_its_first_recovery_save_is_not_taken_back(tmp_path):
    """Generation 1 took over version 10 from generation 0's hand-over and died before it kept
    a recovery state; the recovery file still holds generation 0's version 6, the newest file.
    Its replacement goes on from version 10, and so does the one after it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fleet = fleet_for(tmp_path)
    put(recovery_file(str(run_dir)), 3072, 6, mtime=2_000)
    handover = put(state_file(str(run_dir), 0), 5120, 10, mtime=1_000)
    fleet.generation = 1
    fleet.start(None, str(run_dir), handover)
    assert fleet.restart(None, str(run_dir), None) == Saved(handover, 10, 5120)  # generation 2
    assert fleet.restart(None, str(run_dir), None) == Saved(handover, 10, 5120)  # generation 3
    assert fleet.resumed_from == [handover] * 3
    put(recovery_file(str(run_dir)), 6144, 12, mtime=500)  # generation 3 kept one, then died
    assert fleet.restart(None, str(run_dir), None).version == 12


def test_equally_far_states_take_the_one_written_last_and_a_broken_file_is_skipped(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fleet = fleet_for(tmp_path)
    fleet.generation = 1
    older = put(state_file(str(run_dir), 0), 5120, 10, mtime=1_000)
    newer = put(recovery_file(str(run_dir)), 5120, 10, mtime=2_000)
    assert fleet.restart(None, str(run_dir), None).path == newer
    (run_dir / "recovery.pt").write_bytes(b"cut short")
    assert fleet.restart(None, str(run_dir), older).path == older
    empty = fleet_for(tmp_path)
    assert empty.restart(None, str(tmp_path / "none"), None) is None  # a fresh learner
    assert empty.resumed_from == [None]


def test_a_save_never_takes_a_checkpoint_back_to_an_older_learner(tmp_path, caplog):
    ck = tmp_path / "ck"
    cfg = TrainConfig(env="CartPole-v1", checkpoint=str(ck))
    info = cfg.validate()
    assert checkpoint.save(str(ck), state_of(5120, 10), cfg, info)
    files = {n: (ck / n).read_bytes() for n in (checkpoint.STATE_NAME, checkpoint.INFO_NAME)}
    with caplog.at_level("WARNING"):
        assert not checkpoint.save(str(ck), state_of(3072, 6), cfg, info)
    assert "holds the learner at version 10 (5120 trained steps)" in caplog.text
    assert "not overwritten with the older state" in caplog.text
    assert {n: (ck / n).read_bytes() for n in files} == files
    assert checkpoint.save(str(ck), state_of(5120, 10), cfg, info)  # as far: written again
    # learner.json one save behind learner.pt: learner.pt's own counts are what it holds
    behind = (ck / checkpoint.INFO_NAME).read_text()
    assert checkpoint.save(str(ck), state_of(6144, 12), cfg, info)
    (ck / checkpoint.INFO_NAME).write_text(behind)
    assert checkpoint.saved_key(str(ck)) == (12, 6144)
    assert not checkpoint.save(str(ck), state_of(5632, 11), cfg, info)
    assert checkpoint.load_state(str(ck / checkpoint.STATE_NAME))["version"] == 12
    (ck / checkpoint.STATE_NAME).write_bytes(b"not a learner")  # replaced by a good save
    assert checkpoint.save(str(ck), state_of(5632, 11), cfg, info)


def report(tel: RunTelemetry, source: str, trained: int) -> None:
    tel.handle(wire.Message(wire.MsgType.STATS, {"src": source, "c": {"trained_steps": trained}}))


def test_rolled_back_steps_are_not_counted_as_learned():
    tel = RunTelemetry()
    report(tel, "trainer-0.g0", 5000)
    assert tel.roll_back(3000) == 2000  # the state restarted from holds 3000 of them
    assert (tel.trained_steps, tel.learned_steps, tel.rolled_back_steps) == (5000, 3000, 2000)
    report(tel, "trainer-0.g1", 1000)
    assert (tel.trained_steps, tel.learned_steps) == (6000, 4000)
    # a state that holds 200 steps trained but not yet reported when its trainer died
    assert tel.roll_back(4200) == 0
    report(tel, "trainer-0.g2", 500)
    assert (tel.trained_steps, tel.learned_steps, tel.rolled_back_steps) == (6500, 4700, 2000)
    assert tel.roll_back(0) == 4700  # a fresh learner: nothing of this run is held
    assert (tel.learned_steps, tel.rolled_back_steps) == (0, 6700)


def test_a_report_still_on_its_way_from_a_stopped_generation_is_not_counted():
    # two GMIs; one dies, the other is stopped with it, and the restart's state holds 8,000 of
    # their 10,000 trained steps: a report the survivor sent before it was stopped, read after
    # the roll-back, must not count 1,000 steps as learned that no learner holds
    tel = RunTelemetry()
    report(tel, "trainer-0.g0", 5000)
    report(tel, "trainer-1.g0", 5000)
    tel.retire(["trainer-0.g0", "trainer-1.g0"])
    assert tel.roll_back(8000) == 2000
    report(tel, "trainer-1.g0", 6000)
    assert (tel.trained_steps, tel.learned_steps, tel.rolled_back_steps) == (10_000, 8000, 2000)
    report(tel, "trainer-0.g1", 700)  # the new generation's count
    assert (tel.trained_steps, tel.learned_steps) == (10_700, 8700)


class Generations:
    def __init__(self, fleet) -> None:
        self.fleet, self.restarted_at = fleet, []

    def restarted(self, trained: int) -> None:
        self.restarted_at.append(trained)


class RestartingFleet:
    generation = 0

    def __init__(self, saved: Saved | None) -> None:
        self.saved, self.fallbacks = saved, []

    def restart(self, ep, run_dir, fallback):
        self.fallbacks.append(fallback)
        return self.saved


def test_a_resumed_run_rolls_back_what_its_restart_state_does_not_hold():
    """The run went on from a checkpoint of 10,000 trained steps; its trainers reported 5,000
    more, and the restart goes on from a state of 13,000: 2,000 are rolled back."""
    tel = RunTelemetry()
    report(tel, "trainer-0.g0", 5000)
    fleet = RestartingFleet(Saved("ck/learner.pt", 25, 13_000))
    gens = Generations(fleet)
    sup = Supervisor(None, None, tel, gens, lambda: (1, 1.0), Resume("ck/learner.pt", 10_000, 20))
    assert sup._restart_trainers(None) == {
        "resumed_from": {"path": "ck/learner.pt", "version": 25, "trained_steps": 13_000},
        "rolled_back_steps": 2000,
    }
    assert fleet.fallbacks == ["ck/learner.pt"] and gens.restarted_at == [5000]
    assert (tel.learned_steps, tel.rolled_back_steps) == (3000, 2000)


def _saved_version(ck) -> int | None:
    try:
        return json.loads((ck / checkpoint.INFO_NAME).read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def _killed_run(ck, checkpoint_every_s: float) -> TrainConfig:
    """A small CPU run, saving into ``ck``, whose trainer the tests below SIGKILL."""
    return TrainConfig(
        steps=10**9,
        actors=2,
        envs_per_actor=4,
        rollout_len=16,
        batch_size=512,
        trainer_device="cpu",
        checkpoint=str(ck),
        checkpoint_every_s=checkpoint_every_s,
    )


@pytest.mark.slow
def test_a_killed_trainer_goes_on_from_the_newer_checkpoint_and_what_it_lost_is_rolled_back(
    tmp_path,
):
    """Once the checkpoint (every 0.5 s) is 3 versions past the recovery file (every 10 s),
    the trainer GMI is SIGKILLed. Its replacement goes on from the checkpoint's version or
    later; the checkpoint is never saved older again; the steps the old generation trained
    beyond the state restarted from are ``rolled_back_steps``, not ``env_steps``; and the final
    checkpoint holds exactly the run's ``env_steps``."""
    ck = tmp_path / "ck"
    cfg = _killed_run(ck, checkpoint_every_s=0.5)
    marks: dict[str, int] = {}
    recovery: dict[str, float | int] = {}
    after_kill: list[int] = []
    runner: Runner

    def recovery_version() -> int | None:
        path = recovery_file(runner.run_dir)
        if not os.path.exists(path):
            return None
        if recovery.get("mtime") != os.path.getmtime(path):  # loaded again only when rewritten
            recovery["mtime"] = os.path.getmtime(path)
            recovery["version"] = checkpoint.load_state(path)["version"]
        return int(recovery["version"])

    def fault(state) -> None:
        if "version" not in marks:
            rec, saved = recovery_version(), _saved_version(ck)
            if rec is not None and saved is not None and saved >= rec + 3:
                os.kill(dict(runner.services.items())["trainer-0.g0"].pid, signal.SIGKILL)
                marks.update(version=saved, learned=state.trained_steps)
            return
        if (saved := _saved_version(ck)) is not None:
            after_kill.append(saved)
        new = runner.telemetry.source("trainer-0.g1").get("trained_steps", 0)
        if not runner.supervisor.busy and runner.supervisor.replacements and new >= 2048:
            runner.stop_requested = True  # drains, as Ctrl-C does

    runner = Runner(cfg, cfg.validate(), on_progress=fault)
    result = runner.run()
    assert min(after_kill) >= marks["version"], (after_kill, marks)  # never saved older
    saved = result["checkpoint"]
    assert saved["saved_steps"] == result["env_steps"]  # the learner holds what is counted
    assert saved["saved_version"] == result["updates"]
    (replaced,) = result["service_replacements"]
    assert replaced["process"] == "trainer-0.g0"
    assert replaced["resumed_from"]["version"] >= marks["version"]
    assert result["rolled_back_steps"] == replaced["rolled_back_steps"] >= 0
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    )
    assert result["lost_steps"] >= result["rolled_back_steps"]  # lost to the learner
    reported = sum(g["trained_steps"] for g in result["gmis"])
    assert result["env_steps"] + result["rolled_back_steps"] >= reported
    assert result["failure"] is None and runner.trainer_names() == ["trainer-0.g1"]


@pytest.mark.slow
def test_steps_trained_past_the_recovery_state_are_rolled_back_and_the_budget_goes_on(tmp_path):
    """Without a newer state kept, the trainer GMI is SIGKILLed once it has reported 4,096
    steps past its recovery state: the new generation goes on from the recovery state, those
    steps are ``rolled_back_steps`` (not ``env_steps``), the step budget counts what the learner
    holds (it trains them again), and the checkpoint saved at the end holds exactly
    ``env_steps``."""
    cfg = _killed_run(tmp_path / "ck", checkpoint_every_s=10**6)  # saved at the end only
    marks: dict[str, int] = {}
    runner: Runner

    def fault(state) -> None:
        tel = runner.telemetry
        if "recovered" not in marks:
            path = recovery_file(runner.run_dir)
            done = tel.source("trainer-0.g0").get("trained_steps", 0)
            if not os.path.exists(path):  # kept from the first update: never 2 batches without
                marks["unsaved_at"] = max(marks.get("unsaved_at", 0), done)
                return
            held = checkpoint.load_state(path)["trained_steps"]
            if done >= held + 4096:
                proc = dict(runner.services.items())["trainer-0.g0"]
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(30)  # what it kept is final now
                marks.update(recovered=checkpoint.load_state(path)["trained_steps"])
        elif "steps" not in marks and runner.supervisor.replacements:
            # the budget: 4,096 steps past what the old generation trained, all learned
            marks["steps"] = tel.source("trainer-0.g0")["trained_steps"] + 4096
            runner.cfg = dataclasses.replace(runner.cfg, steps=marks["steps"])

    runner = Runner(cfg, cfg.validate(), on_progress=fault)
    result = runner.run()
    assert marks.get("unsaved_at", 0) < 2 * cfg.batch_size
    (replaced,) = result["service_replacements"]
    assert replaced["resumed_from"]["trained_steps"] == marks["recovered"]
    old = runner.telemetry.source("trainer-0.g0")["trained_steps"]
    assert result["rolled_back_steps"] == old - marks["recovered"] > 0
    reported = sum(g["trained_steps"] for g in result["gmis"])
    assert result["env_steps"] == reported - result["rolled_back_steps"]
    assert result["env_steps"] >= marks["steps"]  # trained to the budget, rolled back not in it
    assert result["checkpoint"]["saved_steps"] == result["env_steps"]
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    )
    assert result["lost_steps"] >= result["rolled_back_steps"]
