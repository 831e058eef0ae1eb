"""Actor-critic MLPs for discrete (categorical) and continuous (diagonal Gaussian) actions.

The same module runs on the actors (CPU inference, ``act``) and on the trainer (``evaluate``).
Its full state, observation-normalisation statistics included, travels to the actors as a list of
arrays (``state_arrays`` / ``load_state_arrays``), so both sides always use the same weights.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal, kl_divergence

from policies.mlp import build_mlp, parse_spec
from policies.numpy_policy import LOG_STD_MAX, LOG_STD_MIN, OBS_CLIP


class RunningNorm(nn.Module):
    """Running mean/variance of observations (Chan's parallel update), applied as (x-mu)/sigma."""

    def __init__(self, dim: int, enabled: bool = True) -> None:
        super().__init__()
        self.enabled = enabled
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def batch_sums(self, x: torch.Tensor) -> torch.Tensor:
        """``[n, sum(x), sum(x**2)]`` of a batch ``[..., dim]``, float64 on the CPU (summable
        across data-parallel trainers before ``update_from_sums``)."""
        x = x.reshape(-1, x.shape[-1]).to(torch.float64)
        n = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
        return torch.cat([n, x.sum(0), x.pow(2).sum(0)]).cpu()

    @torch.no_grad()
    def update_from_sums(self, sums: torch.Tensor) -> None:
        """Folds a batch given as ``batch_sums`` (possibly summed over trainers) into the
        statistics (Chan's parallel update)."""
        if not self.enabled:
            return
        dim = self.mean.shape[0]
        n = float(sums[0])
        if n <= 0:
            return
        s, ss = sums[1 : 1 + dim].to(self.mean.device), sums[1 + dim :].to(self.mean.device)
        batch_mean = s / n
        batch_var = (ss / n - batch_mean.pow(2)).clamp_min(0.0)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        m2 = self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Folds a batch of observations ``[..., dim]`` into the statistics."""
        if not self.enabled:
            return
        self.update_from_sums(self.batch_sums(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        mean, std = self.mean.to(x.dtype), self.var.sqrt().to(x.dtype) + 1e-8
        return ((x - mean) / std).clamp(-OBS_CLIP, OBS_CLIP)


def _init_layers(net: nn.Sequential, out_gain: float) -> None:
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        gain = out_gain if i == len(linears) - 1 else math.sqrt(2)
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)


class ActorCritic(nn.Module):
    """Separate policy and value MLPs sharing an observation normaliser.

    Args:
        obs_dim: Flattened observation size.
        act_dim: Number of discrete actions, or continuous action dimensions.
        discrete: Categorical policy if True, else a diagonal Gaussian with a learned log-std.
        spec: Policy spec string (see ``policies.mlp``); the value net uses the same hidden sizes.
        normalize_obs: Keep running observation statistics and normalise inputs.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        spec: str = "auto",
        normalize_obs: bool = True,
    ) -> None:
        super().__init__()
        sizes = parse_spec(spec, obs_dim, act_dim)
        self.discrete = discrete
        self.obs_norm = RunningNorm(obs_dim, normalize_obs)
        self.pi = build_mlp(sizes)
        self.v = build_mlp([*sizes[:-1], 1])
        _init_layers(self.pi, 0.01)
        _init_layers(self.v, 1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.zeros(act_dim))
        self.matmul_dtype: torch.dtype | None = None
        """None: every op in float32. ``torch.bfloat16``: the hidden layers of both MLPs run
        under ``torch.autocast`` (their matmuls in bfloat16) and the output layers in float32,
        so the action means and values keep float32 precision: bfloat16 outputs would move
        log-probs by enough to push a third of PPO's importance ratios out of its clip range
        at a std of 0.14, and values of 300 in steps of 2 (``TrainConfig.trainer_precision``)."""

    def _mlp(self, net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        if self.matmul_dtype is None:
            return net(x)
        *hidden_layers, output = net  # (slicing a Sequential would build a new one per call)
        with torch.autocast(x.device.type, dtype=self.matmul_dtype):
            for layer in hidden_layers:
                x = layer(x)
        return output(x.float())

    def _dist(self, x: torch.Tensor) -> Categorical | Normal:
        out = self._mlp(self.pi, x)
        if self.discrete:  # argument validation off: it costs ~20 % of an actor's inference
            return Categorical(logits=out, validate_args=False)
        std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp().expand_as(out)
        return Normal(out, std, validate_args=False)

    def _log_prob(self, dist: Categorical | Normal, actions: torch.Tensor) -> torch.Tensor:
        logp = dist.log_prob(actions)
        return logp if self.discrete else logp.sum(-1)

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples actions for a batch of observations; returns (actions, log-probs) as numpy."""
        actions, logp = self.sample(torch.from_numpy(obs))
        return actions.numpy(), logp.numpy()

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples actions for a batch of raw observations on the model's device."""
        dist = self._dist(self.obs_norm(obs))
        actions = dist.sample()
        return actions, self._log_prob(dist, actions)

    @torch.no_grad()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """State values for a batch of observations (used to bootstrap truncated episodes)."""
        return self.v(self.obs_norm(torch.from_numpy(obs))).squeeze(-1).numpy()

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs of ``actions``, entropies and values of ``obs`` (any leading dims)."""
        logp, entropy, values, _ = self.evaluate_dist(obs, actions)
        return logp, entropy, values

    def evaluate_dist(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Categorical | Normal]:
        """``evaluate``, and the policy's action distribution at ``obs`` too."""
        x = self.obs_norm(obs)
        dist = self._dist(x)
        entropy = dist.entropy()
        if not self.discrete:
            entropy = entropy.sum(-1)
        return self._log_prob(dist, actions), entropy, self._mlp(self.v, x).squeeze(-1), dist

    def kl_from(self, before: Categorical | Normal, obs: torch.Tensor) -> torch.Tensor:
        """The KL divergence from ``before`` (this policy's distribution at ``obs`` earlier) to
        its distribution now, per state: exact, summed over a continuous action's dimensions."""
        kl = kl_divergence(before, self._dist(self.obs_norm(obs)))
        return kl if self.discrete else kl.sum(-1)

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """Values for observations of any leading shape."""
        return self._mlp(self.v, self.obs_norm(obs)).squeeze(-1)

    def state_arrays(self) -> tuple[list[str], list[np.ndarray]]:
        """The full state (parameters and buffers) as names and CPU numpy arrays."""
        state = self.state_dict()
        return list(state), [t.detach().cpu().numpy() for t in state.values()]

    def weights_digest(self) -> str:
        """SHA-256 of every parameter and buffer, 16 hex digits (GMIs of a run must agree bit
        for bit)."""
        h = hashlib.sha256()
        for name, array in zip(*self.state_arrays(), strict=True):
            h.update(name.encode())
            h.update(array.tobytes())
        return h.hexdigest()[:16]

    def load_state_arrays(self, names: list[str], arrays: list[np.ndarray]) -> None:
        """Loads a state produced by ``state_arrays``; names and shapes must match exactly."""
        state = {n: torch.from_numpy(np.array(a)) for n, a in zip(names, arrays, strict=True)}
        self.load_state_dict(state, strict=True)


def initial_state_arrays(
    obs_dim: int, act_dim: int, discrete: bool, spec: str, normalize_obs: bool, seed: int
) -> tuple[list[str], list[np.ndarray]]:
    """The version-0 weights of a run, as ``state_arrays``: those the trainer and the inference
    GMI build after ``torch.manual_seed(seed)``. The caller's torch generator is left as it
    was (the runner hands these to actors, which do not import torch)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ActorCritic(obs_dim, act_dim, discrete, spec, normalize_obs).state_arrays()
