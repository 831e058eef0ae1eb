"""The learner alone: joules per trained sample of a run's learner on synthetic batches, for
each device and batch size, above the machine's idle draw. Added to the raw-stepping limit's
joules per step, the cheapest of them gives a second limit, one that counts the learning: no
run that trains every step it samples can beat it.

    python -m bench.learner_limit --env Ant-v5 --policy auto:256:128:64:auto --json out.json

The machine's idle power is measured first, before torch is imported (no CUDA context), with
the same meter as every arm (``bench.machine_meter``). Each setting then runs updates for
``--seconds`` (CPU first, batches in increasing size; a setting whose first update alone takes
longer is measured on that update, marked ``single_update``, and the larger batches of that
device are skipped); its joules above idle per trained sample is its marginal cost at its own
rate. A GPU setting's cost includes what opening a CUDA context adds; a CPU setting's, its busy
core. This is the process of the ``learner`` arm of ``python -m bench peers``.

A learner in a run trains at the rate its actors sample, far below what it reaches alone on
synthetic batches (Ant-v5 on an H200: 48k steps/s raw against 1.9M samples/s), and a GPU holds
its context's watts the whole time (44 W on an H100, ``docs/BENCHMARKS.md``). So each device's
resting draw with the learner made (its ``rest_w``: idle with the context open) is measured too,
CPU first (before any context): ``cost_at(setting, rate)`` is then the device's fixed watts over
``rate`` plus the setting's busy joules above its rest per sample, what the learner costs fed at
``rate`` (the raw limit's step rate gives the second limit of ``bench.payoff_report``).

``--devices cuda,cuda-plain,cuda-eager`` measures a GPU learner's minibatch steps replayed from
CUDA graphs with the loss compiled (``policies.graphed_step``, ``policies.compiled_loss``: what a
trainer runs), the same graphs with the plain loss (``--compile-loss off``), and the eager loop
they replace, side by side in one run (each device's first update, which compiles and captures,
is timed on its own: ``first_update_s``); ``--epochs`` and ``--minibatches`` set the update's
steps (the run's learner flags of those names).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.machine_meter import MachineMeter

BATCHES = (4096, 16384, 65536)
DEVICES = ("cpu", "cuda", "cuda-plain", "cuda-eager")


def _mark(meter: MachineMeter) -> float:
    """Takes a sample now; its time."""
    meter.sample()
    return meter.samples[-1][0]


def _joules(meter: MachineMeter, t0: float, t1: float) -> tuple[float, float]:
    """(joules, of them the CPU model's idle) between two sampled times."""
    g0, c0, i0 = meter.parts_at(t0)
    g1, c1, i1 = meter.parts_at(t1)
    return (g1 - g0) + (c1 - c0), i1 - i0


def measure(
    env_id: str,
    policy: str,
    rollout_len: int,
    devices: list[str],
    batches: tuple[int, ...],
    seconds: float,
    idle_s: float,
    learner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meter = MachineMeter(interval_s=0.25).start()
    t0 = _mark(meter)
    time.sleep(idle_s)
    t1 = _mark(meter)
    idle_j, _ = _joules(meter, t0, t1)
    idle_w = idle_j / (t1 - t0)

    import torch

    from runtime.envs import probe_env
    from runtime.learner_probe import make_learner, synthetic_batch

    torch.set_num_threads(1)
    info = probe_env(env_id)
    rows, rests, firsts = [], {}, {}
    for device in sorted(devices, key=lambda d: d.startswith("cuda")):  # before any context
        if device.startswith("cuda") and not torch.cuda.is_available():
            continue
        graphs = device != "cuda-eager"  # the eager loop with the plain Adam it runs
        plain = {"compile_loss": False} if device == "cuda-plain" else {}
        _, update = make_learner(
            info, policy, device.split("-")[0], {**(learner or {}), **plain}, graphs
        )
        a = _mark(meter)
        time.sleep(idle_s)  # the device at rest with the learner made (a GPU: its context open)
        b = _mark(meter)
        rest_w = rests[device] = _joules(meter, a, b)[0] / (b - a)
        a = time.time()  # the first update: a compiled loss compiles, graphs are captured
        update(synthetic_batch(info, min(batches), rollout_len))
        firsts[device] = time.time() - a
        for size in sorted(batches):
            batch = synthetic_batch(info, size, rollout_len)
            samples_per_update = batch["rewards"].size
            a = _mark(meter)
            update(batch)  # warm-up: allocations, kernels chosen
            b = _mark(meter)
            slow = b - a > seconds  # one update takes longer than a setting's budget
            updates = 1 if slow else 0
            if not slow:  # measured again without the warm-up
                a = _mark(meter)
                while time.time() - a < seconds:
                    update(batch)
                    updates += 1
                b = _mark(meter)
            joules, _ = _joules(meter, a, b)
            samples = updates * samples_per_update
            rows.append(
                {
                    "device": device,
                    "batch_size": samples_per_update,
                    "updates": updates,
                    "samples_per_s": samples / (b - a),
                    "watts": joules / (b - a),
                    "marginal_j_per_sample": max(joules - idle_w * (b - a), 0.0) / samples,
                    "single_update": slow,
                    "fixed_w": max(rest_w - idle_w, 0.0),
                    "busy_j_per_sample": max(joules - rest_w * (b - a), 0.0) / samples,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            if slow:
                break  # larger batches on this device would take longer still
    meter.stop()
    best = min(rows, key=lambda r: r["marginal_j_per_sample"]) if rows else None
    return {
        "idle_w": idle_w,
        "rest_w": rests,
        "first_update_s": firsts,
        "sources": meter.sources,
        "settings": rows,
        "best": best,
    }


def cost_at(setting: dict[str, Any], rate: float) -> float | None:
    """Joules per trained sample of ``setting`` (a row of ``measure``) fed ``rate`` samples/s:
    its device's fixed watts at rest (a GPU's open context) spread over ``rate``, plus its busy
    joules per sample; None where it cannot keep up (``rate`` above its own). A row measured
    before the rest was (no ``fixed_w``) gives its marginal cost at its own rate."""
    if "fixed_w" not in setting:
        return setting["marginal_j_per_sample"]
    if rate <= 0 or rate > setting["samples_per_s"]:
        return None
    return setting["fixed_w"] / rate + setting["busy_j_per_sample"]


def cheapest_at(settings: list[dict[str, Any]], rate: float) -> dict[str, Any] | None:
    """The setting that costs least fed ``rate`` samples/s: the row with ``j_per_sample`` (its
    cost), ``keeps_up`` and ``rest_measured``. Where none keeps up, the cheapest fed its own
    rate, with ``keeps_up`` False (no learner of these trains as fast as ``rate``)."""
    keeps_up = [(s, c) for s in settings if (c := cost_at(s, rate)) is not None]
    pool = keeps_up or [
        (s, c)
        for s in settings
        if s.get("samples_per_s") and (c := cost_at(s, s["samples_per_s"])) is not None
    ]
    if not pool:
        return None
    s, c = min(pool, key=lambda sc: sc[1])
    return {**s, "j_per_sample": c, "keeps_up": bool(keeps_up), "rest_measured": "fixed_w" in s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", required=True)
    ap.add_argument("--policy", default="auto:64:64:auto")
    ap.add_argument("--rollout-len", type=int, default=32)
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--batches", default=",".join(str(b) for b in BATCHES))
    ap.add_argument("--seconds", type=float, default=6.0, help="per setting")
    ap.add_argument("--epochs", type=int, default=None, help="passes over each batch")
    ap.add_argument("--minibatches", type=int, default=None, help="minibatches per pass")
    ap.add_argument(
        "--idle-s", type=float, default=5.0, help="idle power (before torch), each device at rest"
    )
    ap.add_argument("--json", required=True, help="where the result goes")
    a = ap.parse_args(argv)
    try:
        batches = tuple(int(b) for b in a.batches.split(","))
    except ValueError:
        ap.error(f"--batches {a.batches!r}: comma-separated integers")
    devices = [d.strip() for d in a.devices.split(",") if d.strip()]
    if bad := [d for d in devices if d not in DEVICES]:
        ap.error(f"--devices: unknown {bad}; allowed {', '.join(DEVICES)}")
    learner = {k: v for k, v in (("epochs", a.epochs), ("minibatches", a.minibatches)) if v}
    if any(v < 1 for v in learner.values()):
        ap.error("--epochs and --minibatches must be >= 1")
    if a.seconds <= 0 or a.idle_s <= 0 or min(batches) < a.rollout_len:
        ap.error("--seconds and --idle-s must be > 0, and every batch >= --rollout-len")
    doc = measure(a.env, a.policy, a.rollout_len, devices, batches, a.seconds, a.idle_s, learner)
    doc["learner"] = learner
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
