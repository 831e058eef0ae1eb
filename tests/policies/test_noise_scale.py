"""The gradient noise scale estimator (``policies.noise_scale``) against a problem whose noise
scale is known, and the learner reporting it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from policies.noise_scale import NoiseScale, efficiency


@pytest.mark.parametrize("b_noise", [64.0, 4096.0])
def test_the_estimate_recovers_a_known_noise_scale(b_noise):
    """Per-sample gradients ``G + xi`` with ``xi ~ N(0, sigma^2 I_d)``: the noise scale is
    ``d sigma^2 / |G|^2``. Minibatch gradients are means of ``b`` samples; an update holds 8."""
    gen = torch.Generator().manual_seed(0)
    d, b, k = 256, 512, 8
    g = torch.randn(d, generator=gen, dtype=torch.float64)
    sigma = math.sqrt(b_noise * float(g.dot(g)) / d)
    est = NoiseScale(decay=0.98, per_samples=b * k)  # 0.98 per update
    for _ in range(400):
        est.begin()
        for _ in range(k):
            mean_noise = torch.randn(d, generator=gen, dtype=torch.float64) * sigma / math.sqrt(b)
            est.add([(g + mean_noise)[: d // 2], (g + mean_noise)[d // 2 :]], float(b))
        est.end()
    assert est.value == pytest.approx(b_noise, rel=0.15)


def test_the_moving_average_forgets_per_sample_not_per_update():
    """Eight updates of 4,096 samples move the estimate exactly as far as one of 32,768 with
    the same figures; a big update counts for more than a small one."""
    small, big = NoiseScale(), NoiseScale()
    for est in (small, big):
        est.fold(1.0, 1000.0, 4096)
    for _ in range(8):
        small.fold(2.0, 3000.0, 4096)
    big.fold(2.0, 3000.0, 32_768)
    assert small.g2 == pytest.approx(big.g2) and small.s == pytest.approx(big.s)
    one_small, one_big = NoiseScale(), NoiseScale()
    for est, n in ((one_small, 4096), (one_big, 65_536)):
        est.fold(1.0, 1000.0, 4096)
        est.fold(2.0, 1000.0, n)
    assert 1.0 < one_small.g2 < one_big.g2 < 2.0


def test_one_minibatch_gives_no_estimate_and_efficiency_is_bounded():
    est = NoiseScale()
    est.begin()
    est.add([torch.ones(3)], 32.0)
    est.end()
    assert est.value is None and efficiency(None, 1024) is None
    assert efficiency(1000.0, 1000) == 0.5
    assert efficiency(1000.0, 10) > efficiency(1000.0, 10_000)  # bigger batches keep less
    assert efficiency(-5.0, 100) == 0.0  # a negative estimate (noise) is taken as none


def test_the_learner_reports_a_noise_scale_and_its_step_size():
    from policies.actor_critic import ActorCritic
    from policies.appo import APPOLearner
    from policies.appo_config import APPOConfig

    rng = np.random.default_rng(0)
    n, t, dim = 16, 32, 4
    model = ActorCritic(dim, 2, True, "auto:32:auto")
    learner = APPOLearner(model, APPOConfig(minibatches=4, epochs=2), torch.device("cpu"))
    batch = {
        "obs": rng.normal(size=(n, t + 1, dim)).astype(np.float32),
        "actions": rng.integers(0, 2, size=(n, t)),
        "rewards": rng.normal(size=(n, t)).astype(np.float32),
        "dones": np.zeros((n, t), np.uint8),
        "logp": np.full((n, t), np.log(0.5), np.float32),
        "versions": np.zeros((n, t), np.int32),
    }
    for _ in range(3):
        stats = learner.update(batch)
    assert stats.batch_samples == n * t
    # each update fed the estimator its first epoch's 4 minibatch gradients, in 2 pairs: both
    # terms are estimated (on random data |G|^2 may come out at or below 0: then no ratio)
    assert learner.noise.g2 is not None and learner.noise.s is not None
    assert stats.noise_scale == learner.noise.value
    # a learner that takes over (a GMI hand-over, a checkpoint) goes on from the estimate
    other = APPOLearner(
        ActorCritic(dim, 2, True, "auto:32:auto"), learner.config, torch.device("cpu")
    )
    other.load_state(learner.state())
    assert (other.noise.g2, other.noise.s) == (learner.noise.g2, learner.noise.s)
    older = {k: v for k, v in learner.state().items() if k != "noise"}  # saved before it had one
    other.load_state(older)
    assert other.noise.value is None


def test_the_result_rates_the_runs_batch_not_the_last_updates_samples():
    """A drain trains what is in flight as a last, smaller update: the result's efficiency is
    the run's batch's at the last noise scale, and nothing where there is no estimate."""
    from runtime.results import noise_doc

    doc = noise_doc({"noise_scale": 3000.0}, 1024)
    assert doc == {"samples": 3000.0, "batch_samples": 1024, "efficiency": 3000.0 / 4024.0}
    empty = {"samples": None, "batch_samples": None, "efficiency": None}
    assert noise_doc({"noise_scale": None}, 1024) == empty
    assert noise_doc({}, 1024) == empty
