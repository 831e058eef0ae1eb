"""``NumpyPolicy``: ``ActorCritic``'s acting half (``act``, ``value``) in numpy, for actors.

An actor with ``inference='actor'`` runs the policy on a batch of 8-64 observations per step.
At that size torch's per-op overhead dominates: Ant-v5's 256:128:64 policy took 470 us per
call of ``ActorCritic.act`` on 32 observations and 105 us in numpy (``bench/actor_inference.py``),
and importing torch costs each actor process ~1.7 s of CPU at start. So actors keep a numpy
mirror of the policy, loaded from the same ``state_arrays`` the trainer publishes, and never
import torch.

It computes exactly what ``ActorCritic`` computes, in float32: the observation normalisation
(``(x - mean) / (sqrt(var) + 1e-8)`` clipped to +-``OBS_CLIP``), the tanh MLPs, and a diagonal
Gaussian (continuous, ``log_std`` clamped to [-5, 2]) or a categorical (discrete) distribution.
The samples come from a numpy generator seeded per actor incarnation.
"""

from __future__ import annotations

import math
import re

import numpy as np

OBS_CLIP = 10.0
"""Normalised observations are clipped to +-this (here and in ``ActorCritic``, which imports it:
this module must not import torch)."""
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""The Gaussian policy's log-std is clamped to this range (here and in ``ActorCritic``)."""
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
_LAYER = re.compile(r"^(pi|v)\.(\d+)\.(weight|bias)$")


class NumpyPolicy:
    """Acts with the weights of an ``ActorCritic`` given as ``(names, arrays)``.

    Args:
        discrete: Categorical actions (int64) if True, else a diagonal Gaussian (float32).
        normalize_obs: Whether the model normalises observations (``ActorCritic``'s flag; it
            is not part of the state).
        names: ``ActorCritic.state_arrays()`` names.
        arrays: The matching arrays.
        seed: Seed of the action-sampling generator.

    Raises:
        ValueError: names or shapes that are not an ``ActorCritic`` state.
    """

    def __init__(
        self,
        discrete: bool,
        normalize_obs: bool,
        names: list[str],
        arrays: list[np.ndarray],
        seed: int | np.random.SeedSequence,
    ) -> None:
        self.discrete = discrete
        self.normalize_obs = normalize_obs
        self.rng = np.random.default_rng(seed)
        self._shapes: dict[str, tuple[int, ...]] | None = None
        self.load_state_arrays(names, arrays)

    def load_state_arrays(self, names: list[str], arrays: list[np.ndarray]) -> None:
        """Loads an ``ActorCritic.state_arrays()`` state; after the first, names and shapes
        must match it exactly (as ``ActorCritic.load_state_arrays`` requires)."""
        if len(names) != len(arrays):
            raise ValueError(f"{len(names)} names for {len(arrays)} arrays")
        state = dict(zip(names, arrays, strict=True))
        shapes = {n: tuple(np.shape(a)) for n, a in state.items()}
        if self._shapes is not None and shapes != self._shapes:
            raise ValueError("the state's names or shapes differ from the policy's")
        layers: dict[str, dict[int, dict[str, np.ndarray]]] = {"pi": {}, "v": {}}
        for name, array in state.items():
            m = _LAYER.match(name)
            if m:
                layers[m[1]].setdefault(int(m[2]), {})[m[3]] = np.asarray(array, np.float32)
        for need in ("obs_norm.mean", "obs_norm.var"):
            if need not in state:
                raise ValueError(f"the state has no {need!r}")
        if not self.discrete and "log_std" not in state:
            raise ValueError("a continuous policy's state needs 'log_std'")
        pi, v = _stack(layers["pi"], "pi"), _stack(layers["v"], "v")
        if v[-1][0].shape[1] != 1:
            raise ValueError(f"the value net ends in {v[-1][0].shape[1]} outputs, expected 1")
        self.pi, self.v = pi, v
        mean = np.asarray(state["obs_norm.mean"], np.float64)
        self.obs_mean = mean.astype(np.float32)
        self.obs_std = np.sqrt(np.asarray(state["obs_norm.var"], np.float64)).astype(np.float32)
        self.obs_std += np.float32(1e-8)
        if not self.discrete:
            log_std = np.clip(np.asarray(state["log_std"], np.float32), LOG_STD_MIN, LOG_STD_MAX)
            self.std, self.log_std = np.exp(log_std), log_std
        self._shapes = shapes

    def _norm(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float32)
        if not self.normalize_obs:
            return x
        return np.clip((x - self.obs_mean) / self.obs_std, -OBS_CLIP, OBS_CLIP)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples actions for a batch of raw observations; returns (actions, log-probs)."""
        out = _mlp(self.pi, self._norm(obs))
        if self.discrete:
            z = out - out.max(-1, keepdims=True)
            logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
            gumbel = -np.log(-np.log(self.rng.random(out.shape, dtype=np.float32) + 1e-20))
            actions = np.argmax(out + gumbel, axis=-1).astype(np.int64)
            return actions, np.take_along_axis(logp_all, actions[:, None], -1)[:, 0]
        eps = self.rng.standard_normal(out.shape, dtype=np.float32)
        actions = out + self.std * eps
        logp = (-0.5 * eps * eps - self.log_std - np.float32(_LOG_SQRT_2PI)).sum(-1)
        return actions, logp.astype(np.float32)

    def value(self, obs: np.ndarray) -> np.ndarray:
        """State values for a batch of raw observations."""
        return _mlp(self.v, self._norm(obs))[:, 0]


Layers = list[tuple[np.ndarray, np.ndarray]]


def _stack(found: dict[int, dict[str, np.ndarray]], net: str) -> Layers:
    """``nn.Sequential`` linear layers by index -> ``[(W^T, b), ...]`` (tanh between them)."""
    if not found:
        raise ValueError(f"the state has no {net!r} layers")
    out = []
    for index in sorted(found):
        parts = found[index]
        if set(parts) != {"weight", "bias"}:
            raise ValueError(f"{net}.{index} needs a weight and a bias")
        w, b = parts["weight"], parts["bias"]
        if w.ndim != 2 or b.shape != (w.shape[0],) or (out and out[-1][0].shape[1] != w.shape[1]):
            raise ValueError(f"{net}.{index}: shapes {w.shape} and {b.shape} do not chain")
        out.append((np.ascontiguousarray(w.T), b))
    return out


def _mlp(layers: Layers, x: np.ndarray) -> np.ndarray:
    for i, (wt, b) in enumerate(layers):
        x = x @ wt
        x += b
        if i < len(layers) - 1:
            np.tanh(x, out=x)
    return x


def random_state_arrays(
    sizes: list[int], discrete: bool, seed: int = 0
) -> tuple[list[str], list[np.ndarray]]:
    """An ``ActorCritic`` state of layer sizes ``sizes`` (``policies.mlp.parse_spec``) with
    random weights, built without torch: what the probes' actor loop acts with."""
    rng = np.random.default_rng(seed)
    names: list[str] = []
    arrays: list[np.ndarray] = []
    for net, dims in (("pi", sizes), ("v", [*sizes[:-1], 1])):
        for i in range(len(dims) - 1):
            scale = 1.0 / math.sqrt(dims[i])
            names += [f"{net}.{2 * i}.weight", f"{net}.{2 * i}.bias"]
            arrays += [
                rng.uniform(-scale, scale, (dims[i + 1], dims[i])).astype(np.float32),
                np.zeros(dims[i + 1], np.float32),
            ]
    names += ["obs_norm.mean", "obs_norm.var"]
    arrays += [np.zeros(sizes[0], np.float32), np.ones(sizes[0], np.float32)]
    if not discrete:
        names.append("log_std")
        arrays.append(np.zeros(sizes[-1], np.float32))
    return names, arrays
