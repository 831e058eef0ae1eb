"""What a budget gives a job, read off its throughput and power model
(``autotune.tuning.perf_model``): the allocator's ``Rate`` for a job that sent its machine
model when it registered.

Within ``n`` cores and ``s`` % of its GPU, the job's tuner heads for its best config by steps/J,
so the rate is that config's, as ``auto`` sizing picks it (``autotune.tuning.sizing.size_run``
on a machine of ``n`` cores, its MPS share at most ``s``; no share: a CPU trainer). Watts are
above the machine's idle draw, which the allocator counts once for the whole machine.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autotune.control.allocator import Rate
from autotune.tuning.knobs import MPS_CHOICES
from autotune.tuning.perf_model import MachineModel, Params, prior_params
from autotune.tuning.sizing import size_run


def model_rate(
    m: MachineModel,
    gpus: int,
    minibatches: int = 4,
    params: Params | None = None,
    fixed: dict[str, Any] | None = None,
) -> Rate:
    """The job's rate function (see the module docstring); a budget no config fits gives 0."""
    params = params or prior_params(m)
    idle = m.gpu_idle_w + m.cpu_idle_w * params.k_cpu
    shares = MPS_CHOICES
    memo: dict[tuple[int, tuple[int, ...]], tuple[float, float]] = {}

    def rate(cores: int, pct: int) -> tuple[float, float]:
        held = dict(fixed or {})
        allowed: tuple[int, ...] = ()
        if gpus and pct > 0:
            allowed = tuple(p for p in shares if p <= pct) or (pct,)
        else:
            held["trainer_device"] = "cpu"
        key = (max(1, cores), allowed)
        if key not in memo:
            try:
                sized = size_run(
                    replace(m, cores=key[0]),
                    gpus if allowed else 0,
                    held,
                    minibatches,
                    params=params,
                    allowed={"mps_pct": allowed} if allowed else None,
                )
                p = sized.predicted
                memo[key] = (p["steps_per_s"], max(0.0, p["watts"] - idle))
            except ValueError:  # nothing fits: the budget gives this job nothing
                memo[key] = (0.0, 0.0)
        return memo[key]

    return rate
