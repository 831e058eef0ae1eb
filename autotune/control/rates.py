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

from dataclasses import replace
from typing import Any

from autotune.control.allocator import Rate
from autotune.tuning.budget import mps_within
from autotune.tuning.perf_model import MachineModel, Params, charged_share, prior_params
from autotune.tuning.sizing import Sizing, size_run


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
