"""Gradient sync among trainer GMIs on several GPUs: MPR vs MRR vs HAR, weights checked equal.

    python -m bench gmi --only grad-sync --sync-gpus 2 --sync-gmis-per-gpu 2 --sync-steps 30

Starts ``gpus x gmis-per-gpu`` processes (plain shared CUDA processes, no MPS), each a replica
of an MLP (default the GPU-heavy ``211:512:512:512:256:20``) on its GPU. For each strategy it
runs ``--steps`` SGD steps on a different random batch per rank, timing the gradient sync
alone, then checks that every rank holds bit-identical weights. Needs CUDA and NCCL for the
inter-GPU steps (``--inter-backend gloo`` runs anywhere, slowly).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from policies.mlp import build_mlp
from runtime.gmi.grad_sync import GradientSync, SyncPlan, SyncStrategy, choose_strategy


def _worker(
    rank: int, a: argparse.Namespace, layout: list[list[int]], port: int, out_dir: str
) -> None:
    world = len(layout) * len(layout[0])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    gpu = next(g for g, ranks in enumerate(layout) if rank in ranks)
    cuda = torch.cuda.is_available() and a.inter_backend == "nccl"
    device = torch.device("cuda", gpu) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    sizes = [int(x) for x in a.policy.split(":")]
    results = {}
    for strategy in (SyncStrategy.MPR, SyncStrategy.MRR, SyncStrategy.HAR):
        try:
            sync = GradientSync(SyncPlan(strategy, layout), rank, "gloo", a.inter_backend)
        except ValueError as exc:
            results[strategy.value] = {"skipped": str(exc)}
            continue
        torch.manual_seed(0)
        model = build_mlp(sizes).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        gen = torch.Generator(device=device).manual_seed(1000 + rank)
        sync_s = []
        for step in range(a.steps + 3):
            x = torch.randn(a.batch, sizes[0], device=device, generator=gen)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            sync.sync_model_grads(model)
            if cuda:
                torch.cuda.synchronize()
            if step >= 3:  # warm-up excluded
                sync_s.append(time.perf_counter() - t0)
            opt.step()
        flat = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        results[strategy.value] = {
            "sync_ms_median": 1000 * sorted(sync_s)[len(sync_s) // 2],
            "identical_weights": all(torch.equal(gathered[0], g) for g in gathered),
            "params": int(flat.numel()),
        }
        dist.barrier()
    if rank == 0:
        with open(os.path.join(out_dir, "r0.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def measure(a: argparse.Namespace) -> dict:
    """Every strategy on ``a.gpus x a.gmis_per_gpu`` ranks (``a.steps``, ``a.batch``, ``a.policy``,
    ``a.inter_backend``)."""
    layout = [[g * a.gmis_per_gpu + i for i in range(a.gmis_per_gpu)] for g in range(a.gpus)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        tmp.spawn(_worker, args=(a, layout, port, out_dir), nprocs=a.gpus * a.gmis_per_gpu)
        with open(os.path.join(out_dir, "r0.json")) as f:
            results = json.load(f)
    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "layout": layout,
        "algorithm1_choice": choose_strategy(layout).value,
        "policy": a.policy,
        "batch": a.batch,
        "steps": a.steps,
        "inter_backend": a.inter_backend,
        "results": results,
    }
    return doc
