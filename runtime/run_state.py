"""What a running job shows as it goes: the live figures of each tick, and its energy window.

``runtime.runner`` re-exports both names (``from runtime.runner import RunState, RUN_WINDOW``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RUN_WINDOW = "run"
"""The energy window open for the whole run (a tuner peeks at it for cumulative joules)."""


@dataclass
class RunState:
    """Live figures handed to the progress callback every tick."""

    elapsed_s: float
    trained_steps: int
    sampled_steps: int
    return_mean: float | None
    episodes: int
    policy_lag_mean: float
    policy_lag_max: int
    actor_restarts: int
    draining: bool
    noise_scale: float | None = None
    """The learner's gradient noise scale in samples (``policies.noise_scale``), or None."""

    @classmethod
    def of(cls, telemetry: Any, actors: Any, elapsed_s: float, draining: bool) -> RunState:
        """The figures of a run's ``RunTelemetry`` and ``ActorPool`` now."""
        lag_mean, lag_max = telemetry.policy_lag()
        noise = telemetry.lead_trainer().get("noise_scale")
        return cls(
            elapsed_s,
            telemetry.trained_steps,
            actors.sampled_steps(),
            telemetry.return_mean,
            telemetry.episodes,
            lag_mean,
            lag_max,
            actors.restarts,
            draining,
            noise if isinstance(noise, int | float) else None,
        )
