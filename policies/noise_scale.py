"""The gradient noise scale of the learner's updates, and the statistical efficiency of a batch.

McCandlish et al., "An Empirical Model of Large-Batch Training" (2018), Appendix A: with the
squared norms of gradients taken over a small and a big batch (``B_small``, ``B_big`` samples),

    |G|^2 ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    S     ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

are unbiased estimates of the true gradient's squared norm and of the trace of the per-sample
gradient covariance; the simple noise scale is ``B_noise = S / |G|^2``. Each is noisy, so each
is smoothed on its own (an exponential moving average) before the ratio, as the paper does.

The learner has both norms for free: every optimiser step of an update's first epoch takes the
gradient of one minibatch. Consecutive steps are paired: in each pair the two minibatch
gradients are the small batches and their mean is the gradient of their union (the big one),
and the pairs' squared norms are averaged over the epoch. The weights move one step between
the two of a pair, so both are taken almost at one point. (The mean over the whole epoch as
the big gradient would be taken along the epoch's whole path: its norm shrinks as the direction
turns, and the noise scale comes out too large.)

The statistical efficiency of a step of ``B`` samples (McCandlish et al.: a run needs
``E_min (1 + B / B_noise)`` samples to a given loss) is ``B_noise / (B_noise + B)``: the share of
each sample's worth that a batch of ``B`` keeps against a tiny batch. Pollux's goodput is
throughput times this. For a PPO-style learner the step is the whole batch of an update, not
one minibatch: the ratio clip bounds how far one update moves the policy, however many epochs
and minibatches it takes, so a run's progress is counted in updates, and an update is worth
more than its minibatches only while its batch is below the noise scale. (Measured on Ant-v5
with the KL-steered rate, batches of 4,096 against 65,536, each run's steps summed at this
efficiency (``efficient_samples`` in ``bench/suites/goodput.py``): the model rated the small
batch about right to a return of 390 and 2x too high to 1,000, where counting one minibatch
as the step would have fitted instead.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is the learner's: ``efficiency`` serves the CLI, which must not load it
    import torch

DECAY = 0.95
"""Weight of the past in each moving average per ``DECAY_SAMPLES`` samples trained on."""
DECAY_SAMPLES = 32_768
"""The moving averages forget per sample, not per update: an update of ``B`` samples keeps
``DECAY ** (B / DECAY_SAMPLES)`` of the past, so a run of small batches, whose many estimates
are each noisier, averages over as many samples as a run of big ones (about 650k: 20 s of Ant-v5
on a 16-core host). Per update, 4,096-sample batches moved the estimate between 1.2k and 58k
within seconds on Ant-v5, and a goodput tuner read whichever it met."""


def efficiency(noise_scale: float | None, batch: float) -> float | None:
    """``B_noise / (B_noise + batch)``: see the module docstring (None without an estimate)."""
    if noise_scale is None or batch <= 0:
        return None
    return max(noise_scale, 0.0) / (max(noise_scale, 0.0) + batch)


def goodput_per_joule(steps_per_joule: float, noise_scale: float | None, batch: float) -> float:
    """Steps per joule times the efficiency of ``batch`` at ``noise_scale`` (0 without one)."""
    return steps_per_joule * (efficiency(noise_scale, batch) or 0.0)


class NoiseScale:
    """The running estimate (see the module docstring). Per update: ``begin``, then ``add``
    each of the first epoch's minibatch gradients in order, then ``end``."""

    def __init__(self, decay: float = DECAY, per_samples: float = DECAY_SAMPLES) -> None:
        self.decay, self.per_samples = decay, per_samples
        self.g2: float | None = None  # EMA of |G|^2
        self.s: float | None = None  # EMA of S
        self._prev: tuple[torch.Tensor, float] | None = None  # the first of a pair
        self._small: torch.Tensor | None = None  # sums over pairs; on the learner's device,
        self._big: torch.Tensor | None = None  # so no sync per step
        self._pairs = 0
        self._samples = 0.0

    def begin(self) -> None:
        self._prev, self._small, self._big, self._pairs = None, None, None, 0

    def add(self, grads: list[torch.Tensor], samples: float) -> None:
        """One minibatch's (already averaged) gradient, over ``samples`` samples."""
        import torch

        flat = torch.cat([g.detach().reshape(-1).double() for g in grads])
        if self._prev is None or self._prev[1] != samples:
            self._prev = (flat, samples)
            return
        first, self._prev = self._prev[0], None
        small = (first.dot(first) + flat.dot(flat)) / 2
        mean = (first + flat) / 2
        big = mean.dot(mean)
        self._small = small if self._small is None else self._small.add_(small)
        self._big = big if self._big is None else self._big.add_(big)
        self._pairs += 1
        self._samples = samples

    def end(self) -> None:
        """Folds this update's estimates in (needs two or more minibatches of equal size)."""
        if not self._pairs or self._small is None or self._big is None:
            return
        b_small, b_big = self._samples, 2 * self._samples
        small2 = float(self._small) / self._pairs  # the update's device syncs for the estimate
        big2 = float(self._big) / self._pairs
        g2 = (b_big * big2 - b_small * small2) / (b_big - b_small)
        s = (small2 - big2) / (1.0 / b_small - 1.0 / b_big)
        self.fold(g2, s, 2 * self._pairs * self._samples)

    def fold(self, g2: float, s: float, samples: float) -> None:
        """Folds one update's estimates of |G|^2 and S, taken over ``samples``, into the
        moving averages (see ``DECAY_SAMPLES``)."""
        d = self.decay ** (samples / self.per_samples)
        self.g2 = g2 if self.g2 is None else d * self.g2 + (1 - d) * g2
        self.s = s if self.s is None else d * self.s + (1 - d) * s

    def state(self) -> dict[str, float | None]:
        """The moving averages, for a learner that takes over (a hand-over or a checkpoint)."""
        return {"g2": self.g2, "s": self.s}

    def load_state(self, state: object) -> None:
        """Takes over ``state()``; a state that is not one (an older checkpoint has none) leaves
        the estimate empty, to be measured afresh."""
        ok = isinstance(state, dict) and all(
            isinstance(state.get(k), float) or state.get(k) is None for k in ("g2", "s")
        )
        self.g2, self.s = (state["g2"], state["s"]) if ok else (None, None)

    @property
    def value(self) -> float | None:
        """``B_noise`` in samples (None until estimated, or while |G|^2 is not above 0)."""
        if self.g2 is None or self.s is None or self.g2 <= 0:
            return None
        return max(self.s, 0.0) / self.g2
