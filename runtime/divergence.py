"""A warning that a run is diverging, given once, in the log and in the result.

Two signs, each judged from what the runner already receives:

* **The return falls well below where it started, and stays there**: the mean of the last 100
  episodes drops below the first such mean by more than ``DROP_SHARE`` of its size, and by more
  than ``SPREAD_SHARE`` times the spread (standard deviation) of those first episodes' returns,
  at least ``AFTER_EPISODES`` episodes later, and is still below it ``FIRST_EPISODES`` episodes
  after that, and after the learner has made as many updates again as it had when the drop was
  first seen (``PERSIST_UPDATES`` at least). A run starts near random-action returns; a learner that
  diverges ends below them, as the defaults did on a 20-action env before the entropy bonus
  for continuous actions was dropped. An early dip that recovers is not reported: with 120
  envs, Ant-v5's first episodes end hundreds a second, and its mean return dipped from -37 to
  -100 and back within 0.2M steps (about 50 updates of 4,096), which episodes alone called a
  divergence in every run. The spread matters where the first mean is near zero: Ant-v5's
  first episodes return about -25 to -42 with a spread of about 35, so half the mean's size
  called the learning dip of every sized run with batches of 32,768 (to -38..-51, lasting past
  its updates, which come 8x slower) a divergence; a diverged policy's returns fall by
  hundreds.
* **The policy's action spread runs away** (continuous actions): the per-dimension log std,
  read from the learner's reported entropy of its Gaussian, grows by ``STD_GROWTH`` (ten times
  the first std) or reaches the policy's clamp.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from policies.numpy_policy import LOG_STD_MAX

logger = logging.getLogger(__name__)

FIRST_EPISODES = 100
"""The starting level is the mean return of the first this-many finished episodes."""
AFTER_EPISODES = 200
"""A drop counts only this many episodes after the starting level was taken."""
DROP_SHARE = 0.5
SPREAD_SHARE = 3.0
"""A drop must also exceed this many standard deviations of the first episodes' returns."""
PERSIST_UPDATES = 10
"""The fewest learner updates a drop must outlast (see the module docstring)."""
STD_GROWTH = math.log(10.0)
GAUSSIAN_ENTROPY_0 = 0.5 * math.log(2 * math.pi * math.e)
"""The entropy of a unit Gaussian, per dimension: entropy / dims minus this is the log std."""


@dataclass
class DivergenceWatch:
    """Watches a run's returns and its policy's spread (see the module docstring).

    Args:
        act_dim: Action dimensions of a continuous policy; None for discrete actions.
    """

    act_dim: int | None = None
    first_return: float | None = None
    first_episodes: int = 0
    first_spread: float = 0.0
    """The standard deviation of the first episodes' returns (0 where not given)."""
    first_log_std: float | None = None
    below_since: int | None = None
    """The episode count at which the mean return was first seen below the floor."""
    below_updates: int | None = None
    """The learner's updates then (None: not reported)."""
    found: dict[str, Any] | None = None
    """What was found (``sign``, the figures, ``episodes``), or None."""

    def check(
        self,
        episodes: int,
        return_mean: float | None,
        entropy: Any,
        updates: int | None = None,
        spread: float | None = None,
    ) -> None:
        """Takes the run's episode count, its mean return, the learner's entropy, its updates
        so far (None where not reported yet) and the spread of the returns the mean is over
        (read when the starting level is taken); warns once when a sign shows."""
        if self.found is not None:
            return
        if self.first_return is None and episodes >= FIRST_EPISODES and return_mean is not None:
            self.first_return, self.first_episodes = return_mean, episodes
            self.first_spread = float(spread or 0.0)
        elif self.first_return is not None and return_mean is not None:
            floor = self.first_return - max(
                DROP_SHARE * max(abs(self.first_return), 1.0), SPREAD_SHARE * self.first_spread
            )
            below = episodes >= self.first_episodes + AFTER_EPISODES and return_mean < floor
            if not below:
                self.below_since = None
            elif self.below_since is None:
                self.below_since, self.below_updates = episodes, updates
            elif episodes >= self.below_since + FIRST_EPISODES and self._outlasted(updates):
                self._found("return", first_return=self.first_return, return_mean=return_mean)
        if self.act_dim and isinstance(entropy, int | float) and math.isfinite(entropy):
            log_std = entropy / self.act_dim - GAUSSIAN_ENTROPY_0
            if self.first_log_std is None:
                self.first_log_std = log_std
            elif log_std - self.first_log_std >= STD_GROWTH or log_std >= LOG_STD_MAX - 0.05:
                self._found(
                    "action_std",
                    first_std=math.exp(self.first_log_std),
                    std=math.exp(log_std),
                )
        if self.found is not None:
            self.found["episodes"] = episodes

    def _outlasted(self, updates: int | None) -> bool:
        """Whether the learner has made as many updates again since the drop was first seen
        (``PERSIST_UPDATES`` at least); True where its updates are not reported."""
        start = self.below_updates
        if updates is None or start is None:
            return True
        return updates >= max(2 * start, start + PERSIST_UPDATES)

    def _found(self, sign: str, **figures: float) -> None:
        self.found = {"sign": sign, **figures}
        if sign == "return":
            logger.warning(
                "the run may be diverging: the mean return fell to %.4g from %.4g over its "
                "first %d episodes; check the learner's settings (e.g. --entropy-coef, --lr)",
                figures["return_mean"],
                figures["first_return"],
                self.first_episodes,
            )
        else:
            logger.warning(
                "the run may be diverging: the policy's action std grew to %.3g from %.3g; "
                "check the learner's settings (e.g. --entropy-coef, --lr)",
                figures["std"],
                figures["first_std"],
            )
