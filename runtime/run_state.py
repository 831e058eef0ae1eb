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
    """Trained steps the learner holds (``RunTelemetry.learned_steps``): those a trainer
    restart rolled back are not among them (``rolled_back_steps``)."""
    sampled_steps: int
    return_mean: float | None
    episodes: int
    policy_lag_mean: float
    policy_lag_max: int
    actor_restarts: int
    draining: bool
    noise_scale: float | None = None
    """The learner's gradient noise scale in samples (``policies.noise_scale``), or None."""
    lr: float | None = None
    """The learning rate of the lead trainer's last update, or None before it."""
    kl: float | None = None
    """The KL divergence of the lead trainer's last update (``policies.appo.UpdateStats``)."""
    rolled_back_steps: int = 0
    """Trained steps trainer restarts rolled back so far (``RunTelemetry.rolled_back_steps``)."""

    @classmethod
    def of(cls, telemetry: Any, actors: Any, elapsed_s: float, draining: bool) -> RunState:
        """The figures of a run's ``RunTelemetry`` and ``ActorPool`` now."""
        lag_mean, lag_max = telemetry.policy_lag()
        lead = telemetry.lead_trainer()
        noise, lr, kl = (lead.get(k) for k in ("noise_scale", "lr", "kl"))
        return cls(
            elapsed_s,
            telemetry.learned_steps,
            actors.sampled_steps(),
            telemetry.return_mean,
            telemetry.episodes,
            lag_mean,
            lag_max,
            actors.restarts,
            draining,
            noise if isinstance(noise, int | float) else None,
            lr if isinstance(lr, int | float) else None,
            kl if isinstance(kl, int | float) else None,
            telemetry.rolled_back_steps,
        )
