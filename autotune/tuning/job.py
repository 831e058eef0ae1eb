"""The interface every tuned job implements (``Job``: a runner in this process, a job
registered with the daemon, a wrapped script run live) and the tuner's memory of what each
config measured (``History``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

from autotune.tuning.counters import Measurement


class Job(Protocol):
    """What the tuner drives: a running training job (``autotune.tuning.runner_job.RunnerJob``)."""

    def apply(self, values: dict[str, Any]) -> None:
        """Asks for the config; raises ``runtime.config.ConfigError`` if it is refused."""

    def ready(self) -> bool:
        """Whether the last change has taken effect (actors replaced, GMIs handed over).
        Raises ``runtime.config.ConfigError`` if it was refused or failed after ``apply``
        (a job in another process answers later)."""

    def begin_window(self) -> None: ...

    def end_window(self) -> Measurement: ...


@dataclass
class History:
    """Measurements by config (a JSON key of its knob values)."""

    by_config: dict[str, list[float]] = field(default_factory=dict)
    speed: dict[str, list[float]] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)

    def best(self) -> tuple[str, float] | None:
        scored = [(k, statistics.median(v)) for k, v in self.by_config.items() if v]
        return max(scored, key=lambda kv: kv[1]) if scored else None
