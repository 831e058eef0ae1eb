"""Phases of a run: one per GMI generation, each with its own energy window."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Phase:
    """A stretch of the run with one set of GMIs, and what it trained per joule."""

    generation: int
    mps_pct: list[int | None]
    start_s: float
    trained_at_start: int
    end_s: float | None = None
    trained_steps: int = 0
    energy: Any = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "generation": self.generation,
            "mps_pct": self.mps_pct,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "trained_steps": self.trained_steps,
        }
        if self.energy is not None and self.end_s is not None:
            e = self.energy.to_dict()
            total = e["gpu_j"] + e["cpu_j"]
            span = self.end_s - self.start_s
            doc.update(
                gpu_w=e["gpu_j"] / span if span > 0 else 0.0,
                cpu_w=e["cpu_j"] / span if span > 0 else 0.0,
                steps_per_s=self.trained_steps / span if span > 0 else 0.0,
                steps_per_joule=self.trained_steps / total if total > 0 else None,
                energy=e,
            )
        return doc


class PhaseLog:
    """Opens and closes the phases of one run on an energy meter.

    Args:
        meter: ``runtime.energy.EnergyMeter`` (one window per phase, ``phase-<generation>``).
        started: The run's ``time.monotonic()`` start.
    """

    def __init__(self, meter: Any, started: float) -> None:
        self.meter, self.started = meter, started
        self.phases: list[Phase] = []

    def begin(self, generation: int, mps_pct: list[int | None], trained: int) -> None:
        """Ends the current phase (if any) and begins the next one."""
        self.end(trained)
        self.meter.begin_window(f"phase-{generation}")
        self.phases.append(Phase(generation, mps_pct, self._now(), trained))

    def end(self, trained: int) -> None:
        """Ends the current phase, if one is open (at a hand-over or the end of the run)."""
        phase = self.phases[-1] if self.phases else None
        if phase is None or phase.end_s is not None:
            return
        phase.end_s = self._now()
        phase.trained_steps = trained - phase.trained_at_start
        try:
            phase.energy = self.meter.end_window(f"phase-{phase.generation}")
        except ValueError:
            phase.energy = None

    def _now(self) -> float:
        return time.monotonic() - self.started

    def to_list(self) -> list[dict[str, Any]]:
        return [phase.to_dict() for phase in self.phases]
