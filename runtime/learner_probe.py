"""A run's learner on synthetic batches: what the learner probe (``runtime.probes``) and the
learner benchmark (``bench.learner_limit``) time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.cache_dirs import use_kernel_cache

if TYPE_CHECKING:  # the tuner's model imports this module's name without gymnasium
    from runtime.envs import EnvInfo

GROUP_LEARNER = "cuda-group"
"""The learner line of a CUDA trainer in a data-parallel group: its all-reduce sits between
backward and step, so it runs the eager loop, not the CUDA graphs a single trainer replays
(13-21x slower than the graphs with the compiled loss on an H200, with PPO's 10 x 32 steps
per update)."""


def synthetic_batch(info: EnvInfo, size: int, rollout_len: int, seed: int = 0) -> dict:
    """A learner batch of about ``size`` steps with random contents (the trainer's layout)."""
    rng = np.random.default_rng(seed)
    n = max(1, size // rollout_len)
    act_shape = (n, rollout_len) if info.discrete else (n, rollout_len, info.act_dim)
    return {
        "obs": rng.standard_normal((n, rollout_len + 1, info.obs_dim)).astype(np.float32),
        "actions": (
            rng.integers(0, info.act_dim, act_shape)
            if info.discrete
            else rng.standard_normal(act_shape).astype(np.float32)
        ),
        "rewards": rng.standard_normal((n, rollout_len)).astype(np.float32),
        "dones": np.zeros((n, rollout_len), np.float32),
        "logp": np.full((n, rollout_len), -1.0, np.float32),
        "versions": np.zeros((n, rollout_len), np.int64),
    }


def make_learner(
    info: EnvInfo, policy: str, device: str, learner: dict[str, Any], graphs: bool = True
):
    """The run's APPO learner for ``info``'s env on ``device``, and a function that runs one
    update of a batch and waits for it to finish. ``graphs=False``: a CUDA learner's eager
    loop, as a trainer group runs it (``policies.graphed_step``)."""
    import torch

    from policies.actor_critic import ActorCritic
    from policies.appo import APPOLearner
    from policies.appo_config import APPOConfig

    cfg = APPOConfig(**learner)
    if graphs and device == "cuda":  # a compiled loss (policies.compiled_loss): kept by the probes
        use_kernel_cache()
    model = ActorCritic(info.obs_dim, info.act_dim, info.discrete, policy, cfg.normalize_obs)
    dev = torch.device(device)
    learn = APPOLearner(model, cfg, dev, group=not graphs)

    def update(batch: dict) -> None:
        learn.update(batch)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    return learn, update
