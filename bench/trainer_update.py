"""Time of one learner update on the CPU, ``nn.Tanh`` against ``policies.fast_tanh.Tanh``.

    python -m bench.trainer_update --obs 105 --act 8 --policy auto:256:128:64:auto \\
        --envs 512 --rollout-len 32 --threads 1,2,4 --repeats 7 --out trainer_update.json

A trainer on the CPU (``--trainer-device cpu``) spends its time in the MLP's matrix products
and activations. This times ``APPOLearner.update`` on one random batch of ``envs x rollout-len``
rows (Ant-v5's sizes by default: 105 observations, 8 actions) for both activations, alternating
them repeat by repeat in one process so the machine's noise falls on both alike. It prints the
median seconds per update of each, the ratio, and the trained steps/s each update rate allows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from torch import nn

from bench.report import emit
from policies.actor_critic import ActorCritic
from policies.appo import APPOLearner
from policies.appo_config import APPOConfig
from policies.fast_tanh import Tanh

ACTIVATIONS = {"nn.Tanh": nn.Tanh, "fast_tanh": Tanh}


def random_batch(envs: int, t: int, obs: int, act: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((envs, t + 1, obs)).astype(np.float32),
        "actions": rng.standard_normal((envs, t, act)).astype(np.float32),
        "logp": rng.standard_normal((envs, t)).astype(np.float32),
        "rewards": rng.standard_normal((envs, t)).astype(np.float32),
        "dones": (rng.random((envs, t)) < 0.01).astype(np.float32),
        "versions": np.zeros(envs, np.int64),
    }


def learner(activation: type[nn.Module], a: argparse.Namespace) -> APPOLearner:
    torch.manual_seed(0)
    model = ActorCritic(a.obs, a.act, False, a.policy)
    for net in (model.pi, model.v):  # same weights, only the activation modules differ
        for i, layer in enumerate(net):
            if isinstance(layer, (nn.Tanh, Tanh)):
                net[i] = activation()
    return APPOLearner(model, APPOConfig(), torch.device("cpu"))


def measure(a: argparse.Namespace, threads: int) -> dict:
    torch.set_num_threads(threads)
    batch = random_batch(a.envs, a.rollout_len, a.obs, a.act)
    learners = {name: learner(act, a) for name, act in ACTIVATIONS.items()}
    for lrn in learners.values():
        lrn.update(batch)  # warm-up: allocator and kernels
    times: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(a.repeats):
        for name, lrn in learners.items():
            t0 = time.perf_counter()
            lrn.update(batch)
            times[name].append(time.perf_counter() - t0)
    rows = a.envs * a.rollout_len
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {
        "threads": threads,
        "rows": rows,
        "median_s": med,
        "trained_steps_per_s": {name: rows / s for name, s in med.items()},
        "fast_over_nn": med["fast_tanh"] / med["nn.Tanh"],
        "all_s": times,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--obs", type=int, default=105, help="observation size (Ant-v5: 105)")
    ap.add_argument("--act", type=int, default=8, help="continuous action size (Ant-v5: 8)")
    ap.add_argument("--policy", default="auto:256:128:64:auto", help="MLP spec (policies.mlp)")
    ap.add_argument("--envs", type=int, default=512, help="rows of the batch's env axis")
    ap.add_argument("--rollout-len", type=int, default=32)
    ap.add_argument("--threads", default="1,2,4", help="torch intra-op thread counts to time")
    ap.add_argument("--repeats", type=int, default=7, help="timed updates per activation")
    ap.add_argument("--out", default=None, help="also write the JSON document here")
    a = ap.parse_args()
    try:
        threads = [int(x) for x in a.threads.split(",")]
    except ValueError:
        ap.error(f"--threads {a.threads!r}: expected integers, e.g. 1,2,4")
    if min(threads) < 1 or min(a.obs, a.act, a.envs, a.rollout_len, a.repeats) < 1:
        ap.error("--threads, --obs, --act, --envs, --rollout-len and --repeats must be >= 1")
    doc = {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "policy": a.policy,
        "obs": a.obs,
        "act": a.act,
        "results": [measure(a, n) for n in threads],
    }
    emit(doc, a.out)


if __name__ == "__main__":
    main()
