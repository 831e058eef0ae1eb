"""What a running job shows as it goes: the live figures of each tick, and its energy window.

``runtime.runner`` re-exports both names (``from runtime.runner import RunState, RUN_WINDOW``).
"""

from __future__ import annotations

from dataclasses import dataclass

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
