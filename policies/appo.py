"""Asynchronous actor-critic learner (APPO): PPO-clipped surrogate on V-trace advantages.

Experience arrives with a policy lag (actors act with older weights than the learner's). The
learner corrects for it with V-trace importance weights against the behaviour log-probs, and
reports the lag (learner version minus the version each step was sampled with).

A batch is a mapping of channel name to array, ``N`` trajectories of ``T`` steps:
``obs [N, T+1, D]`` (the last entry bootstraps), ``actions [N, T]`` or ``[N, T, A]``,
``rewards [N, T]``, ``dones [N, T]``, ``logp [N, T]``, ``versions [N, T]``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from policies.actor_critic import ActorCritic
from policies.appo_config import LR_GAIN_MAX, LR_GAIN_MIN, APPOConfig
from policies.graphed_step import (
    GraphedSteps,
    adopt_state,
    make_optimizer,
    portable_state,
    set_lr,
    wanted,
)
from policies.noise_scale import NoiseScale
from policies.nonfinite import NonFiniteUpdate
from policies.update_backup import UpdateBackup
from policies.vtrace import vtrace

RATIO_LOG_MIN, RATIO_LOG_MAX = math.log(0.05), math.log(20.0)
"""Bounds of the surrogate's log probability ratio against the behaviour policy."""


def group_normalized(adv: torch.Tensor | None, group: Any) -> torch.Tensor | None:
    """``adv`` (None: this trainer has no rows in the minibatch) normalised by the mean and
    standard deviation of every trainer's advantages in the group's minibatch, as one trainer
    with all of them normalises; every rank calls it for every minibatch."""
    sums = torch.zeros(3, dtype=torch.float64)
    if adv is not None and adv.numel():
        a = adv.detach().double()
        sums[0], sums[1], sums[2] = float(a.numel()), float(a.sum()), float((a * a).sum())
    n, s, s2 = (float(x) for x in group.sum_(sums))
    if adv is None or n <= 1:
        return adv
    mean = s / n
    std = math.sqrt(max(s2 - n * mean * mean, 0.0) / (n - 1))
    return (adv - mean) / (std + 1e-8)


logger = logging.getLogger(__name__)


@dataclass
class UpdateStats:
    """What one learner update did."""

    steps: int
    policy_lag_mean: float
    policy_lag_max: int
    loss_pi: float
    loss_v: float
    entropy: float
    lr: float = 0.0
    """The learning rate of this update (after schedule and batch scaling)."""
    kl: float | None = None
    """The KL divergence from the policy before this update to the one after it, exact per
    state, averaged over the batch's states (over a trainer group, over all of theirs); None
    where no trainer had rows."""
    noise_scale: float | None = None
    """The gradient noise scale in samples, smoothed over updates (``policies.noise_scale``)."""
    batch_samples: int = 0
    """Samples in this update (over a trainer group): the step its efficiency is of
    (``policies.noise_scale``)."""
    minibatches: int = 0
    """The minibatches each epoch of this update took (``APPOConfig.minibatches_for``)."""


class APPOLearner:
    """Owns the model and optimiser on the trainer's device; ``update`` takes one batch.

    Args:
        model: The actor-critic (moved to ``device``).
        config: Hyper-parameters.
        device: Torch device of the trainer.
        total_steps: The run's step budget, for the linear learning-rate schedule.
        group: Whether the learner trains in a trainer group (its updates take one): it then
            runs the eager loop, with a fused Adam on CUDA, not a capturable one
            (``policies.graphed_step``).
    """

    def __init__(
        self,
        model: ActorCritic,
        config: APPOConfig,
        device: torch.device,
        total_steps: int | None = None,
        group: bool = False,
    ) -> None:
        self.model = model.to(device)
        self.config = config
        self.device = device
        self.total_steps = total_steps
        graphs = wanted(model, device, group)
        self.optimizer = make_optimizer(self.model, config.lr, device, graphs)
        self.graphs = GraphedSteps(self) if graphs else None
        """The minibatch steps as CUDA graphs (``policies.graphed_step``): a single trainer on
        CUDA with float32 matmuls; None runs the eager loop."""
        self.version = 0
        self.trained_steps = 0
        self.noise = NoiseScale()
        self.lr_gain = 1.0
        """The ``adaptive`` schedule's factor on ``lr`` (``APPOConfig.adapt_lr_gain``)."""
        self.batch: int | None = None
        """The batch size the trainer takes now (``config.lr_for`` scales ``lr`` for it)."""

    def prepare(self, rollout_len: int) -> None:
        """Compiles a graphed learner's loss ahead of its first update (``GraphedSteps.prepare``;
        nothing else changes). A compile that fails leaves the plain loss for good, as it would
        at the first update (``CompiledLoss.failed``, logged there); any other error is logged
        here, and the first update compiles instead."""
        if self.graphs is None:
            return
        try:
            self.graphs.prepare(rollout_len)
        except Exception as exc:  # the learner is untouched; its first update tries again
            self.optimizer.zero_grad(set_to_none=True)
            logger.warning("the loss was not compiled ahead of the first update: %s", exc)

    def state(self) -> dict[str, Any]:
        """Everything another learner needs to continue exactly where this one is."""
        return {
            "model": self.model.state_dict(),
            "optimizer": portable_state(self.optimizer),
            "version": self.version,
            "trained_steps": self.trained_steps,
            "noise": self.noise.state(),
            "lr_gain": self.lr_gain,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Takes over a ``state()`` (from a learner of the same model, on any device)."""
        self.model.load_state_dict(state["model"], strict=True)
        adopt_state(self.optimizer, state["optimizer"], self.device)  # tensors to our device
        if self.graphs is not None:
            self.graphs.reset()  # they point at the optimiser state just replaced
        self.version = int(state["version"])
        self.trained_steps = int(state["trained_steps"])
        self.noise.load_state(state.get("noise"))
        gain = float(state.get("lr_gain", 1.0))  # states saved before it: 1
        self.lr_gain = min(LR_GAIN_MAX, max(LR_GAIN_MIN, gain)) if math.isfinite(gain) else 1.0

    def current_lr(self) -> float:
        """The learning rate for the next update under the configured schedule."""
        lr = self.config.lr_for(self.batch)
        if self.config.lr_schedule == "adaptive":
            return lr * self.lr_gain
        if self.config.lr_schedule == "constant" or not self.total_steps:
            return lr
        return lr * max(0.0, 1.0 - self.trained_steps / self.total_steps)

    def _tensors(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        out = {
            k: torch.as_tensor(np.asarray(v), device=self.device)
            for k, v in batch.items()
            if k != "versions"
        }
        out["obs"] = out["obs"].float()
        out["rewards"] = out["rewards"].float() * self.config.reward_scale
        out["discounts"] = self.config.gamma * (1.0 - out["dones"].float())
        return out

    def update(self, batch: Mapping[str, np.ndarray] | None, group: Any = None) -> UpdateStats:
        """Runs ``epochs`` x ``minibatches_for(batch)`` gradient steps on one batch; bumps
        ``version``.

        Args:
            batch: The batch, or None for a data-parallel trainer with no rows this update.
            group: A ``runtime.gmi.group.TrainerGroup`` when several trainers train in
                lockstep: observation statistics, step counts and gradients are then summed
                over the group, so every trainer ends the update with the same weights. None
                for a single trainer.
        """
        cfg = self.config
        if batch is None and group is None:
            raise ValueError("an update needs a batch unless it is one of a trainer group")
        n = t = 0
        b: dict[str, torch.Tensor] = {}
        lag = np.zeros(1, np.int64)
        if batch is not None:
            lag = self.version - np.asarray(batch["versions"])
            b = self._tensors(batch)
            n, t = b["rewards"].shape
        lr = self.current_lr()
        set_lr(self.optimizer, lr)
        dim = self.model.obs_norm.mean.shape[0]
        sums = (
            self.model.obs_norm.batch_sums(b["obs"][:, :t])
            if n
            else torch.zeros(1 + 2 * dim, dtype=torch.float64)
        )
        sums = torch.cat([sums, torch.tensor([float(n * t), float(n)], dtype=torch.float64)])
        if group is not None:
            group.sum_(sums)
        if not bool(torch.isfinite(sums).all()):
            raise NonFiniteUpdate(
                f"non-finite observations in the batch for version {self.version + 1}; "
                "the update was not applied"
            )
        graphed = self.graphs if n and group is None else None
        backup = UpdateBackup(self.model, self.optimizer) if graphed is None else None
        self.model.obs_norm.update_from_sums(sums[:-2])
        total_steps, total_rows = int(sums[-2].item()), int(sums[-1].item())
        splits = cfg.minibatches_for(total_steps, total_rows)  # the group's batch: alike in each
        pi_losses, v_losses, entropies = [], [], []
        if graphed is not None:
            graphed.begin()
        self.noise.begin()
        before = None
        for epoch in range(cfg.epochs):
            ret = None
            if n:
                with torch.no_grad():
                    target_logp, _, values, dist = self.model.evaluate_dist(
                        b["obs"][:, :t], b["actions"]
                    )
                    if epoch == 0:
                        before = dist  # the policy before the update's steps
                    bootstrap = self.model.values(b["obs"][:, t])
                    ret = vtrace(
                        b["logp"],
                        target_logp,
                        b["rewards"],
                        values,
                        bootstrap,
                        b["discounts"],
                        cfg.rho_bar,
                        cfg.c_bar,
                        cfg.vtrace_lambda,
                    )
            perm = torch.randperm(n, device=self.device)
            if graphed is not None:
                self._graphed_epoch(graphed, b, ret, perm, epoch == 0, total_steps, splits)
                continue
            for idx in torch.tensor_split(perm, splits):
                self.optimizer.zero_grad(set_to_none=True)
                adv = ret.pg_advantages[idx] if len(idx) else None
                if group is not None:  # over the group's minibatch, as one trainer would
                    adv = group_normalized(adv, group)
                if len(idx):
                    loss, loss_pi, loss_v, entropy = self.minibatch_loss(
                        b["obs"][idx, :t],
                        b["actions"][idx],
                        b["logp"][idx],
                        adv,
                        ret.vs[idx],
                        normalized=group is not None,
                    )
                    loss.backward()
                    pi_losses.append(loss_pi.detach())
                    v_losses.append(loss_v.detach())
                    entropies.append(entropy.detach())
                if group is not None:
                    if group.average_grads_(self.model, float(len(idx))) <= 0:
                        continue  # no trainer had rows for this minibatch
                elif not len(idx):
                    continue
                if epoch == 0:  # before clipping: the gradient as the loss gives it
                    grads = [p.grad for p in self.model.parameters() if p.grad is not None]
                    self.noise.add(grads, total_steps / splits)
                norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                if not bool(torch.isfinite(norm)):
                    assert backup is not None  # made for every eager update
                    backup.restore()  # the steps before this one taken back too
                    raise NonFiniteUpdate(
                        f"non-finite gradient (norm {float(norm)}) in the update to version "
                        f"{self.version + 1}; the update was not applied (the weights and "
                        "optimiser state are as before it)"
                    )
                self.optimizer.step()
        if graphed is not None:  # raises on a non-finite step, before the noise scale takes it
            loss_pi, loss_v, entropy = graphed.finish()
        else:
            loss_pi, loss_v, entropy = _mean(pi_losses), _mean(v_losses), _mean(entropies)
        self.noise.end()
        kl = self._kl(b, before, t, group)
        if cfg.lr_schedule == "adaptive" and kl is not None:
            self.lr_gain = cfg.adapt_lr_gain(self.lr_gain, kl)
        self.version += 1
        self.trained_steps += total_steps
        return UpdateStats(
            steps=n * t,
            policy_lag_mean=float(lag.mean()),
            policy_lag_max=int(lag.max()),
            loss_pi=loss_pi,
            loss_v=loss_v,
            entropy=entropy,
            lr=lr,
            kl=kl,
            noise_scale=self.noise.value,
            batch_samples=total_steps,
            minibatches=splits,
        )

    def _kl(
        self,
        b: Mapping[str, torch.Tensor],
        before: Categorical | Normal | None,
        t: int,
        group: Any,
    ) -> float | None:
        """The KL divergence from the policy before the update's steps (``before``, its
        distribution at the batch's states in the first epoch, after this update's observation
        statistics were taken in) to the policy after them, exact per state and averaged over
        the batch's states; summed over a trainer group, so that every trainer adapts alike.
        None where no trainer had rows."""
        sums = torch.zeros(2, dtype=torch.float64)
        if before is not None:
            with torch.no_grad():
                kl = self.model.kl_from(before, b["obs"][:, :t])
                sums[0] = kl.double().sum().cpu()
                sums[1] = float(kl.numel())
        if group is not None:
            group.sum_(sums)
        if sums[1] <= 0:
            return None
        return float(sums[0] / sums[1])

    def minibatch_loss(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        behaviour_logp: torch.Tensor,
        advantages: torch.Tensor,
        value_targets: torch.Tensor,
        normalized: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One minibatch's loss (the clipped surrogate on normalised advantages, the value loss
        and the entropy bonus), with its policy loss, value loss and mean entropy; the eager
        loop and the CUDA graphs (``policies.graphed_step``) both step on it. ``normalized``:
        the advantages come normalised already (over a trainer group's minibatch)."""
        cfg = self.config
        logp, entropy, v = self.model.evaluate(obs, actions)
        adv = advantages
        if not normalized:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8) if adv.numel() > 1 else adv
        # the ratio bounded to [0.05, 20], as Sample Factory bounds it: a sample many versions
        # stale (its actor's log-prob far below the learner's) neither takes the minibatch's
        # step over nor overflows exp
        ratio = torch.exp((logp - behaviour_logp).clamp(RATIO_LOG_MIN, RATIO_LOG_MAX))
        clipped = ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv
        loss_pi = -torch.min(ratio * adv, clipped).mean()
        loss_v = 0.5 * (v - value_targets).pow(2).mean()
        entropy = entropy.mean()
        loss = loss_pi + cfg.value_coef * loss_v - cfg.entropy_for(self.model.discrete) * entropy
        return loss, loss_pi, loss_v, entropy

    def _graphed_epoch(
        self,
        graphed: GraphedSteps,
        b: dict[str, torch.Tensor],
        ret: Any,
        perm: torch.Tensor,
        first: bool,
        total_steps: int,
        splits: int,
    ) -> None:
        """One epoch's minibatch steps replayed from CUDA graphs (``policies.graphed_step``):
        the same loss, clip and step as the eager loop; the first epoch's gradients feed the
        noise scale."""
        t = b["rewards"].shape[1]
        inputs = {
            "obs": b["obs"][:, :t],
            "actions": b["actions"],
            "logp": b["logp"],
            "adv": ret.pg_advantages,
            "vs": ret.vs,
        }
        for idx in torch.tensor_split(perm, splits):
            if len(idx):
                flat = graphed.step(inputs, idx)
                if first:
                    self.noise.add([flat], total_steps / splits)


def _mean(values: list[torch.Tensor]) -> float:
    """Mean of scalar tensors as a float (one device sync); 0.0 for none."""
    return torch.stack(values).mean().item() if values else 0.0
