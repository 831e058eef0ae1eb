"""``TrainConfig.checkpoint``: a run saves the learner, the next one goes on from it (the step
budget, the version and the weights carry over; stale experience is discarded, not trained on),
and checkpoints that cannot be resumed are refused before anything starts."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.slow
def test_a_second_run_goes_on_from_the_first_and_loses_nothing(tmp_path):
    ck = tmp_path / "ck"
    first_cfg = cfg_for(ck)
    first = Runner(first_cfg, first_cfg.validate()).run()
    saved = json.loads((ck / checkpoint.INFO_NAME).read_text())
    assert saved["trained_steps"] == first["env_steps"] >= 4096
    assert saved["version"] == first["updates"] > 0
    assert first["checkpoint"]["resumed_from_steps"] == 0
    state = torch.load(ck / checkpoint.STATE_NAME, weights_only=False)
    assert state["trained_steps"] == saved["trained_steps"]

    kept = json.loads((ck / checkpoint.RETURNS_NAME).read_text())
    assert kept["trained_steps"] == saved["trained_steps"] and kept["episodes"] == first["episodes"]
    assert len(kept["returns"]) == min(100, first["episodes"]) > 0
    assert sum(kept["returns"]) / len(kept["returns"]) == pytest.approx(first["return_mean"])

    second_cfg = cfg_for(ck, steps=saved["trained_steps"] + 4096)
    ticks = []
    runner = Runner(second_cfg, second_cfg.validate(), on_progress=ticks.append)
    assert runner.resumed_steps == saved["trained_steps"]
    # the return window goes on from the first run's episodes
    assert list(runner.telemetry.returns) == kept["returns"]
    assert runner.resumed_episodes == first["episodes"]
    second = runner.run()
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
    doc = second["checkpoint"]
    assert doc["resumed_from_steps"] == saved["trained_steps"]
    assert doc["resumed_from_version"] == saved["version"]
    assert doc["saved_steps"] == saved["trained_steps"] + second["env_steps"]
    assert doc["saved_version"] == second["updates"] > saved["version"]


def test_unresumable_checkpoints_are_refused_before_the_run(tmp_path):
    ck = tmp_path / "ck"
    cfg = cfg_for(ck, env="CartPole-v1")
    info = cfg.validate()
    assert checkpoint.check(cfg, info) is None  # nothing saved yet: a fresh start
    state = {"trained_steps": 5000, "version": 9}
    checkpoint.save(str(ck), state, cfg, info)
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


def test_a_json_one_save_behind_its_state_resumes_from_the_state(tmp_path, caplog):
    """A stop between the two renames of ``save`` leaves the new ``learner.pt`` beside the
    previous ``learner.json``: the digest shows it and the counts come from ``learner.pt``."""
    ck = tmp_path / "ck"
    cfg = cfg_for(ck, env="CartPole-v1", steps=10_000)
    info = cfg.validate()
    checkpoint.save(str(ck), {"trained_steps": 3000, "version": 4}, cfg, info)
    behind = (ck / checkpoint.INFO_NAME).read_text()
    checkpoint.save(str(ck), {"trained_steps": 5000, "version": 9}, cfg, info)
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
