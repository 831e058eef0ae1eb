"""``python -m bench.probe_load``: how far a busy machine moves the workload probes that ``auto``
sizing builds on, and that the probe cache keeps for a week.

Three conditions, one after the other: quiet, loaded, and quiet again. The load is ``--busy``
processes spinning (pure-Python loops, several per core: another job's actors, say), or with
``--load gpu`` one process running matrix products on the GPU back to back (another job's
trainer), where the probes then time the GPU learner too and report the GPU's utilisation as
they read it idle (``Probes.gpu_busy_pct``; over ``SHARED_GPU_PCT`` a run does not cache them).
In each:

* the probes as a run takes them (``runtime.probes.run_probes``, in their child process): one
  env step, the policy forward at 32 envs, and the CPU learner's update at ``--batch`` samples
  from the line its probe fitted;
* the same CPU update timed here on both clocks side by side (one epoch's, counted for the
  learner's epochs as the probe counts it): as time passes, and on the timing thread's CPU
  clock (what the probes use for work on their own thread).

Each figure under load is divided by the mean of the two quiet ones. Prints a table;
``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

POLICY = "auto:64:64:auto"
GPU_SPIN = (
    "import sys, threading, torch\n"
    "a = torch.randn(4096, 4096, device=sys.argv[1])\n"
    "torch.tanh(a @ a).cpu()\n"
    "print('running', flush=True)\n"
    "ended = threading.Event()\n"
    "threading.Thread(target=lambda: (sys.stdin.read(), ended.set()), daemon=True).start()\n"
    "while not ended.is_set():\n"
    "    a = torch.tanh(a @ a)\n"
    "torch.tanh(a).cpu()\n"
)
"""Another job's trainer, as far as the GPU can tell: matrix products back to back on the
device its argument names, until its stdin closes; then it ends as a job does, its last
product done and its CUDA context closed (a client killed under MPS with its kernels running
leaves the server cleaning up after it, and refusing new clients while it does)."""
END_WAIT_S = 60.0
"""How long the load may take to end once told; past it, it is killed."""


def start_gpu_load(device: str = "cuda") -> subprocess.Popen:
    """The GPU load, once its first product is done (``end_gpu_load`` ends it)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", GPU_SPIN, device], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    if proc.stdout.readline().strip() != b"running":
        end_gpu_load(proc)
        raise RuntimeError("the GPU load process failed to start; see its stderr")
    return proc


def end_gpu_load(proc: subprocess.Popen) -> int:
    """Tells the load to end and waits for it (killed past ``END_WAIT_S``); its exit code."""
    with contextlib.suppress(OSError):  # it may have gone already
        proc.stdin.close()
    try:
        return proc.wait(END_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def probe_figures(
    env: str, policy: str, rollout: int, batch: int, gpu: bool
) -> dict[str, float | None]:
    from runtime.probes import run_probes

    p = run_probes(env, policy, rollout, {}, ["cpu", "cuda"] if gpu else ["cpu"])
    fixed, per = p.learners["cpu"].fit()
    out: dict[str, float | None] = {
        "env_step_us": p.env_step_s * 1e6,
        "forward32_us": p.forward_s[32] * 1e6,
        "update_ms": (fixed + per * batch) * 1e3,
    }
    if gpu:
        fixed, per = p.learners["cuda"].fit()
        out["cuda_update_ms"] = (fixed + per * batch) * 1e3
        out["gpu_busy_pct"] = p.gpu_busy_pct  # None where NVML could not read it
        out["gpu_shared"] = float(p.gpu_shared())
    return out


def direct_update(env: str, policy: str, rollout: int, batch: int) -> dict[str, float]:
    """A learner's update at ``batch`` samples timed on both clocks, one clock after the
    other: one epoch's, counted ``epochs`` times, as the probe counts it."""
    import torch

    from policies.appo_config import APPOConfig
    from runtime.env_probes import timed
    from runtime.envs import probe_env
    from runtime.learner_probe import make_learner, synthetic_batch

    torch.set_num_threads(1)
    info = probe_env(env)
    _, update = make_learner(info, policy, "cpu", {"epochs": 1})
    data = synthetic_batch(info, batch, rollout)
    ms = APPOConfig().epochs * 1e3
    return {
        "wall_ms": timed(lambda: update(data), budget_s=1.0, clock=time.perf_counter) * ms,
        "thread_ms": timed(lambda: update(data), budget_s=1.0, clock=time.thread_time) * ms,
    }


def measure(
    env: str, policy: str, rollout: int, batch: int, busy: int, load: str = "cpu"
) -> dict[str, Any]:
    gpu = load == "gpu"

    def condition(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "probes": probe_figures(env, policy, rollout, batch, gpu),
            "direct": direct_update(env, policy, rollout, batch),
        }

    rows = [condition("quiet")]
    spin: list[subprocess.Popen] = []
    gpu_load: subprocess.Popen | None = None
    try:
        if gpu:
            gpu_load = start_gpu_load()
            name = "a GPU process"
        else:
            for _ in range(busy):
                spin.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
            time.sleep(1.0)  # every spinner running
            name = f"{busy} busy processes"
        rows.append(condition(name))
    finally:
        if gpu_load is not None:
            end_gpu_load(gpu_load)
        for proc in spin:
            proc.kill()
            proc.wait()
    rows.append(condition("quiet again"))
    ratios = {}
    for part in ("probes", "direct"):
        for key in (k for k in rows[0][part] if k not in ("gpu_busy_pct", "gpu_shared")):
            quiet = (rows[0][part][key] + rows[2][part][key]) / 2
            ratios[f"{part}.{key}"] = rows[1][part][key] / quiet
    doc = {"env": env, "policy": policy, "batch": batch, "load": load, "busy": busy}
    doc["cores"] = os.cpu_count()
    return {**doc, "rows": rows, "loaded_over_quiet": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.probe_load", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--policy", default=POLICY)
    ap.add_argument("--rollout-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4096, help="the update's samples (default 4096)")
    ap.add_argument(
        "--busy", type=int, default=3 * (os.cpu_count() or 1), help="spinning processes"
    )
    ap.add_argument(
        "--load",
        choices=("cpu", "gpu"),
        default="cpu",
        help="cpu: --busy spinning processes; gpu: one process of matrix products on the GPU",
    )
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    if args.busy < 1 or args.batch < args.rollout_len or args.rollout_len < 1:
        ap.error("--busy must be at least 1, --rollout-len at least 1 and --batch at least it")
    if args.load == "gpu":  # NVML reads the GPU's utilisation, CUDA runs the load and learner
        from runtime.hw.gpus import no_gpu_reason, torch_sees_gpu

        why = no_gpu_reason() or (None if torch_sees_gpu() else "torch sees no CUDA GPU")
        if why:
            ap.error(f"--load gpu needs a CUDA GPU that NVML reads: {why} (use --load cpu)")
    doc = measure(args.env, args.policy, args.rollout_len, args.batch, args.busy, args.load)
    for row in doc["rows"]:
        figures = {**row["probes"], **{f"direct_{k}": v for k, v in row["direct"].items()}}
        shown = (f"{k} {'-' if v is None else f'{v:.1f}'}" for k, v in figures.items())
        print(f"{row['name']:>20}: " + ", ".join(shown))
    print(
        "loaded / quiet: " + ", ".join(f"{k} {v:.2f}" for k, v in doc["loaded_over_quiet"].items())
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
