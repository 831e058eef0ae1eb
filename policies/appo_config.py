"""The APPO learner's hyper-parameters, free of torch so configs and the CLI load fast."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

LR_SCHEDULES = ("adaptive", "linear", "constant")
LR_SCALINGS = ("none", "sqrt", "linear")
LR_GAIN_MIN, LR_GAIN_MAX = 0.01, 10.0
"""How far the ``adaptive`` schedule may take the learning rate from ``lr`` (for its batch)."""
DISCRETE_ENTROPY_COEF = 0.01
"""The entropy bonus weight for discrete actions when none is given."""


@dataclass(frozen=True)
class APPOConfig:
    """Learner hyper-parameters."""

    lr: float = 2e-3
    """Adam learning rate (the starting value under the ``adaptive`` and ``linear``
    schedules). The default suits small tasks such as CartPole; MuJoCo locomotion usually
    wants about 3e-4 (the ``adaptive`` schedule finds its way there)."""
    lr_schedule: str = "adaptive"
    """``adaptive``: keep each update's KL divergence near ``kl_target`` (``adapt_lr_gain``);
    ``linear``: anneal to 0 over the run's step budget; ``constant``: keep ``lr``. On the
    2-core machine, with ``auto`` sizing, ``adaptive`` learned Pendulum-v1 to -165..-186 where
    ``linear`` reached -574..-748, and PointReach-v0, Hopper-v5 and HalfCheetah-v5 further
    than ``linear`` (3 seeds each; docs/BENCHMARKS.md, the CLI's defaults)."""
    kl_target: float = 0.016
    """The KL divergence per update (old policy to new, on the batch) that the ``adaptive``
    schedule steers to. With the default 4 epochs x 4 minibatches, 0.016 learned all five
    workloads measured on the 2-core machine as far as 0.008 (rl_games' usual threshold) or
    further (HalfCheetah-v5 1,161-1,253 against 906-999 at 1M steps)."""
    lr_scaling: str = "none"
    """How ``lr`` follows the batch size when it changes during a run (a tuner's change):
    ``none``, ``sqrt`` or ``linear`` in the ratio of the batch to ``lr_batch``."""
    lr_batch: int | None = None
    """The batch size ``lr`` is for (set to the run's batch when it starts with a scaling)."""
    gamma: float = 0.99
    """Discount factor."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches per pass (split by trajectory)."""
    min_minibatch: int = 0
    """The fewest samples a minibatch may hold: an update whose batch is too small for
    ``minibatches`` of this many is split into fewer (``minibatches_for``), so a tuner that
    shrinks the batch keeps the minibatches' size, not their count. 0: always
    ``minibatches``. The batches a tuner or the sizing may pick still follow ``minibatches``
    (``autotune.tuning.knobs.batch_fits``): the floor changes how a batch is split, not which
    batches are tried. On Ant-v5 (an H200 host, 15 actors x 8 envs, batches of 4,096, 10 epochs,
    the KL-steered rate) 8 minibatches of 512 reached a return of 1,000 after 2.5M steps and
    29 kJ where 32 of 128 took 6.0M and 58 kJ: every one of the many small steps moved the
    policy, the schedule cut the rate to 1.8e-5, and learning stalled (docs/BENCHMARKS.md)."""
    clip: float = 0.2
    """PPO ratio clip."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float | None = None
    """Weight of the entropy bonus; None: by action space (``entropy_for``), 0.01 for
    discrete actions and 0 for continuous ones, as SB3 and CleanRL default for continuous
    control (a bonus there can widen the action distribution until the policy diverges)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    rho_bar: float = 1.0
    """V-trace importance-weight clip."""
    c_bar: float = 1.0
    """V-trace trace clip."""
    vtrace_lambda: float = 0.95
    """V-trace trace decay (on-policy, the value targets are GAE(lambda)'s returns); 1.0 is
    plain V-trace."""
    reward_scale: float = 1.0
    """Multiplies rewards before learning (e.g. 0.1 for Pendulum's large negative rewards)."""
    normalize_obs: bool = True
    """Running observation normalisation inside the policy."""
    normalize_reward: bool = False
    """Rewards divided by the running std of their discounted returns, in the actors
    (``runtime.reward_norm``), as CleanRL's continuous PPO does. Off by default: on the 2-core
    machine it let Pendulum-v1 learn with no reward flags (-254 and -152 against -1,217 and
    -1,112 at 300k steps), but PointReach-v0 (``examples/custom_env.py``) learned less with it
    (-76 and -92 against -41 and -41)."""
    max_policy_lag: int = 1000
    """Trajectories whose oldest step lags the learner by more than this are discarded."""
    compile_loss: bool = True
    """Fuse the minibatch loss's kernels with ``torch.compile`` where the learner replays CUDA
    graphs (a single CUDA trainer; ``policies.compiled_loss``). Off: the plain loss, the same
    arithmetic in more kernels. Nothing changes on the CPU or in a trainer group."""

    def problems(self) -> list[str]:
        """Every invalid field, described with what is allowed."""
        out = []
        for name in (
            "lr",
            "clip",
            "max_grad_norm",
            "rho_bar",
            "c_bar",
            "reward_scale",
            "kl_target",
        ):
            if not finite_number(getattr(self, name), above=0.0):
                out.append(f"learner.{name}={getattr(self, name)!r}: must be a finite number > 0")
        for name in ("normalize_reward", "compile_loss"):
            if not isinstance(getattr(self, name), bool):
                out.append(f"learner.{name}={getattr(self, name)!r}: allowed true, false")
        if self.lr_scaling not in LR_SCALINGS:
            out.append(f"learner.lr_scaling={self.lr_scaling!r}: allowed {LR_SCALINGS}")
        if self.lr_batch is not None and not (
            isinstance(self.lr_batch, int)
            and not isinstance(self.lr_batch, bool)
            and self.lr_batch > 0
        ):
            out.append(f"learner.lr_batch={self.lr_batch!r}: must be a batch size > 0 (or unset)")
        if self.lr_schedule not in LR_SCHEDULES:
            out.append(f"learner.lr_schedule={self.lr_schedule!r}: allowed {LR_SCHEDULES}")
        for name in ("gamma", "vtrace_lambda"):
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and 0.0 < value <= 1.0):
                out.append(f"learner.{name}={getattr(self, name)!r}: must be in (0, 1]")
        for name in ("epochs", "minibatches", "max_policy_lag"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                out.append(f"learner.{name}={getattr(self, name)!r}: must be an integer >= 1")
        m = self.min_minibatch
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            out.append(f"learner.min_minibatch={m!r}: must be an integer >= 0 (0: off)")
        for name in ("value_coef", "entropy_coef"):
            if name == "entropy_coef" and self.entropy_coef is None:
                continue  # by action space
            if not finite_number(getattr(self, name), at_least=0.0):
                out.append(f"learner.{name}={getattr(self, name)!r}: must be a finite number >= 0")
        return out

    def minibatches_for(self, samples: int, rows: int | None = None) -> int:
        """The minibatches an update of ``samples`` in ``rows`` trajectories splits into:
        ``minibatches``, or fewer where each would hold fewer than ``min_minibatch`` samples
        (one at least, however small the batch). Minibatches take whole trajectories, so with
        ``rows`` each is given enough of them to reach the floor."""
        if self.min_minibatch <= 0:
            return self.minibatches
        if rows:
            per_row = max(1, samples // rows)
            return max(1, min(self.minibatches, rows // -(-self.min_minibatch // per_row)))
        return max(1, min(self.minibatches, samples // self.min_minibatch))

    def batch_problem(self, batch: object, rollout_len: object) -> str | None:
        """Why a batch of ``batch`` steps in trajectories of ``rollout_len`` cannot be split
        into this learner's minibatches (fewer trajectories than minibatches: some would be
        empty), or None."""
        counts = (batch, rollout_len, self.minibatches, self.min_minibatch)
        if not all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
            return None  # each is refused on its own
        if rollout_len < 1 or self.minibatches < 1:
            return None
        rows = batch // rollout_len
        if rows < 1 or self.minibatches_for(batch, rows) <= rows:
            return None
        least = self.minibatches * rollout_len
        return (
            f"batch_size={batch}: {rows} trajectories of {rollout_len} steps cannot fill "
            f"learner.minibatches={self.minibatches}; allowed a batch of at least {least} "
            f"(minibatches x rollout_len), or fewer minibatches"
        )

    def lr_for(self, batch: int | None) -> float:
        """``lr`` scaled for a batch of ``batch`` steps (``lr_scaling``; None: unscaled)."""
        if self.lr_scaling == "none" or not batch or not self.lr_batch:
            return self.lr
        ratio = batch / self.lr_batch
        return self.lr * (ratio if self.lr_scaling == "linear" else math.sqrt(ratio))

    def adapt_lr_gain(self, gain: float, kl: float) -> float:
        """The ``adaptive`` schedule's next gain on ``lr_for(batch)`` after an update whose KL
        divergence was ``kl``: divided by 1.5 past twice ``kl_target``, multiplied by 1.5 under
        half of it, else kept; bounded to [``LR_GAIN_MIN``, ``LR_GAIN_MAX``]. A KL that is not
        finite lowers the gain too."""
        if not math.isfinite(kl) or kl > 2.0 * self.kl_target:
            gain /= 1.5
        elif kl < 0.5 * self.kl_target:
            gain *= 1.5
        return min(LR_GAIN_MAX, max(LR_GAIN_MIN, gain))

    def entropy_for(self, discrete: bool) -> float:
        """The entropy bonus weight for a policy with ``discrete`` (else continuous) actions."""
        if self.entropy_coef is not None:
            return self.entropy_coef
        return DISCRETE_ENTROPY_COEF if discrete else 0.0

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def finite_number(value: object, above: float | None = None, at_least: float | None = None) -> bool:
    """Whether ``value`` is a real number (not a bool, NaN or infinite) past the bound."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return (above is None or value > above) and (at_least is None or value >= at_least)
