"""What a budget gives a job, read off its throughput and power model
(``autotune.tuning.perf_model``): the allocator's ``Rate`` for a job that sent its machine
model when it registered.

Within ``n`` cores and ``s`` % of its GPU, the job's tuner heads for its best config by steps/J,
so the rate is that config's, as ``auto`` sizing picks it (``autotune.tuning.sizing.size_run``
on a machine of ``n`` cores, its MPS share at most ``s``; no share: a CPU trainer). Watts are
what the job is charged (``runtime.energy.shares``): its own busy cores and learner, and its
shares of the machine's idle draw, so the jobs' watts add up to the machine's. The fitted
throughput multipliers carry over from budget to budget; the power terms come from the probes,
charged at the budget's shares.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import replace
from typing import Any

from autotune.control.allocator import Rate, linear
from autotune.tuning.budget import mps_within
from autotune.tuning.perf_model import MachineModel, Params, charged_share, prior_params
from autotune.tuning.sizing import Sizing, size_run

logger = logging.getLogger(__name__)


def sized_for(
    m: MachineModel,
    gpus: int,
    total_cores: int,
    cores: int,
    pct: int,
    minibatches: int = 4,
    params: Params | None = None,
    keep: dict[str, Any] | None = None,
) -> Sizing | None:
    """The config ``auto`` sizing picks for a job within ``cores`` cores and ``pct`` % of its
    GPU, charged that budget's shares of the machine, with the values in ``keep`` held (None:
    no config fits)."""
    held: dict[str, Any] = dict(keep or {})
    allowed = mps_within(pct) if gpus else ()
    if not allowed:
        held["trainer_device"] = "cpu"
    cores = max(1, cores)
    mm = charged_share(replace(m, cores=cores), pct / 100.0 if gpus else 0.0, cores / total_cores)
    prior = prior_params(mm)
    fitted = prior if params is None else replace(params, gpu_ctx=prior.gpu_ctx)
    try:
        return size_run(
            mm,
            gpus if allowed else 0,
            held,
            minibatches,
            params=fitted,
            allowed={"mps_pct": allowed} if allowed else None,
        )
    except ValueError:  # nothing fits
        return None


KEEP_GAIN = 0.05
"""A config sized for a changed budget keeps the envs per actor, trainer device, trainers and
MPS share of the job's best config so far (changed only by respawning every actor or handing
its GMIs over, which costs seconds of steps) unless changing them predicts at least this much
more steps/J."""
COSTLY = ("envs_per_actor", "trainer_device", "trainers", "mps_pct")


def sized_keeping(args: tuple, running: dict[str, Any] | None) -> dict[str, Any] | None:
    """The config ``sized_for(*args)`` picks (None: none fits); with the job's ``running``
    config, its ``COSTLY`` values are kept where changing them pays less than ``KEEP_GAIN``."""
    best = sized_for(*args)
    keep = {k: running[k] for k in COSTLY if k in (running or {})}
    if keep.get("trainer_device") == "cpu":
        keep.pop("mps_pct", None)
    if best is None or not keep or all(best.values.get(k) == v for k, v in keep.items()):
        return dict(best.values) if best else None
    kept = sized_for(*args, keep=keep)
    gain = best.predicted["steps_per_joule"] / max(
        kept.predicted["steps_per_joule"] if kept else 0.0, 1e-12
    )
    return dict((kept if gain < 1 + KEEP_GAIN else best).values)


def model_rate(
    m: MachineModel,
    gpus: int,
    total_cores: int,
    minibatches: int = 4,
    params: Params | None = None,
) -> Rate:
    """The job's rate function (see the module docstring) on a machine that hands out
    ``total_cores``; a budget no config fits gives 0."""
    memo: dict[tuple[int, int], tuple[float, float]] = {}

    def rate(cores: int, pct: int) -> tuple[float, float]:
        key = (max(1, cores), pct)
        if key not in memo:
            sized = sized_for(m, gpus, total_cores, key[0], pct, minibatches, params)
            p = sized.predicted if sized else {"steps_per_s": 0.0, "watts": 0.0}
            memo[key] = (p["steps_per_s"], p["watts"])
        return memo[key]

    return rate


def rate_problem(value: Any) -> str | None:
    """What is wrong with a rate's answer, or None for a pair of finite numbers >= 0 (steps/s,
    watts)."""
    try:
        steps, watts = value
    except (TypeError, ValueError):
        return f"gave {value!r}, not a pair (steps/s, watts)"
    for v in (steps, watts):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
            return f"gave {value!r}: steps/s and watts are finite numbers >= 0"
    return None


def guarded(job: str, rate: Rate) -> Rate:
    """``rate``, until it raises or answers what ``rate_problem`` refuses: from then on the
    linear rate (``allocator.linear``), logged once. One job's model that fails sizes that job
    as linear in its cores and leaves the share-out of every job going."""
    failed: list[str] = []

    def safe(cores: int, pct: int) -> tuple[float, float]:
        if not failed:
            try:
                value = rate(cores, pct)
                why = rate_problem(value)
            except Exception as exc:  # anything its model raises: the others are shared out
                value, why = None, f"{type(exc).__name__}: {exc}"
            if why is None:
                return float(value[0]), float(value[1])
            failed.append(why)
            logger.warning(
                "job %s: its model's rate for %d cores and %d %% of its GPU failed (%s); it "
                "counts as linear in its cores from now on",
                job,
                cores,
                pct,
                why,
            )
        return linear(cores, pct)

    return safe
