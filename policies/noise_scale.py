"""The gradient noise scale of the learner's updates, and the statistical efficiency of a batch.

McCandlish et al., "An Empirical Model of Large-Batch Training" (2018), Appendix A: with the
squared norms of gradients taken over a small and a big batch (``B_small``, ``B_big`` samples),

    |G|^2 ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    S     ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

are unbiased estimates of the true gradient's squared norm and of the trace of the per-sample
gradient covariance; the simple noise scale is ``B_noise = S / |G|^2``. Each is noisy, so each
is smoothed on its own (an exponential moving average) before the ratio, as the paper does.

The learner has both norms for free: every optimiser step of an update's first epoch takes the
gradient of one minibatch (the small batch), and their mean over the epoch stands for the
gradient of the whole batch (the big one). The weights move between those steps, so the big
gradient is taken along a short path rather than at one point: an approximation that is
tighter the smaller each step is.

The statistical efficiency of a step of ``B`` samples (McCandlish et al.: a run needs
``E_min (1 + B / B_noise)`` samples to a given loss) is ``B_noise / (B_noise + B)``: the share of
each sample's worth that a batch of ``B`` keeps against a tiny batch. Pollux's goodput is
throughput times this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is the learner's: ``efficiency`` serves the CLI, which must not load it
    import torch

DECAY = 0.95
"""Weight of the past in each moving average (about 20 updates)."""


def efficiency(noise_scale: float | None, batch: float) -> float | None:
    """``B_noise / (B_noise + batch)``: see the module docstring (None without an estimate)."""
    if noise_scale is None or batch <= 0:
        return None
    return max(noise_scale, 0.0) / (max(noise_scale, 0.0) + batch)


class NoiseScale:
    """The running estimate (see the module docstring). Per update: ``begin``, then ``add``
    each of the first epoch's minibatch gradients, then ``end``."""

    def __init__(self, decay: float = DECAY) -> None:
        self.decay = decay
        self.g2: float | None = None  # EMA of |G|^2
        self.s: float | None = None  # EMA of S
        self._sum: torch.Tensor | None = None
        self._sq: torch.Tensor | None = None  # stays on the learner's device: no sync per step
        self._samples: list[float] = []

    def begin(self) -> None:
        self._sum, self._sq, self._samples = None, None, []

    def add(self, grads: list[torch.Tensor], samples: float) -> None:
        """One minibatch's (already averaged) gradient, over ``samples`` samples."""
        import torch

        flat = torch.cat([g.detach().reshape(-1).double() for g in grads])
        self._sum = flat.clone() if self._sum is None else self._sum.add_(flat)
        sq = flat.dot(flat)
        self._sq = sq if self._sq is None else self._sq.add_(sq)
        self._samples.append(samples)

    def end(self) -> None:
        """Folds this update's estimates in (needs two or more minibatches of equal size)."""
        k = len(self._samples)
        if k < 2 or self._sum is None or self._sq is None:
            return
        b_small = sum(self._samples) / k
        b_big = sum(self._samples)
        small2 = float(self._sq) / k  # the update's one device sync for the estimate
        mean = self._sum / k
        big2 = float(mean.dot(mean))
        g2 = (b_big * big2 - b_small * small2) / (b_big - b_small)
        s = (small2 - big2) / (1.0 / b_small - 1.0 / b_big)
        d = self.decay
        self.g2 = g2 if self.g2 is None else d * self.g2 + (1 - d) * g2
        self.s = s if self.s is None else d * self.s + (1 - d) * s

    @property
    def value(self) -> float | None:
        """``B_noise`` in samples (None until estimated, or while |G|^2 is not above 0)."""
        if self.g2 is None or self.s is None or self.g2 <= 0:
            return None
        return max(self.s, 0.0) / self.g2
