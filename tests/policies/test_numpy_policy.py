"""``NumpyPolicy`` acts as ``ActorCritic`` does: the same values and log-probs for the same
weights, samples from the same distribution, and the same refusals of a wrong state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.actor_critic import ActorCritic, initial_state_arrays
from policies.numpy_policy import NumpyPolicy


def trained_model(discrete: bool, normalize: bool = True) -> ActorCritic:
    """A model whose weights, log-std and observation statistics are all off their init."""
    torch.manual_seed(3)
    obs_dim, act_dim = (6, 4) if discrete else (11, 3)
    model = ActorCritic(obs_dim, act_dim, discrete, "auto:32:16:auto", normalize)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.obs_norm.update(torch.randn(500, obs_dim, dtype=torch.float64) * 4 + 2)
    return model


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_values_and_log_probs_match_the_torch_model(discrete, normalize):
    model = trained_model(discrete, normalize)
    policy = NumpyPolicy(discrete, normalize, *model.state_arrays(), seed=0)
    obs = (
        np.random.default_rng(1).standard_normal((64, model.obs_norm.mean.shape[0])) * 30
    ).astype(np.float32)  # far outside the clip range too
    with torch.no_grad():
        want_v = model.value(obs)
        actions, logp = policy.act(obs)
        want_logp, _, _ = model.evaluate(torch.from_numpy(obs), torch.from_numpy(actions))
    np.testing.assert_allclose(policy.value(obs), want_v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logp, want_logp.numpy(), rtol=1e-5, atol=1e-4)
    assert actions.dtype == (np.int64 if discrete else np.float32) and logp.dtype == np.float32
    assert actions.shape == ((64,) if discrete else (64, 3))


def sampled(discrete: bool, seed: int) -> tuple[ActorCritic, np.ndarray, np.ndarray]:
    """The model, its policy head's output for one observation, and 40,000 numpy samples."""
    model = trained_model(discrete)
    policy = NumpyPolicy(discrete, True, *model.state_arrays(), seed=seed)
    dim = model.obs_norm.mean.shape[0]
    obs = np.repeat(np.random.default_rng(seed).standard_normal((1, dim)), 40_000, 0)
    actions, _ = policy.act(obs.astype(np.float32))
    with torch.no_grad():
        out = model.pi(model.obs_norm(torch.from_numpy(obs[:1]).float())).numpy()[0]
    return model, out, actions


def test_continuous_samples_have_the_model_mean_and_std():
    model, mean, actions = sampled(False, seed=5)
    std = model.log_std.detach().clamp(-5, 2).exp().numpy()
    np.testing.assert_allclose(actions.mean(0), mean, atol=4 * std.max() / 200)
    np.testing.assert_allclose(actions.std(0), std, rtol=0.03)


def test_discrete_samples_follow_the_softmax():
    _, logits, actions = sampled(True, seed=7)
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    freq = np.bincount(actions, minlength=4) / len(actions)
    np.testing.assert_allclose(freq, probs, atol=0.01)


def test_seeds_give_repeatable_and_distinct_streams():
    arrays = trained_model(False).state_arrays()
    obs = np.zeros((8, 11), np.float32)
    a = [
        NumpyPolicy(False, True, *arrays, seed=np.random.SeedSequence([0, i, 0])).act(obs)[0]
        for i in (0, 0, 1)
    ]
    assert np.array_equal(a[0], a[1]) and not np.array_equal(a[0], a[2])


def test_a_state_of_another_shape_or_without_its_parts_is_refused():
    names, arrays = trained_model(False).state_arrays()
    policy = NumpyPolicy(False, True, names, arrays, seed=0)
    other_names, other_arrays = ActorCritic(11, 3, False, "auto:64:auto").state_arrays()
    with pytest.raises(ValueError, match="names or shapes differ"):
        policy.load_state_arrays(other_names, other_arrays)
    keep = [i for i, n in enumerate(names) if n != "log_std"]
    with pytest.raises(ValueError, match="needs 'log_std'"):
        NumpyPolicy(False, True, [names[i] for i in keep], [arrays[i] for i in keep], seed=0)
    keep = [i for i, n in enumerate(names) if n != "pi.2.bias"]
    with pytest.raises(ValueError, match=r"pi\.2 needs a weight and a bias"):
        NumpyPolicy(False, True, [names[i] for i in keep], [arrays[i] for i in keep], seed=0)
    with pytest.raises(ValueError, match="2 names for 1 arrays"):
        policy.load_state_arrays(names[:2], arrays[:1])


def test_initial_weights_are_the_trainers_and_leave_the_callers_generator_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    names, arrays = initial_state_arrays(11, 3, False, "auto:32:16:auto", True, seed=9)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(9)  # what the trainer does before building its model
    want_names, want_arrays = ActorCritic(11, 3, False, "auto:32:16:auto", True).state_arrays()
    assert names == want_names
    assert all(np.array_equal(a, b) for a, b in zip(arrays, want_arrays, strict=True))
