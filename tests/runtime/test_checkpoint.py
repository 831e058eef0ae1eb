"""``TrainConfig.checkpoint``: a run saves the learner, the next one goes on from it (the step
budget, the version and the weights carry over; stale experience is discarded, not trained on),
and checkpoints that cannot be resumed are refused before anything starts."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
import torch

from runtime import checkpoint
from runtime.config import ConfigError, TrainConfig
from runtime.runner import Runner


def cfg_for(directory, **over) -> TrainConfig:
    base = {
        "steps": 4096,
        "actors": 2,
        "envs_per_actor": 4,
        "rollout_len": 16,
        "batch_size": 512,
        "checkpoint": str(directory),
    }
    return TrainConfig(**{**base, **over})


def state_of(trained_steps: int, version: int) -> dict:
    """A learner ``state()``'s shape, with a one-tensor model."""
    return {
        "model": {"w": torch.zeros(2)},
        "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999)}]},
        "version": version,
        "trained_steps": trained_steps,
    }


@pytest.mark.slow
def test_a_second_run_goes_on_from_the_first_and_loses_nothing(tmp_path):
    ck = tmp_path / "ck"
    first_cfg = cfg_for(ck)
    first = Runner(first_cfg, first_cfg.validate()).run()
    saved = json.loads((ck / checkpoint.INFO_NAME).read_text())
    assert saved["trained_steps"] == first["env_steps"] >= 4096
    assert saved["version"] == first["updates"] > 0
    assert first["checkpoint"]["resumed_from_steps"] == 0
    assert [g["resumed"] for g in first["gmis"]] == [False]  # a fresh run resumed nothing
    assert [g["floor_version"] for g in first["gmis"]] == [0]
    state = torch.load(ck / checkpoint.STATE_NAME, weights_only=False)
    assert state["trained_steps"] == saved["trained_steps"]

    kept = json.loads((ck / checkpoint.RETURNS_NAME).read_text())
    assert kept["trained_steps"] == saved["trained_steps"] and kept["episodes"] == first["episodes"]
    assert len(kept["returns"]) == min(100, first["episodes"]) > 0
    assert sum(kept["returns"]) / len(kept["returns"]) == pytest.approx(first["return_mean"])
    # the run's seconds and joules, for the target figures and progress of the runs after it
    first_j = first["energy"]["gpu_j"] + first["energy"]["cpu_j"]
    assert 0 < kept["totals"]["joules"] <= first_j + 1e-6
    assert 0 < kept["totals"]["seconds"] <= first["wall_s"]
    assert set(state["noise"]) == {"g2", "s"}  # the noise scale's averages go on too

    second_cfg = cfg_for(ck, steps=saved["trained_steps"] + 4096)
    ticks, joules = [], []
    runner = Runner(second_cfg, second_cfg.validate())
    runner.on_progress = lambda t: (ticks.append(t), joules.append(runner.joules_so_far()))
    assert runner.resumed_steps == saved["trained_steps"]
    # the return window goes on from the first run's episodes
    assert list(runner.telemetry.returns) == kept["returns"]
    assert runner.resumed_episodes == first["episodes"]
    assert runner.target.before.joules == kept["totals"]["joules"]
    second = runner.run()
    # progress counts the joules of both runs
    assert all(j >= kept["totals"]["joules"] for j in joules)
    assert joules[-1] > kept["totals"]["joules"]
    assert second["sampled_steps"] == (
        second["env_steps"] + second["discarded_steps"] + second["lost_steps"]
    )
    assert second["lost_steps"] == 0
    # the budget counts both runs: this one stopped sampling at the first tick that saw the
    # 4096 steps left of it trained (the drain then trains what was in flight, more on a
    # loaded machine, so the final count is no test of the budget)
    assert second["env_steps"] >= 4096
    past = [t.trained_steps for t in ticks if not t.draining and t.trained_steps >= 4096]
    assert len(past) == 1, (past, saved)
    assert [g["resumed"] for g in second["gmis"]] == [True]
    # experience sampled with the actors' fresh weights, older than the loaded learner, is
    # discarded in every generation of the resumed run (each GMI is given the floor)
    assert runner.fleet.floor_version == saved["version"]
    assert [g["floor_version"] for g in second["gmis"]] == [saved["version"]]
    doc = second["checkpoint"]
    assert doc["resumed_from_steps"] == saved["trained_steps"]
    assert doc["resumed_from_version"] == saved["version"]
    assert doc["saved_steps"] == saved["trained_steps"] + second["env_steps"]
    assert doc["saved_version"] == second["learner_version"] > saved["version"]
    assert second["updates"] == second["learner_version"] - saved["version"]  # this run's


def test_unresumable_checkpoints_are_refused_before_the_run(tmp_path):
    ck = tmp_path / "ck"
    cfg = cfg_for(ck, env="CartPole-v1")
    info = cfg.validate()
    assert checkpoint.check(cfg, info) is None  # nothing saved yet: a fresh start
    checkpoint.save(str(ck), state_of(5000, 9), cfg, info)
    with pytest.raises(ConfigError, match="already holds 5000 trained steps"):
        checkpoint.check(cfg, info)  # steps=4096 < 5000
    other = dataclasses.replace(cfg, env="Pendulum-v1", steps=10_000)
    with pytest.raises(ConfigError, match="saved with env='CartPole-v1', this run has"):
        Runner(other, other.validate())
    resume = checkpoint.check(dataclasses.replace(cfg, steps=10_000), info)
    assert resume == checkpoint.Resume(str(ck / checkpoint.STATE_NAME), 5000, 9)
    (ck / checkpoint.INFO_NAME).unlink()
    with pytest.raises(ConfigError, match="holds only one of"):
        checkpoint.check(dataclasses.replace(cfg, steps=10_000), info)
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="is a file; give a directory"):
        checkpoint.check(cfg_for(a_file), info)
    assert "checkpoint='': must be a directory path" in str(TrainConfig(checkpoint="").problems())
    with pytest.raises(ConfigError, match="f is a file; give a directory to save in"):
        checkpoint.check(cfg_for(a_file / "ck"), info)  # found now, not at the first save
    # resumed with a target its last 100 episodes already meet: nothing would be trained
    checkpoint.save(str(ck), state_of(5000, 9), cfg, info)
    checkpoint.save_returns(str(ck), [70.0] * 100, 100)
    met = dataclasses.replace(cfg, steps=10_000, target_return=60.0)
    with pytest.raises(ConfigError, match="already average 70 >= target_return=60"):
        checkpoint.check(met, info)
    assert checkpoint.check(dataclasses.replace(met, target_return=80.0), info) is not None
    # a window edited by hand, or written by another tool, is read as none: the run resumes
    doc = json.loads((ck / checkpoint.RETURNS_NAME).read_text())
    (ck / checkpoint.RETURNS_NAME).write_text(json.dumps({**doc, "returns": [70.0] * 99 + ["x"]}))
    assert checkpoint.check(met, info) == resume


def test_a_json_one_save_behind_its_state_resumes_from_the_state(tmp_path, caplog):
    """A stop between the two renames of ``save`` leaves the new ``learner.pt`` beside the
    previous ``learner.json``: the digest shows it and the counts come from ``learner.pt``."""
    ck = tmp_path / "ck"
    cfg = cfg_for(ck, env="CartPole-v1", steps=10_000)
    info = cfg.validate()
    checkpoint.save(str(ck), state_of(3000, 4), cfg, info)
    behind = (ck / checkpoint.INFO_NAME).read_text()
    checkpoint.save(str(ck), state_of(5000, 9), cfg, info)
    assert checkpoint.check(cfg, info).trained_steps == 5000
    checkpoint.save_returns(str(ck), [1.0, 3.0], episodes=7)
    assert checkpoint.load_returns(str(ck), 5000) == ([1.0, 3.0], 7)
    assert checkpoint.load_returns(str(ck), 3000) == ([], 0)  # another save's window
    assert not list(ck.glob("*.tmp"))
    (ck / checkpoint.INFO_NAME).write_text(behind)  # as if stopped before the second rename
    with caplog.at_level("WARNING"):
        resume = checkpoint.check(cfg, info)
    assert (resume.trained_steps, resume.version) == (5000, 9)
    assert "one save behind" in caplog.text
    (ck / checkpoint.STATE_NAME).write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match=r"not describe learner\.pt, and learner\.pt is unread"):
        checkpoint.check(cfg, info)


class _Crafted:
    """Pickles as a call of ``open(path, "w")``: loading it with pickle would create ``path``."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_crafted_learner_file_is_refused_and_nothing_in_it_runs(tmp_path):
    ck, marker = tmp_path / "ck", tmp_path / "ran"
    cfg = cfg_for(ck, env="CartPole-v1", steps=10_000)
    info = cfg.validate()
    checkpoint.save(str(ck), state_of(3000, 4), cfg, info)
    state = ck / checkpoint.STATE_NAME
    torch.save({**state_of(3000, 4), "model": _Crafted(marker)}, state)
    # its learner.json describes it (the attacker wrote both) ...
    doc = json.loads((ck / checkpoint.INFO_NAME).read_text())
    doc["state_sha256"] = checkpoint._sha256(str(state))
    (ck / checkpoint.INFO_NAME).write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="not a learner state that loads as tensors"):
        checkpoint.check(cfg, info)
    # ... or not (its counts are then read from the file itself)
    doc["state_sha256"] = "0" * 64
    (ck / checkpoint.INFO_NAME).write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="unreadable"):
        checkpoint.check(cfg, info)
    with pytest.raises(checkpoint.StateError, match="it was not loaded"):
        checkpoint.load_state(str(state))  # as a trainer taking over would read it
    assert not marker.exists()
    torch.save({"model": {}, "version": 4}, state)  # loads, but is not a learner state
    with pytest.raises(checkpoint.StateError, match="optimizer, trained_steps missing"):
        checkpoint.load_state(str(state))


def test_a_learner_file_changed_after_its_save_is_refused_not_resumed(tmp_path):
    """A digest mismatch is a save the json has not caught up with only where the file has
    come further; a file as far or behind was changed after it was saved. A damaged file
    whose unpickler fails in any way is refused with what was wrong, not a traceback."""
    ck = tmp_path / "ck"
    cfg = cfg_for(ck, env="CartPole-v1", steps=10_000)
    info = cfg.validate()
    checkpoint.save(str(ck), state_of(3000, 4), cfg, info)
    state = ck / checkpoint.STATE_NAME
    torch.save({**state_of(3000, 4), "model": {"w": torch.ones(2)}}, state)  # other weights
    with pytest.raises(ConfigError, match=r"not a later save \(version 4 against 4\)"):
        checkpoint.check(cfg, info)
    buf = io.BytesIO()
    torch.save(state_of(3000, 4), buf)
    data = bytearray(buf.getvalue())
    failures = set()
    for at in range(0, len(data), 7):  # single bytes flipped across the whole file
        flipped = bytearray(data)
        flipped[at] ^= 0xFF
        state.write_bytes(bytes(flipped))
        try:
            checkpoint.load_state(str(state))
        except checkpoint.StateError:
            failures.add("refused")
    assert failures == {"refused"}  # and nothing else escaped


@pytest.mark.slow
def test_a_killed_run_keeps_what_it_trained_by_its_last_periodic_save(tmp_path):
    """--checkpoint-every: the learner is saved while the run trains, so a SIGKILLed run
    leaves a checkpoint the next run goes on from."""
    import os
    import signal
    import subprocess
    import sys
    import time

    ck = tmp_path / "ck"
    flags = ["--actors", "1", "--envs-per-actor", "4", "--batch-size", "512"]
    flags += ["--trainer-device", "cpu", "--trainers", "1", "--checkpoint", str(ck), "--quiet"]
    cli = [sys.executable, "-m", "autotune.cli", "train"]
    proc = subprocess.Popen(
        [*cli, "--steps", "100000000", *flags, "--checkpoint-every", "0.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline, saved = time.monotonic() + 120, None
    try:
        while saved is None or saved["version"] < 2:  # two saves of a learner that trained
            assert time.monotonic() < deadline, "no periodic save within 120 s"
            assert proc.poll() is None, "the run ended on its own"
            time.sleep(0.2)
            try:
                saved = json.loads((ck / checkpoint.INFO_NAME).read_text())
            except (OSError, ValueError):
                saved = None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    saved = json.loads((ck / checkpoint.INFO_NAME).read_text())
    state = checkpoint.load_state(str(ck / checkpoint.STATE_NAME))
    # (a kill between the two renames of a save leaves learner.pt one save ahead)
    assert state["version"] >= saved["version"] >= 2 and state["trained_steps"] >= 1024
    out = tmp_path / "again.json"
    steps = str(state["trained_steps"] + 2048)
    again = subprocess.run(
        [*cli, "--steps", steps, *flags, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = json.loads(out.read_text())["checkpoint"]["resumed_from_steps"]
    assert resumed == state["trained_steps"]


def test_totals_go_on_only_from_the_save_they_belong_to(tmp_path):
    """Seconds and joules of earlier runs are taken from the save of the steps resumed from;
    a run killed before saving them leaves the target section saying so."""
    from types import SimpleNamespace

    from runtime.target import RunTotals, TargetReturn

    ck = tmp_path / "ck"
    cfg = cfg_for(ck)
    checkpoint.save(str(ck), state_of(100, 1), cfg, cfg.validate())
    checkpoint.save_returns(str(ck), [1.0], 1, {"seconds": 30.0, "joules": 500.0})
    assert checkpoint.load_totals(str(ck), 100) == {"seconds": 30.0, "joules": 500.0}
    assert checkpoint.load_totals(str(ck), 200) is None  # another save's
    before = RunTotals.of(cfg, SimpleNamespace(trained_steps=100))
    target = TargetReturn(10.0, before)
    tel = SimpleNamespace(returns=[20.0] * 100, return_mean=20.0, trained_steps=50)
    assert target.check(tel, 5.0, lambda: 40.0)
    doc = target.doc()
    assert (doc["steps"], doc["seconds"], doc["joules"]) == (150, 35.0, 540.0)
    assert doc["earlier_runs"]["joules"] == 500.0
    unknown = TargetReturn(10.0, RunTotals.of(cfg, SimpleNamespace(trained_steps=200)))
    assert unknown.check(tel, 5.0, lambda: 40.0)
    doc = unknown.doc()
    assert (doc["steps"], doc["seconds"], doc["joules"]) == (250, 5.0, 40.0)
    assert doc["earlier_runs"]["joules"] is None and "not saved" in doc["earlier_runs"]["note"]
    assert unknown.before.through(5.0, 40.0) is None  # saved as unknown, not as this run's


def test_the_cli_refuses_a_checkpoint_of_another_env_before_its_probes(tmp_path):
    import subprocess
    import sys

    ck = tmp_path / "ck"
    cfg = cfg_for(ck, env="CartPole-v1")
    checkpoint.save(str(ck), state_of(5000, 9), cfg, cfg.validate())
    cmd = [sys.executable, "-m", "autotune.cli", "train", "--env", "Acrobot-v1"]
    out = subprocess.run(
        [*cmd, "--steps", "100000", "--checkpoint", str(ck)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "saved with env='CartPole-v1'" in said, said
    assert "probes" not in said  # refused before the machine is probed for sizing


def test_a_directory_another_run_saves_into_is_refused(tmp_path):
    import subprocess
    import sys

    ck = tmp_path / "ck"
    code = f"from runtime import checkpoint; checkpoint._hold({str(ck)!r}); print('held'); input()"
    other = subprocess.Popen(
        [sys.executable, "-u", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout.readline().strip() == "held"  # the other run holds it now
        cfg = cfg_for(ck, env="CartPole-v1")
        with pytest.raises(ConfigError, match="another run is saving into it"):
            checkpoint.check(cfg, cfg.validate())
    finally:
        other.communicate("\n", timeout=60)
    cfg = cfg_for(ck, env="CartPole-v1")
    assert checkpoint.check(cfg, cfg.validate()) is None  # free again once that run ended


def test_a_failed_run_keeps_its_gmis_furthest_state_unless_the_checkpoint_is_further(tmp_path):
    from runtime.learner_state import Saved

    ck, kept = tmp_path / "ck", tmp_path / "recovery.pt"
    cfg = cfg_for(ck, env="CartPole-v1", steps=10_000)
    info = cfg.validate()
    torch.save(state_of(3000, 6), kept)  # the lead GMI's recovery file, in the run directory
    assert checkpoint.keep_furthest(cfg, info, Saved(str(kept), 6, 3000))
    assert checkpoint.check(cfg, info).trained_steps == 3000
    torch.save(state_of(1000, 2), kept)  # behind what the checkpoint holds: not taken back
    assert not checkpoint.keep_furthest(cfg, info, Saved(str(kept), 2, 1000))
    assert checkpoint.check(cfg, info).trained_steps == 3000
    kept.write_bytes(b"damaged")  # said, not raised: the run's own error is the one to see
    assert not checkpoint.keep_furthest(cfg, info, Saved(str(kept), 9, 5000))
    assert not checkpoint.keep_furthest(cfg, info, None)
    assert not checkpoint.keep_furthest(cfg_for(None), info, Saved(str(kept), 9, 5000))


def test_a_failed_run_whose_furthest_state_is_its_checkpoints_own_writes_nothing(tmp_path):
    from runtime.learner_state import Saved

    ck = tmp_path / "ck"
    cfg = cfg_for(ck, env="CartPole-v1", steps=10_000)
    info = cfg.validate()
    checkpoint.save(str(ck), state_of(3000, 6), cfg, info)
    before = (ck / checkpoint.INFO_NAME).stat().st_mtime_ns
    own = Saved(str(ck / checkpoint.STATE_NAME), 6, 3000)
    assert not checkpoint.keep_furthest(cfg, info, own)
    assert (ck / checkpoint.INFO_NAME).stat().st_mtime_ns == before
