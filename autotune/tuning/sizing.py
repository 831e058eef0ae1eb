"""``auto`` sizing: a run's actors, envs per actor, batch size, trainer device, GMIs and MPS share,
picked before the first step from what the machine and the workload measure.

The probes (``runtime.probes``) give one env step's CPU cost, one policy forward on an actor
core, and the learner's cost per update on each device; the hardware gives the cores (the
affinity mask) and the GPU's idle draw and power limit. ``size_run`` evaluates the throughput and
power model (``autotune.tuning.perf_model``) at every candidate config and takes the best by the
objective (steps/J or steps/s; goodput per joule: steps/J, with ties to a smaller batch widened
to ``GOODPUT_TIE_SHARE``), under three rules:

* no core is oversubscribed: actors plus CPU trainer threads fit the cores. The stages share
  the actors' cores (about a quarter of a core between them: ``perf_model.STAGE_CORES``); a
  core left to them idled the rest of its time, and a 16th actor on a 16-core H200 host trained
  4-15 % more steps/s than 15 at 1.02-1.14x the steps/J (docs/BENCHMARKS.md);
* the predicted policy lag stays under the ceiling;
* the batch stays whole for the learner: a multiple of the rollout length and of the
  minibatch count, each minibatch at least ``MIN_MINIBATCH`` samples.

Explicit values (``fixed``) always win: they are held and the rest is sized around them; a
tuned run's narrowed knobs (``allowed``) bound the values tried. The
function is pure given its inputs, so it is tested on synthetic machines.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.tuning.knobs import BATCH_CHOICES, MIN_MINIBATCH, batch_fits
from autotune.tuning.node_model import place
from autotune.tuning.perf_model import (
    MachineModel,
    Params,
    evaluate,
    features,
    prior_params,
    trainer_cores,
)

SIZED = ("actors", "envs_per_actor", "batch_size", "trainer_device", "trainers", "mps_pct")
"""What ``auto`` sizes (``trainer_threads`` too, on a CPU trainer)."""
ENVS = (1, 2, 4, 8, 16, 32, 64)
BATCHES = BATCH_CHOICES
"""The batch sizes sized from: those the tuner tries."""
TRAINERS = (1, 2)
MPS = (25, 50, 100)
THREADS = (1, 2, 4)
MIN_UPDATES = 64
"""A batch is at most the run's steps over this (a run learns in at least this many updates)."""
TIE_SHARE = 0.02
"""Configs predicted within this share of the best count as equal; the smallest batch wins,
then the most envs per actor."""
GOODPUT_TIE_SHARE = 0.10
"""The tie share under the goodput objective. The start has no noise scale yet (the learner
measures it in its first updates), but a batch's statistical efficiency ``B_noise / (B_noise +
B)`` falls with ``B`` whatever ``B_noise`` is: among configs within this share of the best
predicted steps/J the smallest batch is then at least as good for any noise scale but a
steps/J this share lower. It risks at most that share of the first window's steps/J where the
noise scale turns out large; where it is small it gains the efficiencies' ratio (Ant-v5 on an
H200 host: the probes put 8,192 within this share of 32,768, and the first windows measured
2.0-2.6k samples, where 8,192 keeps 3.3x the efficiency of 32,768)."""
OBJECTIVES = ("steps_per_joule", "steps_per_s", "goodput_per_joule")
CPU_TRAINER_MARGIN = 0.15
"""Where a GPU is there to train on, a CPU trainer is taken only when the model predicts it
this much better than the best GPU trainer. The model is optimistic about CPU trainers: on
H100 80GB 16-core hosts, Ant-v5 sized with two CPU trainers trained 0.70-0.76 of the steps/s
predicted (23.1k against 30.3k; 19k against 23.0k), and with a GPU trainer 0.95 (32k against
33.9k): a CPU trainer shares caches and memory bandwidth with the actors, which the learner
probe, taken alone, does not see."""
DEFAULT_LAG_CEILING = 20.0
"""Versions of policy lag the sizing and the tuner stay under unless told otherwise."""


@dataclass(frozen=True)
class Sizing:
    """What ``size_run`` picked, what the model predicts for it, and from what."""

    values: dict[str, Any]
    predicted: dict[str, float]
    candidates: int
    rules: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": self.values,
            "predicted": self.predicted,
            "candidates": self.candidates,
            "rules": self.rules,
        }


def fits_cores(m: MachineModel, x: dict[str, np.ndarray]) -> np.ndarray:
    """Whether each config's actors and CPU trainer threads fit the cores (``features``); on a
    Ray cluster, whether its actors fit the nodes' CPUs, and those placed on this host fit
    beside the trainer threads."""
    cpu_threads = np.where(x["cuda"] > 0, 0.0, np.ceil(trainer_cores(x)))
    if not m.nodes:
        return x["actors"] + cpu_threads <= max(m.cores, 2)
    cpus = np.array([n.cpus for n in m.nodes], float)
    here = np.array([n.here for n in m.nodes], bool)
    on_head = place(x["actors"], cpus)[:, here].sum(axis=1)
    head_fits = np.round(on_head) + cpu_threads <= max(m.cores, 2)
    return (x["actors"] <= cpus.sum()) & head_fits


def candidates(
    m: MachineModel,
    gpus: int,
    fixed: dict[str, Any],
    rollout_len: int,
    minibatches: int,
    allowed: dict[str, tuple[Any, ...]] | None = None,
    min_minibatch: int = 0,
) -> list[dict[str, Any]]:
    """Every config the sizing considers (``fixed`` values held; a field in ``allowed`` only
    takes the values listed there, e.g. a tuned run's narrowed knobs; batch sizes as
    ``knobs.batch_fits`` takes them, with the learner's ``min_minibatch`` floor)."""
    devices = ("cpu", "cuda") if gpus and "cuda" in m.learner else ("cpu",)
    grid = {
        "actors": range(1, m.actor_cpus() + 1),
        "envs_per_actor": ENVS,
        "batch_size": [
            b for b in BATCHES if batch_fits(b, minibatches, rollout_len, min_minibatch)
        ],
        "trainer_device": devices,
        "trainers": TRAINERS,
        "mps_pct": MPS,
        "trainer_threads": THREADS,
    }
    for name, values in (allowed or {}).items():
        if name in grid and name not in fixed:
            grid[name] = tuple(v for v in values if name != "batch_size" or v in grid[name])
            grid[name] = grid[name] or tuple(values)  # the user's own batches: theirs to keep
    for name, value in fixed.items():
        if name in grid:
            grid[name] = (value,)
    out = []
    for combo in itertools.product(*grid.values()):
        c = dict(zip(grid, combo, strict=True))
        cpu = c["trainer_device"] == "cpu"
        if cpu and c["mps_pct"] != 100 and "mps_pct" not in fixed:
            continue  # the MPS share means nothing to a CPU trainer
        if not cpu and c["trainer_threads"] != 1 and "trainer_threads" not in fixed:
            continue  # a GPU trainer's host threads: left at one
        out.append(c)
    return out


def _margin_cpu_trainers(score: np.ndarray, cuda: np.ndarray) -> np.ndarray:
    """``score`` with the CPU-trainer configs ruled out, unless the best of them beats the best
    GPU-trainer config by ``CPU_TRAINER_MARGIN`` (no change where only one device is there)."""
    if not cuda.any() or cuda.all() or not np.isfinite(score[cuda]).any():
        return score
    if score[~cuda].max() >= (1 + CPU_TRAINER_MARGIN) * score[cuda].max():
        return score
    return np.where(cuda, score, -np.inf)


def size_run(
    m: MachineModel,
    gpus: int,
    fixed: dict[str, Any],
    minibatches: int,
    objective: str = "steps_per_joule",
    lag_ceiling: float = DEFAULT_LAG_CEILING,
    params: Params | None = None,
    steps: int | None = None,
    allowed: dict[str, tuple[Any, ...]] | None = None,
    min_minibatch: int = 0,
) -> Sizing:
    """The best config under the model (see the module docstring).

    Raises:
        ValueError: when no candidate satisfies the rules (fixed values that leave none: the
            message says which rule bound), or an unknown objective.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"sizing objective {objective!r}: allowed {', '.join(OBJECTIVES)}")
    params = params or prior_params(m)
    cands = candidates(m, gpus, fixed, m.rollout_len, minibatches, allowed, min_minibatch)
    if not cands:
        raise ValueError(
            f"no batch size in {BATCHES[0]}..{BATCHES[-1]} is a multiple of the rollout length "
            f"({m.rollout_len}) and of {minibatches} minibatches of at least {MIN_MINIBATCH}"
        )
    x = features(cands, {})
    pred = evaluate(m, params, x)
    fits = fits_cores(m, x)
    if "actors" in fixed:
        fits = np.ones_like(fits)  # the user's actor count: size the rest around it
    lag_ok = pred.lag <= lag_ceiling
    big = x["batch_size"] > max(BATCHES[0], (steps or 0) // MIN_UPDATES) if steps else False
    score = pred.steps_per_s if objective == "steps_per_s" else pred.steps_per_joule
    share = GOODPUT_TIE_SHARE if objective == "goodput_per_joule" else TIE_SHARE
    ok = fits & lag_ok & ~np.asarray(big)
    if not ok.any():
        ok = fits if fits.any() else np.ones_like(fits)
    score = np.where(ok, score, -np.inf)
    score = _margin_cpu_trainers(score, x["cuda"] > 0)
    near = score >= (1 - share) * score.max()
    # among the near-best, the smallest batch (more updates), then the most envs per actor:
    # the fewest actor rounds per step, whose fixed cost the two-point loaded probe can miss
    # (its line's intercept, clamped at zero, made every env count look alike and picked one
    # env per actor, which trained at 0.6-0.7 of eight), then the best score
    order = np.lexsort((-score, -x["envs_per_actor"], x["batch_size"], ~near))
    i = int(order[0])
    values = dict(cands[i])
    predicted = {
        "steps_per_s": float(pred.steps_per_s[i]),
        "sample_rate": float(pred.sample_rate[i]),
        "train_rate": float(pred.train_rate[i]),
        "watts": float(pred.watts[i]),
        "steps_per_joule": float(pred.steps_per_joule[i]),
        "policy_lag": float(pred.lag[i]),
    }
    rules = {
        "cores": m.cores,
        "lag_ceiling": lag_ceiling,
        "min_minibatch": MIN_MINIBATCH,
        "max_batch": max(BATCHES[0], steps // MIN_UPDATES) if steps else None,
        "tie_share": share,
        "cpu_trainer_margin": CPU_TRAINER_MARGIN,
        "objective": objective,
        "fixed": dict(fixed),
        "allowed": {k: list(v) for k, v in (allowed or {}).items()},
    }
    return Sizing(values, predicted, len(cands), rules)
