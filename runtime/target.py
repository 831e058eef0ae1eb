"""``--target-return R``: a run that stops at the first 100-episode mean return of at least R,
and what it took to get there (trained steps, seconds and joules, from the run's start).

The check runs every tick of the runner once the return window holds ``RETURN_WINDOW``
episodes (a resumed run's window starts with its checkpoint's). When it is met, the figures
are taken at that tick and the run drains as at its step target (what is in flight is still
trained, and counted in the result's totals, not in the target's figures). A run that ends
without reaching it says so, with the best 100-episode mean it had.
"""

from __future__ import annotations

import math
from typing import Any

from runtime.telemetry import RETURN_WINDOW


class TargetReturn:
    """Watches a run's return window for ``target`` (None: no target, never met)."""

    def __init__(self, target: float | None) -> None:
        self.target = target
        self.reached: dict[str, float] | None = None
        self.best: float | None = None

    def check(self, telemetry: Any, elapsed_s: float, joules: Any) -> bool:
        """Whether the target is met now (``joules``: called for the run's joules so far)."""
        if self.target is None or len(telemetry.returns) < RETURN_WINDOW:
            return self.reached is not None
        mean = telemetry.return_mean
        if mean is not None and math.isfinite(mean):
            self.best = mean if self.best is None else max(self.best, mean)
        if self.reached is None and mean is not None and mean >= self.target:
            self.reached = {
                "steps": telemetry.trained_steps,
                "seconds": elapsed_s,
                "joules": float(joules()),
                "return_then": mean,
            }
        return self.reached is not None

    def doc(self) -> dict[str, Any] | None:
        """The result's ``target`` section (None without a target)."""
        if self.target is None:
            return None
        if self.reached is None:
            return {"return": self.target, "reached": False, "best_return": self.best}
        return {"return": self.target, "reached": True, **self.reached, "best_return": self.best}
