"""Trainer GMIs under MPS: steady-state steps/s, GPU W, CPU W and steps/J over a grid of GMI
layouts (SMs granted through MPS %); gradient-sync strategies among GMIs on several GPUs; where
an actor's policy call runs best (torch vs numpy on its core).

    python -m bench gmi --env Ant-v5 --actors 8,15 --devices cpu,cuda --gmis 1,2,4 \\
        --mps 100,50,25,10 [--inference actor,gmi] --state st --part-s 590 --out out/gmi

``--only`` picks the measurements (default ``table``):
  table            one step per grid point (``bench/gmi_table.py``), named like
                   ``cuda-a15-g2-mps50-actor``; cuda points need a GPU (skipped without one).
                   ``--mps`` applies to cuda rows (one percentage for every GMI); cpu rows run
                   once per GMI count; ``--inference actor,gmi`` adds where actions are computed
  grad-sync        MPR vs MRR vs HAR on ``--sync-gpus x --sync-gmis-per-gpu`` ranks, weights
                   checked equal (``bench/grad_sync.py``; ``--inter-backend gloo`` runs anywhere)
  actor-inference  torch ``ActorCritic.act`` vs numpy ``NumpyPolicy.act`` on one thread, per
                   batch size of ``--envs``, and each kind's import time
                   (``bench/actor_inference.py``), in a fresh process
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing as mp

from bench.suite import Step
from bench.workload import add_workload_args

NAME = "gmi"
HELP = "GMIs under MPS: throughput vs SMs granted, gradient sync, actor inference placement"
MEASUREMENTS = ("table", "grad-sync", "actor-inference")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--only", default="table", help=f"measurements to run, of {', '.join(MEASUREMENTS)}"
    )
    t = ap.add_argument_group("table")
    t.add_argument("--env", default="Ant-v5")
    t.add_argument("--actors", default="8,15", help="comma-separated actor counts")
    t.add_argument("--devices", default="cpu,cuda")
    t.add_argument("--gmis", default="1,2,4", help="trainer GMIs per GPU (or on the CPU)")
    t.add_argument("--mps", default="100,50,25,10", help="MPS %% per GMI for cuda rows")
    t.add_argument("--gpus", default=None, help="CUDA devices for the GMIs (default 0)")
    t.add_argument("--grad-sync", default="auto", choices=["auto", "mpr", "mrr", "har"])
    t.add_argument("--inference", default="actor", help="comma-separated: actor, gmi")
    t.add_argument("--inference-mps", type=int, default=100, help="MPS %% of the inference GMI")
    add_workload_args(t)
    t.add_argument("--warmup-s", type=float, default=3.0, help="after the first update")
    t.add_argument("--measure-s", type=float, default=10.0)
    t.add_argument("--max-wall-s", type=float, default=90.0, help="safety limit per point")
    g = ap.add_argument_group("grad-sync")
    g.add_argument("--sync-gpus", type=int, default=2)
    g.add_argument("--sync-gmis-per-gpu", type=int, default=2)
    g.add_argument("--sync-steps", type=int, default=30)
    g.add_argument("--sync-batch", type=int, default=4096)
    g.add_argument("--sync-policy", default="211:512:512:512:256:20")
    g.add_argument("--inter-backend", default="nccl", choices=["nccl", "gloo"])
    i = ap.add_argument_group("actor-inference (its MLP is --policy)")
    i.add_argument("--obs", type=int, default=105, help="observation size (Ant-v5: 105)")
    i.add_argument("--act", type=int, default=8, help="action size (Ant-v5: 8)")
    i.add_argument("--discrete", action="store_true", help="categorical actions")
    i.add_argument("--envs", default="8,32,64", help="batch sizes (envs per actor) to time")
    i.add_argument("--calls", type=int, default=2000, help="calls per timed block")
    i.add_argument("--repeats", type=int, default=5, help="timed blocks per kind and size")
    i.add_argument("--import-repeats", type=int, default=3, help="fresh processes per kind")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    a.only = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in a.only if x not in MEASUREMENTS]
    if bad or not a.only:
        ap.error(f"--only: unknown {bad or 'nothing given'}; allowed {', '.join(MEASUREMENTS)}")
    try:
        a.sizes = [int(x) for x in a.envs.split(",")]
    except ValueError:
        ap.error(f"--envs {a.envs!r}: expected integers, e.g. 8,32,64")
    if min(a.sizes) < 1 or min(a.obs, a.act, a.calls, a.repeats, a.import_repeats) < 1:
        ap.error("--envs, --obs, --act, --calls, --repeats and --import-repeats must be >= 1")
    if min(a.sync_gpus, a.sync_gmis_per_gpu, a.sync_steps, a.sync_batch) < 1:
        ap.error("--sync-gpus, --sync-gmis-per-gpu, --sync-steps and --sync-batch must be >= 1")


def _grad_sync(a: argparse.Namespace) -> dict:
    from bench.grad_sync import measure

    return measure(
        argparse.Namespace(
            gpus=a.sync_gpus,
            gmis_per_gpu=a.sync_gmis_per_gpu,
            steps=a.sync_steps,
            batch=a.sync_batch,
            policy=a.sync_policy,
            inter_backend=a.inter_backend,
        )
    )


def _actor_inference(a: argparse.Namespace) -> dict:
    keys = ("obs", "act", "discrete", "policy", "calls", "repeats", "import_repeats")
    args = argparse.Namespace(**{k: getattr(a, k) for k in keys})
    # a fresh process: one thread for numpy and torch, set before either loads
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(_actor_inference_child, args, a.sizes).result()


def _actor_inference_child(args: argparse.Namespace, sizes: list[int]) -> dict:
    from bench.actor_inference import measure

    return measure(args, sizes)


def plan(a: argparse.Namespace):
    steps = []
    if "table" in a.only:
        from bench.gmi_table import grid, measure_point, point_name

        for cfg in grid(a):
            steps.append(
                Step(
                    point_name(cfg),
                    lambda cfg=cfg: measure_point(cfg, a.warmup_s, a.measure_s),
                    min(a.max_wall_s, 30 + a.warmup_s + a.measure_s) + 15,
                    needs_gpu=cfg.trainer_device != "cpu",
                )
            )
    if "grad-sync" in a.only:
        gpu = a.inter_backend == "nccl"
        steps.append(Step("grad-sync", lambda: _grad_sync(a), 60 + a.sync_steps, needs_gpu=gpu))
    if "actor-inference" in a.only:
        blocks = 2 * a.repeats * a.calls * len(a.sizes)
        est = 10 + blocks * 2e-4 + 2 * a.import_repeats * 3
        steps.append(Step("actor-inference", lambda: _actor_inference(a), est))
    return steps, None
