"""The tuner's view of a running job (``autotune.tuning.runner_job``): how much time the job has
left, whether another trial could still pay back, and its start config's knob values."""

from __future__ import annotations

import pytest

from autotune.tuning.runner_job import remaining_s
from autotune.tuning.tuner_rules import endgame
from runtime.config import TrainConfig


def test_the_end_of_job_rule_counts_a_trials_whole_length():
    """A trial's length runs from its change to its window's end: a GMI hand-over's start-up
    counts: with trials of 34, 34, 40 and 64 s (the median 40) and 69 s left, no new trial."""
    assert endgame(69.0, [34.0, 64.0, 34.0, 40.0])
    assert not endgame(100.0, [34.0, 64.0, 34.0, 40.0])
    assert not endgame(None, [34.0]) and not endgame(5.0, [])


def test_a_runs_time_left_is_its_nearer_end():
    walled = TrainConfig(steps=1_000_000, max_wall_s=300.0)
    assert remaining_s(walled, 100.0, 0) == 200.0  # nothing trained: the wall alone
    assert remaining_s(walled, 100.0, 900_000) == pytest.approx(100.0 / 9)  # the steps first
    assert remaining_s(walled, 400.0, 10) == 0.0
    assert remaining_s(TrainConfig(steps=1_000_000), 10.0, 0) is None  # nothing says yet
    assert remaining_s(TrainConfig(steps=1_000_000), 10.0, 500_000) == 10.0


def test_a_config_left_to_auto_starts_the_tuner_on_the_device_it_runs():
    """``trainer_device`` auto is the tuner's start config as it runs (cuda with a GPU, else
    cpu): a value among the knob's choices, so the start config is measured first."""
    from autotune.tuning.knobs import Machine, build_space
    from autotune.tuning.runner_job import knob_values
    from runtime.config import TrainConfig

    cfg = TrainConfig(env="CartPole-v1", trainer_device="auto", mps_pct=None)
    for gpus, device in ((0, "cpu"), (1, "cuda")):
        space = build_space(
            Machine(cores=8, gpus=gpus), ["trainer_device=cpu,cuda"] if gpus else []
        )
        got = knob_values(cfg, {"trainer_device": None, "mps_pct": None}, cuda=bool(gpus))
        assert got == {"trainer_device": device, "mps_pct": 100}
        if gpus:
            assert got["trainer_device"] in space["trainer_device"].choices


def test_an_update_trains_the_batch_of_every_trainer_gmi():
    """Trainer GMIs train in lockstep, their gradients averaged: one update trains a batch for
    each, the lump a window's trained steps arrive in and the batch goodput weighs."""
    from autotune.tuning.model_inputs import update_samples
    from autotune.tuning.runner_job import update_steps

    cfg = TrainConfig(env="CartPole-v1", batch_size=4096, trainers=2, trainer_device="cuda")
    assert update_steps(cfg) == 8192
    assert (
        update_steps(
            TrainConfig(
                env="CartPole-v1", batch_size=4096, trainers=2, gpus=(0, 1), trainer_device="cuda"
            )
        )
        == 16384
    )
    assert update_steps(TrainConfig(env="CartPole-v1", batch_size=512, trainer_device="cpu")) == 512
    assert update_samples({"batch_size": 4096, "trainers": 4}) == 16384
    assert update_samples({"batch_size": 4096}) == 4096 and update_samples({}) is None
