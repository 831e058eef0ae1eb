"""The evidence ``autotune export`` gives for a config (``autotune.workflows.export``): its
trials' measured figures (median, range), what its trials took to a target return, and the
step bound of a config exported from a study to one."""

from __future__ import annotations

import statistics
from typing import Any

from autotune.tuning.reference import GOODPUT_METRIC, TARGET_METRIC, scaled_name
from runtime.config import TrainConfig

TARGET_STEPS_MARGIN = 4
"""A study to a target return exports a step bound of this many times the most steps its
recommended config's trials took to the target: a slower seed still gets there, and the run
stops at the target (``TrainConfig.target_return``) however far the bound is."""


def steps_to_run(trials: list[Any]) -> int:
    """The step bound of a config exported from a study to a target return
    (``TARGET_STEPS_MARGIN``); the default's where none of ``trials`` reached the target."""
    took = [t.user_attrs.get("steps_to_target") for t in trials if t.user_attrs.get("reached")]
    most = max((int(n) for n in took if n), default=0)
    return max(TrainConfig().steps, TARGET_STEPS_MARGIN * most)


def _stats(trials: list[Any], metric: str) -> dict[str, Any]:
    values = [t.user_attrs[metric] for t in trials if t.user_attrs.get(metric) is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measured(trials: list[Any]) -> dict[str, Any]:
    """The figures ``trials`` (one config's) measured: median and range of each."""
    return {
        "trials": [t.number for t in trials],
        "steps_per_joule": _stats(trials, "steps_per_joule"),
        "steps_per_s": _stats(trials, "steps_per_s"),
        "scaled_steps_per_joule": _stats(trials, scaled_name("steps_per_joule")),
        "scaled_steps_per_s": _stats(trials, scaled_name("steps_per_s")),
        "gpu_w": _stats(trials, "gpu_w")["median"],
        "cpu_w": _stats(trials, "cpu_w")["median"],
        "cpu_source": trials[0].user_attrs.get("cpu_source") if trials else None,
        GOODPUT_METRIC: _stats(trials, GOODPUT_METRIC),
        scaled_name(GOODPUT_METRIC): _stats(trials, scaled_name(GOODPUT_METRIC)),
        **_to_target(trials),
    }


def _to_target(trials: list[Any]) -> dict[str, Any]:
    """A study to a target return: what its trials took to get there (none where not)."""
    if not trials or trials[0].user_attrs.get("target_return") is None:
        return {}
    return {
        "target_return": trials[0].user_attrs["target_return"],
        TARGET_METRIC: _stats(trials, TARGET_METRIC),
        "reached": sum(bool(t.user_attrs.get("reached")) for t in trials),
        "joules_to_target": _stats(trials, "joules_to_target"),
        "seconds_to_target": _stats(trials, "seconds_to_target"),
        "steps_to_target": _stats(trials, "steps_to_target"),
        "best_return": _stats(trials, "best_return"),
    }
