"""Measurement windows that end when they know enough.

The tuner reads the job's counters (``autotune.tuning.counters``) about once a second while it
measures. A window ends once its steps/J (or steps/s) estimate's 95 % interval is within
``target`` of the estimate, and not before ``floor_s`` nor after ``ceiling_s``. The interval has
two parts:

* **lumps**: trained steps arrive a batch at a time, so the count at either edge of the window
  may be off by up to a batch (uniform); one batch more or less over ``S`` trained steps moves the
  estimate by ``B / S``, and its share of the interval is ``1.96 * B / (sqrt(6) * S)``: with
  3 %, a window holds about 27 batches;
* **power**: the spread of the watts between readings (at least three), over the square root
  of their count, is the standard error of the joules' side.

Throughput that drifts within a window is not separated from the batches' lumps at one
reading a second; the ceiling bounds how long a window may wait.

Under the goodput objective, where the tuner may change the batch size, a window also ends
before it is otherwise done (``ends_early``) once its batch's statistical efficiency has moved
by ``EFFICIENCY_MOVED`` either way (``efficiency_moved``) and its estimate is within
``EARLY_TARGET`` times the target: the learner's noise scale grows as a run learns, fastest at
its start (Ant-v5 on an H200 host: about 150 samples to 7k over its first 30 s), and a window
that waits for its floor trains at a batch rated at a noise scale that is no longer there. The
tuner then picks the next config at the new noise scale, as Pollux re-picks its batch size as
the noise scale moves.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from autotune.tuning.counters import Counters
from policies.noise_scale import efficiency

Z95 = 1.96
SAMPLE_S = 1.0
"""How often the tuner reads the counters while it measures."""
MIN_BLOCKS = 3
EFFICIENCY_MOVED = 1.5
"""The factor by which a goodput window's batch efficiency must move for the window to end early."""
EARLY_TARGET = 3.0
"""A window that ends early still needs its 95 % interval within this many times the target
(with 3 %: about 10 batches, where three batches alone leave it at 27 %)."""


@dataclass(frozen=True)
class WindowRule:
    """When a window may end (see the module docstring)."""

    floor_s: float = 5.0
    ceiling_s: float = 30.0
    target: float = 0.03
    """The 95 % interval's half-width, as a share of the estimate."""

    def problems(self) -> list[str]:
        out = []
        if not 0 < self.floor_s <= self.ceiling_s:
            out.append(
                f"window floor {self.floor_s} s and ceiling {self.ceiling_s} s: need "
                "0 < floor <= ceiling"
            )
        if not 0 < self.target < 1:
            out.append(f"window target {self.target}: must be a share in (0, 1), e.g. 0.03")
        return out


def _rate(a: Counters, b: Counters, per_joule: bool) -> float | None:
    steps = b.trained_steps - a.trained_steps
    span = (b.gpu_j + b.cpu_j - a.gpu_j - a.cpu_j) if per_joule else (b.t_s - a.t_s)
    return steps / span if span > 0 else None


def half_width(samples: list[Counters], batch: int | None, per_joule: bool = True) -> float:
    """The 95 % interval's half-width of the window's rate, as a share of it (inf when it
    cannot be told yet: no steps, or fewer than three blocks)."""
    if len(samples) < 2:
        return math.inf
    first, last = samples[0], samples[-1]
    total = last.trained_steps - first.trained_steps
    rate = _rate(first, last, per_joule)
    if total <= 0 or not rate:
        return math.inf
    lump = Z95 * (batch or 0) / (math.sqrt(6) * total)
    k = len(samples) - 1
    if k < MIN_BLOCKS:
        return math.inf
    if not per_joule:
        return lump
    watts = []
    for a, b in itertools.pairwise(samples):
        span = b.t_s - a.t_s
        if span > 0:
            watts.append((b.gpu_j + b.cpu_j - a.gpu_j - a.cpu_j) / span)
    if len(watts) < MIN_BLOCKS:
        return math.inf
    mean = sum(watts) / len(watts)
    var = sum((w - mean) ** 2 for w in watts) / (len(watts) - 1)
    drift = Z95 * math.sqrt(var / len(watts)) / mean if mean > 0 else math.inf
    return math.hypot(lump, drift)


def window_done(
    rule: WindowRule, samples: list[Counters], batch: int | None, per_joule: bool = True
) -> bool:
    """Whether a window of ``samples`` (the first at its start) may end now."""
    if len(samples) < 2:
        return False
    span = samples[-1].t_s - samples[0].t_s
    if span >= rule.ceiling_s:
        return True
    return span >= rule.floor_s and half_width(samples, batch, per_joule) <= rule.target


def efficiency_moved(
    samples: list[Counters], batch: int | None, factor: float = EFFICIENCY_MOVED
) -> bool:
    """Whether the efficiency of ``batch`` at the window's newest noise scale is ``factor`` or
    more away (either way) from its efficiency at the first reading that had an estimate, with
    ``MIN_BLOCKS`` readings after the window's first and ``MIN_BLOCKS`` batches trained since."""
    if not batch or len(samples) <= MIN_BLOCKS:
        return False
    if samples[-1].trained_steps - samples[0].trained_steps < MIN_BLOCKS * batch:
        return False
    noise = [c.noise_scale for c in samples if c.noise_scale and c.noise_scale > 0]
    if len(noise) < 2:
        return False
    first, last = efficiency(noise[0], batch), efficiency(noise[-1], batch)
    return bool(first and last) and max(first / last, last / first) >= factor


def ends_early(
    rule: WindowRule, samples: list[Counters], batch: int | None, per_joule: bool = True
) -> bool:
    """Whether a goodput window may end before ``window_done``: its batch's efficiency moved
    (``efficiency_moved``) and its estimate is within ``EARLY_TARGET`` times the target."""
    if not efficiency_moved(samples, batch):
        return False
    return half_width(samples, batch, per_joule) <= EARLY_TARGET * rule.target
