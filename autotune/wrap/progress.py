"""What a wrapped script is doing now: its steps/s and steps/J over the last seconds, printed
as a plain line every few seconds and kept in the study (user attribute ``wrap_live``), where
``autotune status --study NAME`` reads them while the wrap runs
(``autotune.control.status.fresh_live``)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from autotune.control.status import live_rates
from autotune.tuning.counters import Counters

logger = logging.getLogger(__name__)

PRINT_S = 5.0
"""Seconds between two progress lines (and two writes to the study)."""
SPAN_S = 10.0
"""The figures are over the script's reports of the last this many seconds."""


class WrapProgress:
    """Takes the script's cumulative readings (``Counters``: steps, GPU and CPU joules) as its
    reports come, and every ``PRINT_S`` prints and stores the rates over the last ``SPAN_S``."""

    def __init__(self, console: Any, study: Any, unit: str = "steps") -> None:
        self.console, self.study, self.unit = console, study, unit
        self.readings: deque[Counters] = deque(maxlen=4096)
        self.trial: Any = None
        self._next = time.monotonic() + PRINT_S

    def start(self, trial: Any) -> None:
        """A new run (restart mode) or config: its readings start afresh."""
        self.trial, self.readings = trial, deque(maxlen=4096)

    def update(self, reading: Counters) -> None:
        self.readings.append(reading)
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + PRINT_S
        rates = live_rates(list(self.readings), SPAN_S)
        if rates is None:
            return
        spj = rates["steps_per_joule"]
        self.console.print(
            f"  trial {self.trial}: {reading.trained_steps:,} {self.unit}, "
            f"{rates['steps_per_s']:,.0f} {self.unit}/s, "
            + (f"{spj:.4g} {self.unit}/J" if spj else f"- {self.unit}/J")
            + f" (last {rates['span_s']:.0f} s; GPU {rates['gpu_w']:.0f} W, "
            f"CPU {rates['cpu_w']:.0f} W {rates['cpu_source']})",
            highlight=False,
        )
        _set_live(self.study, {**rates, "trial": self.trial, "unix": time.time()})


def clear_live(study: Any) -> None:
    """The wrap is over: ``autotune status`` shows no live figures for it any more."""
    _set_live(study, None)


def _set_live(study: Any, value: Any) -> None:
    """The live figures ``autotune status`` shows, written where the storage lets it: a
    database another process holds locked costs this reading, never the trial."""
    try:
        study.set_user_attr("wrap_live", value)
    except Exception as exc:
        logger.warning("the live figures were not stored this time: %s", exc)
