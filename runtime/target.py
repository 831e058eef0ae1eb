"""``--target-return R``: a run that stops at the first 100-episode mean return of at least R,
and what it took to get there (trained steps, seconds and joules, from the first run's start).

The check runs every tick of the runner once the return window holds ``RETURN_WINDOW``
episodes (a resumed run's window starts with its checkpoint's). When it is met, the figures
are taken at that tick and the run drains as at its step target (what is in flight is still
trained, and counted in the result's totals, not in the target's figures). A run that ends
without reaching it says so, with the best 100-episode mean it had and what it spent without
getting there (``spent``: its trained steps, seconds and joules, counted as a reached target's).

The seconds and joules the run's ``auto`` sizing spent probing before it began are added to
the run's own (``RunTotals.add_sizing``; the result's energy window starts with the run).

A run that goes on from a checkpoint counts the runs before it too: their trained steps, and
their seconds and joules where the last of them ended cleanly and saved them
(``checkpoint.save_returns``). Where it did not (it was killed), the seconds and joules are this
run's only, and the target section says so.
"""

from __future__ import annotations

import math
from typing import Any

from runtime.telemetry import RETURN_WINDOW


class RunTotals:
    """Trained steps, seconds and joules of the runs before this one (0 without a checkpoint;
    seconds and joules None where the earlier runs did not save them)."""

    def __init__(self, steps: int = 0, before: dict[str, float] | None = None) -> None:
        self.steps = steps
        self.known = steps == 0 or before is not None
        self.seconds = (before or {}).get("seconds", 0.0)
        self.joules = (before or {}).get("joules", 0.0)
        self.sizing: dict[str, float] | None = None
        """This run's sizing probes (seconds, joules), counted in ``seconds`` and ``joules``."""

    def add_sizing(self, seconds: float, joules: float) -> None:
        """Counts what this run's ``auto`` sizing spent before the run began."""
        self.sizing = {"seconds": float(seconds), "joules": float(joules)}
        self.seconds += float(seconds)
        self.joules += float(joules)

    @classmethod
    def of(cls, cfg: Any, resume: Any) -> RunTotals:
        """The totals saved with the checkpoint ``resume`` (``checkpoint.check``) goes on from."""
        if resume is None:
            return cls()
        from runtime import checkpoint

        return cls(
            resume.trained_steps, checkpoint.load_totals(cfg.checkpoint, resume.trained_steps)
        )

    def through(self, seconds: float, joules: float) -> dict[str, float] | None:
        """All runs' seconds and joules, this one's so far added (to save with the checkpoint);
        None where the earlier runs' are not known (the runs after stay unknown too)."""
        if not self.known:
            return None
        return {"seconds": self.seconds + seconds, "joules": self.joules + joules}


class TargetReturn:
    """Watches a run's return window for ``target`` (None: no target, never met)."""

    def __init__(self, target: float | None, before: RunTotals | None = None) -> None:
        self.target = target
        self.before = before or RunTotals()
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
            spent = float(joules())
            self.reached = {
                "steps": self.before.steps + telemetry.trained_steps,
                "seconds": self.before.seconds + elapsed_s,
                "joules": self.before.joules + spent,
                "return_then": mean,
            }
        return self.reached is not None

    def doc(self, until: tuple[int, float, float] | None = None) -> dict[str, Any] | None:
        """The result's ``target`` section (None without a target); ``until``: the run's own
        trained steps, seconds and joules at its end, for what an unmet target cost."""
        if self.target is None:
            return None
        out: dict[str, Any] = {"return": self.target}
        if self.reached is None:
            out.update(reached=False, best_return=self.best)
            if until is not None:
                steps, seconds, joules = until
                out["spent"] = {
                    "steps": self.before.steps + steps,
                    "seconds": self.before.seconds + seconds,
                    "joules": self.before.joules + joules,
                }
        else:
            out.update(reached=True, **self.reached, best_return=self.best)
        sizing = self.before.sizing or {"seconds": 0.0, "joules": 0.0}
        if self.before.sizing is not None:
            out["sizing"] = {**sizing, "note": "this run's probes, before it began: counted above"}
        if self.before.steps:
            known = self.before.known
            out["earlier_runs"] = {
                "steps": self.before.steps,
                "seconds": self.before.seconds - sizing["seconds"] if known else None,
                "joules": self.before.joules - sizing["joules"] if known else None,
                "note": "counted in the figures above"
                if self.before.known
                else "their seconds and joules were not saved (a run killed): the figures "
                "above count their steps, and this run's seconds and joules only",
            }
        return out
