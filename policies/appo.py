"""Asynchronous actor-critic learner (APPO): PPO-clipped surrogate on V-trace advantages.

Experience arrives with a policy lag (actors act with older weights than the learner's). The
learner corrects for it with V-trace importance weights against the behaviour log-probs, and
reports the lag (learner version minus the version each step was sampled with).

A batch is a mapping of channel name to array, ``N`` trajectories of ``T`` steps:
``obs [N, T+1, D]`` (the last entry bootstraps), ``actions [N, T]`` or ``[N, T, A]``,
``rewards [N, T]``, ``dones [N, T]``, ``logp [N, T]``, ``versions [N, T]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import nn

from policies.actor_critic import ActorCritic
from policies.vtrace import vtrace

LR_SCHEDULES = ("linear", "constant")


@dataclass(frozen=True)
class APPOConfig:
    """Learner hyper-parameters."""

    lr: float = 2e-3
    """Adam learning rate (the starting value under a linear schedule). The default suits small
    tasks such as CartPole; MuJoCo locomotion usually wants about 3e-4."""
    lr_schedule: str = "linear"
    """``linear``: anneal to 0 over the run's step budget; ``constant``: keep ``lr``."""
    gamma: float = 0.99
    """Discount factor."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches per pass (split by trajectory)."""
    clip: float = 0.2
    """PPO ratio clip."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    rho_bar: float = 1.0
    """V-trace importance-weight clip."""
    c_bar: float = 1.0
    """V-trace trace clip."""
    vtrace_lambda: float = 0.95
    """V-trace trace decay (GAE's lambda when on-policy); 1.0 is plain V-trace."""
    reward_scale: float = 1.0
    """Multiplies rewards before learning (e.g. 0.1 for Pendulum's large negative rewards)."""
    normalize_obs: bool = True
    """Running observation normalisation inside the policy."""
    max_policy_lag: int = 1000
    """Trajectories whose oldest step lags the learner by more than this are discarded."""

    def problems(self) -> list[str]:
        """Every invalid field, described with what is allowed."""
        out = []
        for name in ("lr", "clip", "max_grad_norm", "rho_bar", "c_bar", "reward_scale"):
            if not getattr(self, name) > 0:
                out.append(f"learner.{name}={getattr(self, name)!r}: must be > 0")
        if self.lr_schedule not in LR_SCHEDULES:
            out.append(f"learner.lr_schedule={self.lr_schedule!r}: allowed {LR_SCHEDULES}")
        for name in ("gamma", "vtrace_lambda"):
            if not 0.0 < getattr(self, name) <= 1.0:
                out.append(f"learner.{name}={getattr(self, name)!r}: must be in (0, 1]")
        for name in ("epochs", "minibatches", "max_policy_lag"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                out.append(f"learner.{name}={getattr(self, name)!r}: must be an integer >= 1")
        for name in ("value_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                out.append(f"learner.{name}={getattr(self, name)!r}: must be >= 0")
        return out

    def to_dict(self) -> dict[str, float | int | bool]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class UpdateStats:
    """What one learner update did."""

    steps: int
    policy_lag_mean: float
    policy_lag_max: int
    loss_pi: float
    loss_v: float
    entropy: float


class APPOLearner:
    """Owns the model and optimiser on the trainer's device; ``update`` takes one batch.

    Args:
        model: The actor-critic (moved to ``device``).
        config: Hyper-parameters.
        device: Torch device of the trainer.
        total_steps: The run's step budget, for the linear learning-rate schedule.
    """

    def __init__(self, model: ActorCritic, config: APPOConfig, device: torch.device,
                 total_steps: int | None = None) -> None:  # fmt: skip
        self.model = model.to(device)
        self.config = config
        self.device = device
        self.total_steps = total_steps
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, eps=1e-5)
        self.version = 0
        self.trained_steps = 0

    def current_lr(self) -> float:
        """The learning rate for the next update under the configured schedule."""
        if self.config.lr_schedule == "constant" or not self.total_steps:
            return self.config.lr
        return self.config.lr * max(0.0, 1.0 - self.trained_steps / self.total_steps)

    def _tensors(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        out = {k: torch.as_tensor(np.asarray(v), device=self.device)
               for k, v in batch.items() if k != "versions"}  # fmt: skip
        out["obs"] = out["obs"].float()
        out["rewards"] = out["rewards"].float() * self.config.reward_scale
        out["discounts"] = self.config.gamma * (1.0 - out["dones"].float())
        return out

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateStats:
        """Runs ``epochs`` x ``minibatches`` gradient steps on one batch; bumps ``version``."""
        cfg = self.config
        lag = self.version - np.asarray(batch["versions"])
        b = self._tensors(batch)
        n, t = b["rewards"].shape
        for group in self.optimizer.param_groups:
            group["lr"] = self.current_lr()
        self.model.obs_norm.update(b["obs"][:, :t])
        pi_losses, v_losses, entropies = [], [], []
        for _ in range(cfg.epochs):
            with torch.no_grad():
                target_logp, _, values = self.model.evaluate(b["obs"][:, :t], b["actions"])
                bootstrap = self.model.values(b["obs"][:, t])
                ret = vtrace(
                    b["logp"], target_logp, b["rewards"], values, bootstrap, b["discounts"],
                    cfg.rho_bar, cfg.c_bar, cfg.vtrace_lambda,
                )  # fmt: skip
            for idx in torch.randperm(n, device=self.device).chunk(cfg.minibatches):
                logp, entropy, v = self.model.evaluate(b["obs"][idx, :t], b["actions"][idx])
                adv = ret.pg_advantages[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8) if adv.numel() > 1 else adv
                ratio = torch.exp(logp - b["logp"][idx])
                surrogate = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
                loss_pi = -surrogate.mean()
                loss_v = 0.5 * (v - ret.vs[idx]).pow(2).mean()
                loss = loss_pi + cfg.value_coef * loss_v - cfg.entropy_coef * entropy.mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                pi_losses.append(loss_pi.detach())
                v_losses.append(loss_v.detach())
                entropies.append(entropy.mean().detach())
        self.version += 1
        self.trained_steps += n * t
        return UpdateStats(
            steps=n * t,
            policy_lag_mean=float(lag.mean()),
            policy_lag_max=int(lag.max()),
            loss_pi=torch.stack(pi_losses).mean().item(),  # one device sync per update
            loss_v=torch.stack(v_losses).mean().item(),
            entropy=torch.stack(entropies).mean().item(),
        )
