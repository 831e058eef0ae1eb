"""Steady-state steps/s, GPU W, CPU W and steps per joule over a grid of trainer GMI layouts.

    python -m bench gmi --env Ant-v5 --actors 8,15 --devices cpu,cuda --gmis 1,2,4 \\
        --mps 100,50,25,10 [--inference actor,gmi] --out out/gmi

Each grid point is one ``Runner`` run: start-up (until the first update) and ``--warmup-s``
after it are skipped, then an energy window of ``--measure-s`` is taken (trained steps and
joules inside it only), then the run drains. Trained steps move in whole updates (GMIs x batch
size), so over a short window ``steps_per_s`` is coarse and can run ahead of sampling while the
GMIs work off their queues; ``sampled_per_s`` (actor steps in the same window) is the fine
measure of throughput in steady state. ``--mps`` applies to cuda rows (one percentage for
every GMI); cpu rows run once per GMI count. A point that fails is recorded with its error and
the grid goes on. Every point also reports the SMs each GMI said CUDA gave it, how GMIs shared
the GPU, whether the GMIs ended with identical weights, and that nothing was lost.
``--inference actor,gmi`` adds the axis of where actions are computed (each actor's core, or
one batched inference GMI on the trainer device, limited by ``--inference-mps``).
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace
from typing import Any

from bench.workload import learner_from_args
from runtime.config import TrainConfig
from runtime.runner import Runner, RunState


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


class SteadyWindow:
    """Opens an energy window ``warmup_s`` after the first update, closes it ``measure_s``
    later and then asks the runner to drain."""

    def __init__(self, meter: Any, warmup_s: float, measure_s: float) -> None:
        self.meter, self.warmup_s, self.measure_s = meter, warmup_s, measure_s
        self.runner: Runner | None = None
        self.first_update_s: float | None = None
        self.start: tuple[float, int, int] | None = None
        self.end: tuple[float, int, int] | None = None
        self.energy: Any = None

    def __call__(self, state: RunState) -> None:
        if state.draining:
            return
        if self.first_update_s is None:
            if state.trained_steps > 0:
                self.first_update_s = state.elapsed_s
            return
        if self.start is None and state.elapsed_s >= self.first_update_s + self.warmup_s:
            self.meter.begin_window("steady")
            self.start = (state.elapsed_s, state.trained_steps, state.sampled_steps)
        elif self.start and self.end is None and state.elapsed_s >= self.start[0] + self.measure_s:
            self.energy = self.meter.end_window("steady")
            self.end = (state.elapsed_s, state.trained_steps, state.sampled_steps)
            if self.runner is not None:
                self.runner.stop_requested = True

    def figures(self) -> dict[str, Any]:
        if self.start is None or self.end is None or self.energy is None:
            return {"error": "the run ended before the measurement window closed"}
        span = self.end[0] - self.start[0]
        steps = self.end[1] - self.start[1]
        sampled = self.end[2] - self.start[2]
        e = self.energy
        return {
            "steps_per_s": steps / span,
            "sampled_per_s": sampled / span,
            "gpu_w": e.gpu_total_j / span,
            "cpu_w": e.cpu_energy_j / span,
            "steps_per_joule": steps / e.total_j if e.total_j > 0 else None,
            "window_s": span,
            "window_steps": steps,
            "first_update_s": self.first_update_s,
            "gpu_source": e.gpu_source,
            "cpu_source": e.cpu_source,
        }


def run_point(base: TrainConfig, warmup_s: float, measure_s: float) -> dict[str, Any]:
    from runtime.energy import EnergyMeter

    meter = EnergyMeter()
    window = SteadyWindow(meter, warmup_s, measure_s)
    point: dict[str, Any] = {
        "device": base.trainer_device,
        "gmis": base.trainers,
        "mps_pct": base.mps_pct[0] if base.mps_pct else 100,
        "actors": base.actors,
        "grad_sync": base.grad_sync,
        "inference": base.inference,
    }
    try:
        info = base.validate()
        runner = window.runner = Runner(base, info, on_progress=window, meter=meter)
        result = runner.run()
    except Exception as exc:  # one failed point must not end the grid
        return {**point, "error": f"{type(exc).__name__}: {exc}"}
    point.update(window.figures())
    point.update(
        sms=[g["sm_count"] for g in result["gmis"]],
        sharing=result["gmi_sharing"],
        sync=result["gmi_sync"],
        weights_identical=result["weights_identical"],
        lost_steps=result["lost_steps"],
        discarded_steps=result["discarded_steps"],
        sampled_steps=result["sampled_steps"],
        trained_steps=result["env_steps"],
        policy_lag=result["policy_lag"],
        return_mean=result["return_mean"],
    )
    inference = result["inference"]
    if inference["mode"] == "gmi":
        point.update(
            inference_sms=inference["sm_count"],
            rows_per_batch=inference["rows_per_batch"],
            inference_compute_s=inference["compute_s"],
            actor_wait_s=inference["actor_wait_s"],
        )
    return point


def grid(a: argparse.Namespace) -> list[TrainConfig]:
    learner = learner_from_args(a)
    base = TrainConfig(
        env=a.env,
        steps=10**9,
        envs_per_actor=a.envs_per_actor,
        rollout_len=a.rollout_len,
        batch_size=a.batch_size,
        policy=a.policy,
        max_wall_s=a.max_wall_s,
        grad_sync=a.grad_sync,
        learner=learner,
    )
    gpus = tuple(_ints(a.gpus)) if a.gpus else None
    out = []
    inference_pct = None if a.inference_mps == 100 else a.inference_mps
    for device, actors, gmis, where in itertools.product(
        a.devices.split(","), _ints(a.actors), _ints(a.gmis), a.inference.split(",")
    ):
        point = replace(base, actors=actors, trainers=gmis, inference=where)
        if device == "cpu":
            out.append(replace(point, trainer_device="cpu"))
            continue
        for pct in _ints(a.mps):
            out.append(
                replace(
                    point,
                    trainer_device="cuda",
                    gpus=gpus,
                    mps_pct=None if pct == 100 else (pct,),
                    inference_mps_pct=inference_pct if where == "gmi" else None,
                )
            )
    return out


SHOWN = (
    "device",
    "gmis",
    "mps_pct",
    "actors",
    "inference",
    "steps_per_s",
    "sampled_per_s",
    "rows_per_batch",
    "actor_wait_s",
    "gpu_w",
    "cpu_w",
    "steps_per_joule",
    "sms",
    "sharing",
    "sync",
    "lost_steps",
    "weights_identical",
    "first_update_s",
    "error",
)
"""The figures of a grid point printed when it ends."""


def point_name(cfg: TrainConfig) -> str:
    """A grid point's step name, e.g. ``cuda-a15-g2-mps50-actor``."""
    pct = cfg.mps_pct[0] if cfg.mps_pct else 100
    name = f"{cfg.trainer_device}-a{cfg.actors}-g{cfg.trainers}"
    if cfg.trainer_device != "cpu":
        name += f"-mps{pct}"
    return f"{name}-{cfg.inference}"


def measure_point(cfg: TrainConfig, warmup_s: float, measure_s: float) -> dict[str, Any]:
    """One grid point, its figures printed as a line."""
    row = run_point(cfg, warmup_s, measure_s)
    print(
        {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items() if k in SHOWN},
        flush=True,
    )
    return row
