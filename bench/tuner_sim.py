"""The online tuner on a simulated job: how many windows each sampler needs to reach 95 % of the
optimum, and the steps/J it gives up on the way (regret).

    python -m bench.tuner_sim --json out/tuner_sim.json [--seeds 10] [--windows 30]

The job is a response surface shaped like the measured ones on a 16-core host with one GPU
(Ant-v5-like env steps of 0.5 ms, an MLP learner): sampling that saturates at the free cores,
training bounded by a per-batch cost, a GPU that draws 76 W idle, 132 W with a context; plus
what the tuner's model does not know: a fixed cost per actor round (sending a rollout), a
penalty for oversubscribed cores, and 4 % multiplicative noise per counter reading. Trained
steps arrive a batch at a time. The real ``OnlineTuner`` drives it, with its real windows,
through an in-memory Optuna study; time is simulated, so a run of 30 windows takes seconds.

JSON: ``{"samplers": {NAME: {"windows_to_95": [...], "regret": [...]}}, "optimum": ...}``;
``windows_to_95`` is per seed (None: not reached within ``--windows``), ``regret`` per seed the
sum over windows of ``optimum - value`` (steps/J).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from autotune.tuning.counters import Counters
from autotune.tuning.knobs import Machine, build_space
from autotune.tuning.model_sampler import ModelSampler
from autotune.tuning.online_tuner import OnlineTuner
from autotune.tuning.perf_model import MachineModel, Params, evaluate, features
from autotune.tuning.settings import TunerSettings
from autotune.tuning.sizing import size_run

SPACE = [
    "actors=1..16",
    "envs_per_actor=4..64",
    "batch_size=1024..65536",
    "trainer_device=cpu,cuda",
    "trainers=1,2",
    "mps_pct=25,50,100",
    "trainer_threads=1,2",
    "chunk_bytes=262144",
    "inference=actor",
    "rollout_len=32",
]
PROBED = MachineModel(
    cores=16,
    rollout_len=32,
    t_env=0.5e-3,
    f0=60e-6,
    f1=2e-6,
    learner={"cpu": (0.02, 12e-6), "cuda": (0.008, 1.5e-7)},
    gpu_idle_w=76.0,
    gpu_limit_w=700.0,
    cpu_idle_w=60.0,
    w_core=10.0,
)
"""What the probes would say about the simulated machine."""
TRUTH = Params(k_s=0.7, k_t={"cpu": 0.6, "cuda": 0.8}, q=0.4, gpu_ctx=56.0, gpu_dyn=120.0, u0=0.12)
"""What the simulated machine really does (off the probes' priors, as a real one is)."""
SEND_S = 1.5e-3
"""Per actor round, the cost of sending a rollout (not in the tuner's model)."""
NOISE = 0.04


def true_rates(values: dict[str, Any]) -> tuple[float, float, float, float]:
    """(trained steps/s, GPU watts, CPU watts, policy lag) of the simulated job."""
    x = features([values], {})
    m = replace(PROBED, f0=PROBED.f0 + SEND_S)
    p = evaluate(m, TRUTH, x)
    over = max(0.0, values["actors"] + 1 - PROBED.cores)
    penalty = 1.0 / (1.0 + 0.15 * over)
    sps = float(p.steps_per_s[0]) * penalty
    return sps, float(p.gpu_w[0]), float(p.cpu_w[0]), float(p.lag[0])


def true_value(values: dict[str, Any]) -> float:
    sps, gpu_w, cpu_w, _ = true_rates(values)
    return sps / (gpu_w + cpu_w)


def optimum(space: dict) -> float:
    """The best true steps/J over the space (every combination)."""
    from autotune.tuning.sizing import candidates

    fixed = {k.name: k.choices[0] for k in space.values() if len(k.choices) == 1}
    best = 0.0
    for c in candidates(PROBED, 1, fixed, 32, 4):
        if all(c[n] in space[n].choices for n in c if n in space):
            best = max(best, true_value(c))
    return best


class SimJob:
    """The simulated job as the tuner's ``Job``: counters at the true rates with noise,
    trained steps in whole batches."""

    def __init__(self, seed: int, clock: list[float]) -> None:
        self.rng = np.random.default_rng(seed)
        self.clock, self.values = clock, {}
        self.last, self.sampled, self.lag = 0.0, 0.0, 0.0
        self.gpu_j = self.cpu_j = 0.0
        self.applied: list[dict[str, Any]] = []

    def apply(self, values: dict[str, Any]) -> None:
        self.values = dict(values)
        self.applied.append(dict(values))

    def ready(self) -> bool:
        return True

    def counters(self) -> Counters:
        now = self.clock[0]
        dt, self.last = now - self.last, now
        if self.values and dt > 0:
            sps, gpu_w, cpu_w, lag = true_rates(self.values)
            self.sampled += sps * dt * float(np.exp(self.rng.normal(0, NOISE)))
            self.gpu_j += gpu_w * dt * float(np.exp(self.rng.normal(0, NOISE / 2)))
            self.cpu_j += cpu_w * dt * float(np.exp(self.rng.normal(0, NOISE / 2)))
            self.lag += lag * sps * dt
        batch = self.values.get("batch_size", 1)
        trained = int(self.sampled // batch) * batch
        return Counters(now, trained, self.lag, self.gpu_j, self.cpu_j)


def simulate(sampler: str, seed: int, windows: int) -> list[float]:
    """The true steps/J of the config measured in each window, in order."""
    tuner, defaults = tune(sampler, seed, windows)
    return [true_value({**defaults, **w["values"]}) for w in tuner.log[:windows]]


def tune(sampler: str, seed: int, windows: int) -> tuple[OnlineTuner, dict[str, Any]]:
    """The real online tuner, run on the simulated job for ``windows`` windows; and the
    defaults its configs stand on."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("autotune").setLevel(logging.WARNING)
    space = build_space(Machine(16, 1), SPACE)
    online = {k.name: k for k in space.values() if k.online}
    fixed = {k.name: k.choices[0] for k in space.values() if not k.online}
    sized = size_run(PROBED, 1, fixed, 4).values
    base = {n: sized.get(n, k.choices[0]) for n, k in online.items()}
    defaults = {**fixed, **base}
    settings = TunerSettings(warmup_s=3.0, window_s=5.0, trials=windows, sampler=sampler)
    if sampler == "model":
        applies = {k.name: k.apply for k in online.values()}
        choices = {k.name: k.choices for k in online.values()}
        s = ModelSampler(PROBED, choices, defaults, applies, seed=seed, window_s=settings.window_s)
    else:
        s = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
    study = optuna.create_study(direction="maximize", sampler=s)
    clock = [0.0]
    job = SimJob(seed, clock)
    tuner = OnlineTuner(
        study, space, job, settings, base, clock=lambda: clock[0], defaults=defaults
    )
    while len(tuner.log) < windows:
        clock[0] += 0.5
        tuner.tick()
    return tuner, defaults


def summarise(values: list[float], best: float) -> tuple[int | None, float]:
    """(windows until one reached 95 % of ``best``, or None; the cumulative regret: what the
    windows fell short of ``best``, in steps/J, summed)."""
    reached = next((i + 1 for i, v in enumerate(values) if v >= 0.95 * best), None)
    return reached, float(sum(best - v for v in values))


def run(seeds: int, windows: int, samplers: tuple[str, ...] = ("model", "tpe")) -> dict:
    space = build_space(Machine(16, 1), SPACE)
    best = optimum(space)
    out: dict[str, Any] = {"optimum": best, "seeds": seeds, "windows": windows, "samplers": {}}
    for name in samplers:
        to95, regret = [], []
        for seed in range(seeds):
            reached, r = summarise(simulate(name, seed, windows), best)
            to95.append(reached)
            regret.append(r)
        out["samplers"][name] = {"windows_to_95": to95, "regret": regret}
    return out


def _median_worst(xs: list[int | None], cap: int) -> tuple[str, str]:
    """The median and worst windows to 95 %, ``>cap`` where they are seeds that never got there."""
    vals = [cap + 1 if x is None else x for x in xs]
    med, worst = statistics.median(vals), max(vals)
    return (f">{cap}" if med > cap else f"{med:g}"), (f">{cap}" if worst > cap else str(worst))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tuner_sim", description=__doc__)
    ap.add_argument("--json", type=Path, required=True, metavar="PATH")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--windows", type=int, default=30)
    a = ap.parse_args(argv)
    if a.seeds < 1 or a.windows < 2:
        ap.error("--seeds must be >= 1 and --windows >= 2")
    doc = run(a.seeds, a.windows)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(doc, indent=2))
    print(f"optimum {doc['optimum']:.1f} steps/J; {a.seeds} seeds, {a.windows} windows")
    for name, r in doc["samplers"].items():
        med, worst = _median_worst(r["windows_to_95"], a.windows)
        print(
            f"{name:>6}: windows to 95 %: median {med}, worst {worst}; cumulative regret "
            f"(steps/J) median {statistics.median(r['regret']):.1f}, worst {max(r['regret']):.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
