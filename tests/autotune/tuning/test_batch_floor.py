"""The batch sizes the tuner tries give the learner's minibatches at least ``MIN_MINIBATCH``
samples each, as the ``auto`` sizing's do; a user's ``--knob batch_size=...`` is kept as given."""

from __future__ import annotations

import pytest
from conftest import mujoco_like_model

from autotune.tuning.knobs import MIN_MINIBATCH, KnobError, Machine, batch_fits, build_space
from autotune.tuning.sizing import candidates

MACHINE = Machine(16, 1)


@pytest.mark.parametrize(("minibatches", "smallest"), [(4, 512), (8, 1024), (32, 4096)])
def test_the_tuned_batch_sizes_start_where_a_minibatch_holds_enough_samples(minibatches, smallest):
    knob = build_space(MACHINE, [], minibatches)["batch_size"]
    assert knob.choices[0] == smallest and knob.choices[-1] == 65536
    assert all(b // minibatches >= MIN_MINIBATCH for b in knob.choices)
    assert knob.online
    # without the learner's count (the offline simulator, the CLI's checks) nothing is dropped
    assert build_space(MACHINE, [])["batch_size"].choices[0] == 512


def test_a_users_batch_sizes_win_over_the_floor():
    knob = build_space(MACHINE, ["batch_size=1024,2048"], 32)["batch_size"]
    assert knob.choices == (1024, 2048) and knob.online
    with pytest.raises(KnobError, match="allowed values are 512, 1024"):
        build_space(MACHINE, ["batch_size=300"], 32)


def test_too_many_minibatches_for_any_batch_leave_the_batch_untuned_saying_why():
    knob = build_space(MACHINE, [], 1024)["batch_size"]
    assert not knob.online
    assert knob.unavailable == (
        "no batch size in 512..65536 gives 1024 minibatches of at least 128 samples"
    )


def test_the_sizing_and_the_tuner_share_one_rule():
    assert batch_fits(4096, 32) and not batch_fits(2048, 32)
    assert not batch_fits(4096, 32, rollout_len=48) and batch_fits(4096, 32, rollout_len=64)
    m = mujoco_like_model()
    sized = {c["batch_size"] for c in candidates(m, 1, {}, m.rollout_len, 32)}
    assert sized == set(build_space(MACHINE, [], 32)["batch_size"].choices)


def test_a_jobs_long_rollouts_raise_the_floor_to_two_trajectories_per_minibatch():
    # 4 minibatches of 128 samples are one 128-step trajectory each at 512: the floor is 1,024
    knob = build_space(MACHINE, [], 4, rollout_len=128)["batch_size"]
    assert knob.choices[0] == 1024 and knob.online
    assert build_space(MACHINE, [], 4, rollout_len=32)["batch_size"].choices[0] == 512
    assert not batch_fits(512, 4, rollout_len=128) and batch_fits(1024, 4, rollout_len=128)
    none = build_space(MACHINE, [], 512, rollout_len=128)["batch_size"]
    assert not none.online
    assert none.unavailable == (
        "no batch size in 512..65536 gives 512 minibatches of at least 128 samples "
        "and 2 rollouts of 128 steps"
    )


def test_with_the_learners_minibatch_floor_smaller_batches_split_into_fewer_minibatches():
    """``--min-minibatch 512`` splits a batch of 2,048 into 4 minibatches of 512 (not 32 of 64),
    so the tuner and the sizing may take it: batches from 512 up, each minibatch at the floor or
    above, as the learner splits them."""
    from policies.appo_config import APPOConfig

    knob = build_space(MACHINE, [], 32, 32, 512)["batch_size"]
    assert knob.choices[0] == 512 and 2048 in knob.choices and knob.online
    learner = APPOConfig(minibatches=32, min_minibatch=512)
    for b in knob.choices:
        m = learner.minibatches_for(b, b // 32)
        assert b // m >= 512 and b // 32 >= 2 * m, (b, m)
    assert batch_fits(2048, 32, 32, min_minibatch=512) and not batch_fits(2048, 32, 32)
    m = mujoco_like_model()
    sized = {c["batch_size"] for c in candidates(m, 1, {}, m.rollout_len, 32, None, 512)}
    assert sized == set(build_space(MACHINE, [], 32, m.rollout_len, 512)["batch_size"].choices)
    # a floor below the tuner's own minimum leaves the tuner's minimum in force
    assert build_space(MACHINE, [], 32, 32, 64)["batch_size"].choices[0] == 4096
