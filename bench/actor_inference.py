"""An actor's per-step policy call, torch ``ActorCritic.act`` vs numpy ``NumpyPolicy.act``.

    python -m bench.actor_inference --obs 105 --act 8 --policy auto:256:128:64:auto \\
        --envs 8,32,64 --calls 2000 --out actor_inference.json

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

from bench.report import emit
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--obs", type=int, default=105, help="observation size (Ant-v5: 105)")
    ap.add_argument("--act", type=int, default=8, help="action size (Ant-v5: 8)")
    ap.add_argument("--discrete", action="store_true", help="categorical actions")
    ap.add_argument("--policy", default="auto:256:128:64:auto", help="MLP spec (policies.mlp)")
    ap.add_argument("--envs", default="8,32,64", help="batch sizes (envs per actor) to time")
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed block")
    ap.add_argument("--repeats", type=int, default=5, help="timed blocks per kind and size")
    ap.add_argument("--import-repeats", type=int, default=3, help="fresh processes per kind")
    ap.add_argument("--out", default=None, help="also write the JSON document here")
    a = ap.parse_args()
    try:
        sizes = [int(x) for x in a.envs.split(",")]
    except ValueError:
        ap.error(f"--envs {a.envs!r}: expected integers, e.g. 8,32,64")
    if min(sizes) < 1 or min(a.obs, a.act, a.calls, a.repeats, a.import_repeats) < 1:
        ap.error("--envs, --obs, --act, --calls, --repeats and --import-repeats must be >= 1")
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
    emit(doc, a.out)


if __name__ == "__main__":
    main()
