"""Short measurements of a workload on this machine, taken before a run is sized
(``autotune.tuning.sizing``): one env step's CPU cost alone, an actor's round (envs stepped,
one policy forward) with an actor on every core at once, one policy forward on an actor core
at a few env counts, and the learner's cost per update at a few batch sizes on every device.

They run in a child process (``python -m runtime.probes``, JSON on stdout), so the caller never
holds a CUDA context (about 56 W on an H100 while it lives) or torch's threads, and every
measurement is of one thread, as an actor or a one-thread trainer runs. Each probe is bounded in
time: a CartPole probe takes about a second of CPU, a MuJoCo one two or three.

Raises ``ProbeError`` with the child's message when the workload cannot be probed (an env that
cannot be made, a policy spec that does not fit it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from policies.appo_config import APPOConfig
from policies.mlp import parse_spec
from runtime.actor_placement import BLAS_THREAD_VARS
from runtime.cache_dirs import use_bytecode_cache
from runtime.env_probes import (
    PROBE_S,
    ProbeError,
    probe_env_step,
    probe_forward,
    probe_rounds_loaded,
    timed,
)
from runtime.envs import EnvInfo, probe_env
from runtime.learner_probe import GROUP_LEARNER, make_learner, synthetic_batch
from runtime.power_probe import Reading, busy_watts, gpu_busy_pct, gpu_meter
from runtime.probe_child import GPU_LEARNER_MARK, failure_line, run_child
from runtime.probe_results import LearnerCost, Probes
from runtime.process_exit import freeze_at_exit

LEARNER_BATCHES = (1024, 4096, 16384)
"""Batch sizes the learner update is timed at (its fixed and per-sample cost), each at least
``learner_batches``' floor."""
LEARNER_STOP_S = 0.08
"""The learner's batch stops growing once one update takes longer than this, two sizes measured
(the line through them extrapolates)."""
DOMINATED = 4.0
"""A device whose update at the smallest batch is over ``LEARNER_STOP_S`` and this many times
slower than a device already probed is measured at that one size only (its line goes through
the origin): it cannot keep up, and a big policy's CPU update takes seconds per size."""


def learner_batches(minibatches: int, rollout_len: int) -> list[int]:
    """``LEARNER_BATCHES``, each raised to hold two trajectories per minibatch: a minibatch of
    one runs the plain loss where the others run the compiled one (``policies.compiled_loss``),
    so a line through it and them would not be the learner's. (Sized runs train minibatches of
    at least ``autotune.tuning.knobs.MIN_MINIBATCH`` samples: four trajectories at PPO's
    32 x 32.) Two sizes at least, as ``probe_learner`` needs."""
    floor = 2 * minibatches * rollout_len
    sizes = sorted({max(size, floor) for size in LEARNER_BATCHES})
    if len(sizes) < 2:  # every size raised to the floor: a second, so the line sees the fixed cost
        sizes.append(4 * sizes[0])
    return sizes


def probe_learner(
    info: EnvInfo,
    policy: str,
    device: str,
    rollout_len: int,
    learner: dict[str, Any],
    rival: LearnerCost | None = None,
    group: bool = False,
    update: Callable[[dict], None] | None = None,
    first: list[float] | None = None,
) -> LearnerCost:
    """Seconds per update of the run's learner on ``device`` with synthetic batches, at two
    sizes at least (a GPU learner's update can cost the same at every size: a fixed cost the
    line must see); stops growing the batch once one update takes over ``LEARNER_STOP_S``,
    and after the first size where ``device`` is ``DOMINATED`` by ``rival`` (another device
    probed before). ``group``: the update of a trainer group's member on CUDA (the eager loop,
    timed once per size after one untimed update: it is slow), as ``GROUP_LEARNER``.
    ``update``: a learner's update function (``make_learner``) to time instead of a new one.
    ``first``: each size's first, untimed update's seconds are appended to it. A CPU update
    (one thread) is timed on the thread's own clock, a GPU's as time passes (``timed``).

    Without ``update``, the learner made here runs one epoch per update and its seconds are
    scaled by the run's epochs: an eager learner's update is its epochs' V-trace passes and
    minibatch steps, each epoch the same work, so one epoch tells the cost of all of them in
    a tenth of the time at PPO's 10 epochs (the once-per-update part, the batch's copy to the
    device and its observation sums, is counted once per epoch: a little over)."""
    cfg = APPOConfig(**learner)
    epochs = cfg.epochs if update is None else 1
    if update is None:
        _, update = make_learner(info, policy, device, {**learner, "epochs": 1}, not group)
    seconds: dict[int, float] = {}
    for size in learner_batches(cfg.minibatches, rollout_len):
        batch = synthetic_batch(info, size, rollout_len)
        size = batch["rewards"].size
        least = 1 if group else 2
        clock = time.perf_counter if group or device != "cpu" else time.thread_time
        one = timed(
            lambda b=batch: update(b), budget_s=PROBE_S / 2, least=least, first=first, clock=clock
        )
        seconds[size] = one * epochs
        if len(seconds) >= 2 and seconds[size] > LEARNER_STOP_S:
            break
        if _dominated(seconds[size], size, rival):
            break
    return LearnerCost(GROUP_LEARNER if group else device, seconds)


def _dominated(update_s: float, size: int, rival: LearnerCost | None) -> bool:
    """Whether an update of ``size`` samples taking ``update_s`` is ``DOMINATED`` by
    ``rival``'s update at the same size."""
    if rival is None or size not in rival.seconds or update_s <= LEARNER_STOP_S:
        return False
    return update_s > DOMINATED * rival.seconds[size]


def measure(
    env_id: str,
    policy: str,
    rollout_len: int,
    learner: dict[str, Any],
    devices: list[str],
    procs: int = 1,
    backend: str = "gymnasium",
    say_gpu_learner: bool = False,
    also: tuple[str, ...] = (),
) -> Probes:
    """Every probe, in this process (``run_probes`` runs them in a child); the env steps on
    ``backend`` (``runtime.env_backends``, resolved), and its step and loaded rounds are timed
    on the backends ``also`` names as well; ``say_gpu_learner``: say on stderr when the GPU
    learner's timing begins (``runtime.probe_child.GPU_LEARNER_MARK``)."""
    start = time.perf_counter()
    stage_s: dict[str, float] = {}
    mark = [start]

    def took(stage: str) -> None:
        now = time.perf_counter()
        stage_s[stage] = stage_s.get(stage, 0.0) + now - mark[0]
        mark[0] = now

    info = probe_env(env_id, backend)  # an env that cannot be made fails before torch loads
    took("env")  # with its backend's import (EnvPool's: seconds)
    # the GPU's draw before anything here opens a context on it, read over the env probes
    meter = gpu_meter() if "cuda" in devices else None
    idle = Reading(meter) if meter is not None else None
    busy: list[float] = []  # the GPU's utilisation over the idle reading: another's work?

    def sample_busy() -> None:
        pct = gpu_busy_pct() if idle is not None else None
        if pct is not None:
            busy.append(pct)

    sample_busy()
    took("gpu_power")
    step = probe_env_step(env_id, backend=backend)
    took("env")
    sample_busy()
    sizes = parse_spec(policy, info.obs_dim, info.act_dim)
    loaded = probe_rounds_loaded(env_id, procs, sizes, info.discrete, backend=backend)["cpu"]
    took("env_loaded")
    sample_busy()
    others = {b: other_backend(env_id, b, info, procs, sizes) for b in also if b != backend}
    took("env_other_backends")
    power: dict[str, float] = {}
    if idle is not None:
        power["idle_w"] = idle.watts()
        sample_busy()
        took("gpu_power")

    import torch

    torch.set_num_threads(1)
    took("torch")
    forward = probe_forward(sizes, info.discrete, bool(learner.get("normalize_obs", True)))
    sms: list[int] = []
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        sms = [torch.cuda.get_device_properties(i).multi_processor_count for i in range(n)]
    took("forward")
    costs: dict[str, LearnerCost] = {}
    cuda_update = None  # kept for the GPU power probe: its graphs are captured already
    if "cuda" in devices and sms:  # first: the fast one, the others' rival
        if say_gpu_learner:
            print(GPU_LEARNER_MARK, file=sys.stderr, flush=True)
        built = time.perf_counter()
        _, cuda_update = make_learner(info, policy, "cuda", learner)
        built, first = time.perf_counter() - built, []
        costs["cuda"] = probe_learner(
            info, policy, "cuda", rollout_len, learner, update=cuda_update, first=first
        )
        took("learner_cuda")
        # of it: the learner made (its CUDA context) and each size's first update (a compile
        # and a graph's capture at a new shape), the rest timing
        stage_s["learner_cuda.build"], stage_s["learner_cuda.first"] = built, sum(first)
        costs[GROUP_LEARNER] = probe_learner(info, policy, "cuda", rollout_len, learner, group=True)
        took(f"learner_{GROUP_LEARNER}")
    # the CUDA context is open and the GPU has nothing to run: its draw is read meanwhile
    context = Reading(meter) if meter is not None and cuda_update is not None else None
    for device in sorted(d for d in devices if d != "cuda"):  # eager: one epoch, scaled
        costs[device] = probe_learner(info, policy, device, rollout_len, learner, costs.get("cuda"))
        took(f"learner_{device}")
    if context is not None:
        power["context_w"] = context.watts()
        update, batch = cuda_update, synthetic_batch(info, max(costs["cuda"].seconds), rollout_len)
        update(batch)  # at the largest size probed: its graph is captured already
        power["busy_w"] = busy_watts(meter, lambda: update(batch))
        took("gpu_power")
    return Probes(
        env_id,
        policy,
        step,
        forward,
        costs,
        sms,
        time.perf_counter() - start,
        gpu_power=power if len(power) == 3 else {},
        round_loaded_s=loaded,
        stage_s={k: round(v, 3) for k, v in stage_s.items()},
        backend=backend,
        other_backends={b: o for b, o in others.items() if o is not None},
        gpu_busy_pct=max(busy) if busy else None,
    )


def other_backend(
    env_id: str, backend: str, info: EnvInfo, procs: int, sizes: list[int]
) -> dict[str, Any] | None:
    """``env_id``'s step and loaded rounds on ``backend`` as well (``Probes.other_backends``);
    None where that backend's env has other spaces than ``info`` (the run's policy would not
    fit it)."""
    there = probe_env(env_id, backend)
    if (there.obs_dim, there.act_dim, there.discrete) != (
        info.obs_dim,
        info.act_dim,
        info.discrete,
    ):
        return None
    return {
        "env_step_s": probe_env_step(env_id, backend=backend),
        "round_loaded_s": probe_rounds_loaded(env_id, procs, sizes, info.discrete, backend=backend)[
            "cpu"
        ],
    }


def run_probes(
    env_id: str,
    policy: str,
    rollout_len: int,
    learner: dict[str, Any],
    devices: list[str],
    procs: int = 1,
    timeout_s: float = 300.0,
    backend: str = "gymnasium",
    on_gpu_learner: Callable[[], None] | None = None,
    also: tuple[str, ...] = (),
) -> Probes:
    """Every probe in a child process (see the module docstring; ``also``: as ``measure``'s);
    ``on_gpu_learner`` is called as the GPU learner's timing begins (``runtime.probe_child``).

    Raises:
        ProbeError: the child failed or timed out; the exception it ended with is in the
            message (``runtime.probe_child.failure_line``).
    """
    args = {
        "env": env_id,
        "policy": policy,
        "rollout_len": rollout_len,
        "learner": learner,
        "devices": devices,
        "procs": procs,
        "backend": backend,
        "also": list(also),
    }
    cmd = [sys.executable, "-m", "runtime.probes", json.dumps(args)]
    start = time.perf_counter()
    use_bytecode_cache()  # before the child and the processes it starts import torch
    env = dict(os.environ, **dict.fromkeys(BLAS_THREAD_VARS, "1"))  # as an actor runs
    ran = run_child(cmd, env, timeout_s, on_gpu_learner)
    if ran is None:
        raise ProbeError(f"the workload probes took over {timeout_s:.0f} s")
    code, stdout, stderr = ran
    if code != 0:
        raise ProbeError(failure_line(stderr, code))
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ProbeError(f"probe process printed no result: {stdout[-200:]!r}") from None
    doc["probe_s"] = time.perf_counter() - start
    doc["measured_at"] = time.time()
    return Probes.from_dict(doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="probe a workload's costs (JSON on stdout)")
    ap.add_argument("spec", help="JSON: env, policy, rollout_len, learner, devices")
    spec = json.loads(ap.parse_args(argv).spec)
    freeze_at_exit()
    try:
        probes = measure(
            spec["env"],
            spec["policy"],
            spec["rollout_len"],
            spec["learner"],
            spec["devices"],
            int(spec.get("procs", 1)),
            spec.get("backend", "gymnasium"),
            say_gpu_learner=True,
            also=tuple(spec.get("also", ())),
        )
    except Exception as exc:  # reported to the parent as the last stderr line
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(probes.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
