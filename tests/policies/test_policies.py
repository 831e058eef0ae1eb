"""Policy specs, the actor-critic, V-trace and the APPO learner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.actor_critic import ActorCritic
from policies.appo import APPOConfig, APPOLearner
from policies.mlp import PolicySpecError, parse_spec
from policies.vtrace import vtrace


def test_spec_auto_forms():
    assert parse_spec("auto", 60, 8) == [60, 64, 64, 8]
    assert parse_spec("auto:256:128:64:auto", 60, 8) == [60, 256, 128, 64, 8]
    assert parse_spec("60:256:128:64:8", 60, 8) == [60, 256, 128, 64, 8]
    with pytest.raises(PolicySpecError, match="at least input:output"):
        parse_spec("64", 60, 8)
    with pytest.raises(PolicySpecError, match="'auto' only as the first or last"):
        parse_spec("60:auto:8", 60, 8)


def reference_returns(rewards, dones, bootstrap, gamma):
    out = np.zeros_like(rewards)
    acc = bootstrap.copy()
    for t in range(rewards.shape[1] - 1, -1, -1):
        acc = rewards[:, t] + gamma * (1 - dones[:, t]) * acc
        out[:, t] = acc
    return out


def test_vtrace_on_policy_gives_discounted_returns():
    rng = np.random.default_rng(0)
    n, t, gamma = 5, 7, 0.9
    rewards = rng.normal(size=(n, t))
    dones = (rng.random((n, t)) < 0.2).astype(float)
    values, bootstrap = rng.normal(size=(n, t)), rng.normal(size=n)
    logp = torch.tensor(rng.normal(size=(n, t)))
    ret = vtrace(
        logp,
        logp,
        torch.tensor(rewards),
        torch.tensor(values),
        torch.tensor(bootstrap),
        torch.tensor(gamma * (1 - dones)),
    )
    np.testing.assert_allclose(ret.vs.numpy(), reference_returns(rewards, dones, bootstrap, gamma))


def test_vtrace_clips_off_policy_importance_weights():
    ones = torch.ones(1, 3)
    far_off = vtrace(ones * -5, ones * 0, ones, ones * 0, torch.zeros(1), ones * 0.9)
    on = vtrace(ones * 0, ones * 0, ones, ones * 0, torch.zeros(1), ones * 0.9)
    torch.testing.assert_close(far_off.vs, on.vs)  # ratios e^5 clipped to rho_bar = c_bar = 1


def test_state_arrays_round_trip_between_models():
    a = ActorCritic(4, 2, discrete=False, spec="4:16:2")
    b = ActorCritic(4, 2, discrete=False, spec="4:16:2")
    names, arrays = a.state_arrays()
    assert "obs_norm.mean" in names and "log_std" in names
    b.load_state_arrays(names, arrays)
    obs = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(a.value(obs), b.value(obs))


def bandit_batch(model: ActorCritic, n: int = 64, t: int = 4) -> dict[str, np.ndarray]:
    """A one-state problem where action 1 pays 1 and action 0 pays 0."""
    obs = np.zeros((n, t + 1, 2), np.float32)
    actions, logp = model.act(obs[:, :t].reshape(-1, 2))
    actions, logp = actions.reshape(n, t), logp.reshape(n, t)
    return {
        "obs": obs,
        "actions": actions,
        "rewards": (actions == 1).astype(np.float32),
        "dones": np.ones((n, t), np.uint8),
        "logp": logp,
        "versions": np.zeros((n, t), np.int32),
    }


@pytest.mark.parametrize("discrete", [True, False])
def test_learner_improves_the_policy_and_reports_lag(discrete):
    torch.manual_seed(0)
    model = ActorCritic(2, 2 if discrete else 1, discrete, spec="auto", normalize_obs=False)
    learner = APPOLearner(model, APPOConfig(lr=3e-3), torch.device("cpu"))
    for _ in range(30):
        if discrete:
            batch = bandit_batch(model)
        else:  # reward = -(a - 0.5)^2 on one state
            obs = np.zeros((64, 5, 2), np.float32)
            a, lp = model.act(obs[:, :4].reshape(-1, 2))
            a, lp = a.reshape(64, 4, 1), lp.reshape(64, 4)
            batch = {
                "obs": obs,
                "actions": a,
                "rewards": -((a[..., 0] - 0.5) ** 2),
                "dones": np.ones((64, 4), np.uint8),
                "logp": lp,
                "versions": np.zeros((64, 4), np.int32),
            }
        stats = learner.update(batch)
    assert learner.version == 30
    assert stats.policy_lag_mean == 29 and stats.policy_lag_max == 29
    x = torch.zeros(1, 2)
    if discrete:
        probs = torch.softmax(model.pi(x), -1)
        assert probs[0, 1] > 0.9
    else:
        assert abs(model.pi(x).item() - 0.5) < 0.15


def test_linear_schedule_anneals_the_learning_rate_to_zero_over_the_budget():
    torch.manual_seed(0)
    model = ActorCritic(2, 2, True, spec="auto")
    cfg = APPOConfig(lr=1e-3, lr_schedule="linear")
    learner = APPOLearner(model, cfg, torch.device("cpu"), total_steps=512)
    assert learner.current_lr() == pytest.approx(1e-3)
    learner.update(bandit_batch(model, n=64, t=4))  # 256 steps
    assert learner.current_lr() == pytest.approx(5e-4)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # used for that update
    learner.update(bandit_batch(model, n=64, t=4))
    assert learner.current_lr() == 0.0
    constant = APPOLearner(model, APPOConfig(lr_schedule="constant"), torch.device("cpu"), 512)
    constant.trained_steps = 10_000
    assert constant.current_lr() == pytest.approx(APPOConfig().lr)


def test_unknown_schedule_is_a_config_problem():
    assert any("lr_schedule" in p for p in APPOConfig(lr_schedule="cosine").problems())


def test_vtrace_lambda_on_policy_equals_gae():
    rng = np.random.default_rng(1)
    n, t, gamma, lam = 3, 6, 0.9, 0.8
    rewards, values = rng.normal(size=(n, t)), rng.normal(size=(n, t))
    dones, bootstrap = (rng.random((n, t)) < 0.3).astype(float), rng.normal(size=n)
    disc = gamma * (1 - dones)
    next_v = np.concatenate([values[:, 1:], bootstrap[:, None]], 1)
    gae, acc = np.zeros((n, t)), np.zeros(n)
    for i in range(t - 1, -1, -1):
        acc = rewards[:, i] + disc[:, i] * next_v[:, i] - values[:, i] + disc[:, i] * lam * acc
        gae[:, i] = acc
    zero = torch.zeros(n, t, dtype=torch.float64)
    ret = vtrace(
        zero,
        zero,
        torch.tensor(rewards),
        torch.tensor(values),
        torch.tensor(bootstrap),
        torch.tensor(disc),
        lam=lam,
    )
    np.testing.assert_allclose(ret.vs.numpy(), gae + values)


def test_bf16_matmuls_keep_float32_outputs_and_weights_and_stay_close_to_fp32():
    torch.manual_seed(0)
    model = ActorCritic(12, 3, False, "auto:64:32:auto")
    obs, actions = torch.randn(64, 9, 12), torch.randn(64, 8, 3)
    ref = model.evaluate(obs[:, :8], actions)
    model.matmul_dtype = torch.bfloat16
    got = model.evaluate(obs[:, :8], actions)
    for r, g in zip(ref, got, strict=True):
        assert g.dtype == torch.float32 and torch.allclose(r, g, rtol=0.05, atol=0.05)
    # the output layers run in float32: values of 300 are not rounded to bf16's steps of 2
    with torch.no_grad():
        model.v[-1].bias.fill_(300.0)
    values = model.values(obs)
    assert (values - values.round()).abs().max() > 0.01
    assert not torch.equal(ref[0], got[0]) and not torch.equal(ref[2], got[2])  # bf16 ran
    # (the entropy of a Gaussian policy depends on its std alone: no matmul)
    assert model.values(obs).dtype == torch.float32
    before = [p.detach().clone() for p in model.parameters()]
    batch = {
        "obs": obs.numpy(),
        "actions": actions.numpy(),
        "logp": ref[0].detach().numpy(),
        "rewards": np.ones((64, 8), np.float32),
        "dones": np.zeros((64, 8), np.float32),
        "versions": np.zeros((64, 8), np.int64),
    }
    stats = APPOLearner(model, APPOConfig(), torch.device("cpu")).update(batch)
    assert stats.steps == 64 * 8 and np.isfinite([stats.loss_pi, stats.loss_v]).all()
    for b, p in zip(before, model.parameters(), strict=True):
        assert p.dtype == torch.float32 and not torch.equal(b, p)


def test_a_non_finite_gradient_is_never_applied():
    """An update that meets a non-finite gradient after some of its minibatch steps were
    taken is not applied at all: the weights, the observation statistics, the optimiser state
    and the version are as before it."""
    import copy

    from policies.nonfinite import NonFiniteUpdate

    torch.manual_seed(0)
    model = ActorCritic(2, 2, True, spec="auto", normalize_obs=True)
    learner = APPOLearner(model, APPOConfig(lr=3e-3, minibatches=4), torch.device("cpu"))
    batch = bandit_batch(model)
    learner.update(batch)  # the optimiser has its moments
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    moments = copy.deepcopy(learner.optimizer.state_dict())
    version = learner.version
    rewards = batch["rewards"].copy()
    rewards[-1] = np.inf  # one trajectory's: the minibatch holding it, not the others
    steps = []
    step = learner.optimizer.step
    learner.optimizer.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]
    with pytest.raises(NonFiniteUpdate, match=r"non-finite gradient.*not applied"):
        learner.update({**batch, "rewards": rewards})
    assert steps, "no step was taken before the non-finite one: the test shows nothing"
    assert learner.version == version
    for k, v in learner.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    after = learner.optimizer.state_dict()
    for i, state in moments["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(after["state"][i][name]), torch.as_tensor(value))
    obs = {**batch, "obs": np.full_like(batch["obs"], np.nan)}
    with pytest.raises(NonFiniteUpdate, match="non-finite observations"):
        learner.update(obs)


def test_a_sample_many_versions_stale_neither_halts_nor_takes_over_the_update():
    """One sample whose actor's log-prob sits 200 nats below the learner's (a long-stale
    policy): its ratio is bounded, so the update's gradient stays finite and no larger than
    the clip; samples whose ratio is inside the bounds get the plain surrogate."""
    torch.manual_seed(0)
    model = ActorCritic(2, 2, True, spec="auto", normalize_obs=False)
    learner = APPOLearner(model, APPOConfig(lr=3e-3), torch.device("cpu"))
    batch = bandit_batch(model)
    batch["logp"][0, 0] -= 200.0
    stats = learner.update(batch)  # raised NonFiniteUpdate before the bound
    assert learner.version == 1 and np.isfinite([stats.loss_pi, stats.loss_v]).all()
    obs = torch.zeros(8, 2)
    actions = torch.tensor([0, 1] * 4)
    with torch.no_grad():
        logp, _, _ = model.evaluate(obs, actions)
    advantages, targets = torch.linspace(-1.0, 1.0, 8), torch.zeros(8)
    for gap, bounded in ((0.1, False), (200.0, True)):
        behaviour = logp - torch.tensor([gap] + [0.0] * 7)
        model.zero_grad()
        loss, loss_pi, _, _ = learner.minibatch_loss(obs, actions, behaviour, advantages, targets)
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        assert bool(torch.isfinite(grad).all()) and float(grad.norm()) < 100.0
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        ratio = (
            torch.exp(logp - behaviour).clamp(max=20.0) if bounded else torch.exp(logp - behaviour)
        )
        plain = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        assert float(loss_pi) == pytest.approx(float(plain), rel=1e-5)
