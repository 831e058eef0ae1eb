"""The model sampler's acquisition: expected improvement of a normal prediction over the
incumbent, and a trial's expected gain net of what it gives up while it runs
(``autotune.tuning.model_sampler``, step 4)."""

from __future__ import annotations

import math

import numpy as np


def _norm_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * (1 + erf(z / math.sqrt(2)))


def expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float) -> np.ndarray:
    """EI of a normal ``(mu, sigma)`` over ``best``."""
    z = (mu - best) / np.maximum(sigma, 1e-9)
    return sigma * _norm_pdf(z) + (mu - best) * _norm_cdf(z)


def net_gain(
    mu: np.ndarray,
    sigma: np.ndarray,
    best: float | None,
    cost_s: np.ndarray,
    horizon_s: float,
    window_s: float,
) -> np.ndarray:
    """A trial's expected gain (log scale, per second of ``horizon_s + cost_s``): the expected
    improvement over ``best`` kept for ``horizon_s``, less the expected shortfall under it,
    ``E[max(0, best - Y)] = EI - (mu - best)``, over the trial (``window_s`` and half of
    ``cost_s``). With no ``best`` yet (nothing measured) nothing is given up."""
    ref = float(np.max(mu)) if best is None else best
    ei = expected_improvement(mu, sigma, ref)
    shortfall = np.zeros_like(ei) if best is None else np.maximum(ei - (mu - best), 0.0)
    return (ei * horizon_s - shortfall * (window_s + cost_s / 2)) / (horizon_s + cost_s)
