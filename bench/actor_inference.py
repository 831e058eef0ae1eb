"""An actor's per-step policy call, torch ``ActorCritic.act`` vs numpy ``NumpyPolicy.act``.

    python -m bench gmi --only actor-inference --obs 105 --act 8 --policy auto:256:128:64:auto \\
        --envs 8,32,64 --calls 2000 --out out/gmi

Both act with the same weights on one thread (an actor owns one core), alternating in blocks
of ``--calls`` calls so the machine's noise falls on both alike; the median of ``--repeats``
blocks is reported per batch size, with the ratio. It also times how long a fresh Python
process takes to import what each kind of actor needs (torch and the model, or numpy only):
an actor pays that at every start, and the online tuner starts actors mid-run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as an actor (before numpy/torch load)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import torch

from policies.actor_critic import ActorCritic
from policies.numpy_policy import NumpyPolicy

IMPORTS = {
    "torch": "import torch, policies.actor_critic",
    "numpy": "import numpy, policies.numpy_policy",
}


def time_calls(fn, obs: np.ndarray, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(obs)
    return (time.perf_counter() - t0) / calls


def import_s(code: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(a: argparse.Namespace, sizes: list[int]) -> dict:
    """The torch and numpy actors' per-call times at each batch size, and their import times."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ActorCritic(a.obs, a.act, a.discrete, a.policy)
    policy = NumpyPolicy(a.discrete, True, *model.state_arrays(), seed=0)
    rows = []
    for n in sizes:
        obs = np.random.default_rng(n).standard_normal((n, a.obs)).astype(np.float32)
        kinds = {"torch": model.act, "numpy": policy.act}
        for fn in kinds.values():
            time_calls(fn, obs, 50)  # warm-up
        per_call: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(a.repeats):
            for kind, fn in kinds.items():
                per_call[kind].append(time_calls(fn, obs, a.calls))
        med = {k: statistics.median(v) for k, v in per_call.items()}
        rows.append(
            {
                "envs": n,
                "us_per_call": {k: v * 1e6 for k, v in med.items()},
                "us_per_env_step": {k: v * 1e6 / n for k, v in med.items()},
                "numpy_over_torch": med["numpy"] / med["torch"],
            }
        )
    doc = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "policy": a.policy,
        "obs": a.obs,
        "act": a.act,
        "rows": rows,
        "import_s": {k: import_s(code, a.import_repeats) for k, code in IMPORTS.items()},
    }
    return doc
