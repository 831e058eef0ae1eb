"""The ``auto`` values of ``autotune train``'s sizing flags: their argparse types, and the run's
config sized from probes (``autotune.workflows.auto_size``) with what was chosen printed."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console
from rich.markup import escape

from runtime.config import ConfigError, TrainConfig


def int_list(text: str) -> tuple[int, ...]:
    """``"50"`` or ``"50,25"`` -> a tuple of ints (argparse type)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers, e.g. 50 or 50,25"
        ) from None
    return values


def int_or_auto(text: str) -> int | str:
    """An integer or ``auto`` (argparse type)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer or auto") from None


def mps_or_auto(text: str) -> tuple[int, ...] | str:
    return text if text == "auto" else int_list(text)


def tuned_space(args: argparse.Namespace) -> dict[str, tuple] | None:
    """The values a tuned run's ``--knob`` flags narrow the sized fields to (the start is
    sized inside the space the tuner searches); None when not tuning or nothing is narrowed.

    Raises:
        ConfigError: a ``--knob`` the tuner would refuse (malformed, or a GPU knob on a machine
            with none), said before the probes, with the tuner's own message.
    """
    if not getattr(args, "tune", False) or not getattr(args, "knob", None):
        return None
    from autotune.tuning.knobs import KnobError, Machine, build_space
    from autotune.workflows.auto_size import AUTO_FIELDS, usable_cores
    from runtime.hw.gpus import list_gpus

    named = {k.partition("=")[0].strip().replace("-", "_") for k in args.knob}
    try:
        space = build_space(Machine(usable_cores(), len(list_gpus())), list(args.knob))
    except KnobError as exc:
        raise ConfigError([str(exc)]) from None
    return {n: space[n].choices for n in named & set(AUTO_FIELDS) if n in space}


def within_budget(allowed: dict[str, tuple] | None, held: Any) -> dict[str, tuple] | None:
    """``allowed`` narrowed to a daemon's budget (``allocator.Budget``; its cores are this
    process's affinity already): MPS shares up to the budget's, or a CPU trainer where it has
    no share a GMI can run at."""
    if held is None or held.gpu is None or held.mps_pct is None:
        return allowed
    out = dict(allowed or {})
    from autotune.tuning.budget import mps_within
    from autotune.tuning.knobs import MPS_CHOICES

    shares = mps_within(held.mps_pct, out.get("mps_pct", MPS_CHOICES))
    if shares:
        out["mps_pct"] = shares
    else:
        out["trainer_device"] = ("cpu",)
    return out


def within_frames(
    allowed: dict[str, tuple] | None, rollout_len: int, width: int
) -> dict[str, tuple] | None:
    """``allowed`` with the envs per actor whose rollout the links carry
    (``runtime.frame_limits``: ``width`` floats per step in the widest channel); where even one
    env's would not, one env (the run is then refused, saying why)."""
    from autotune.tuning.sizing import ENVS
    from runtime.frame_limits import rollout_problem

    envs = tuple((allowed or {}).get("envs_per_actor", ENVS))
    fits = tuple(e for e in envs if rollout_problem(e, rollout_len, width) is None)
    return allowed if fits == envs else {**(allowed or {}), "envs_per_actor": fits or (1,)}


def size_run_config(
    console: Console, cfg: TrainConfig, auto: set[str], args: argparse.Namespace, info: Any = None
):
    """``cfg`` with its ``auto`` fields sized, and the ``sizing`` section; (cfg, None) after
    printing why when the workload cannot be probed or sized. With ``info`` (the env's
    ``EnvInfo``), only envs per actor whose rollouts the links carry are considered."""
    from autotune.tuning.sizing import OBJECTIVES as SIZING_OBJECTIVES
    from autotune.workflows.auto_size import size_config
    from runtime.energy.shares import job_meter
    from runtime.probes import ProbeError

    # weighted is sized for steps/J; goodput for steps/J with a wider tie to smaller batches
    # (no noise scale before training: ``autotune.tuning.sizing.GOODPUT_TIE_SHARE``)
    objective = args.objective if args.objective in SIZING_OBJECTIVES else "steps_per_joule"
    allowed = within_budget(tuned_space(args), getattr(args, "held_budget", None))
    if info is not None and "envs_per_actor" in auto:
        allowed = within_frames(allowed, cfg.rollout_len, max(info.obs_dim, info.act_dim))
    shares = getattr(args, "energy_shares", None)
    # what the probes cost, metered as the run is (their child process exits between readings)
    meter = job_meter(cfg.cpu_idle_w, shares, reaped=True)
    meter.begin_window("sizing")
    ahead: list[Any] = []  # the run's first GMI's process, started as the GPU learner is timed

    def spare_ahead() -> None:
        from runtime.gmi.spares import started_ahead

        ahead.extend(s for s in [started_ahead()] if s is not None)

    try:
        sized, doc = size_config(cfg, auto, objective, allowed, args.reprobe, shares, spare_ahead)
    except (ProbeError, ValueError) as exc:
        for spares in ahead:
            spares.stop()
        console.print(
            f"[red]error:[/red] cannot size the run ({escape(str(exc))}); give explicit values"
        )
        return cfg, None
    args.spares_ahead = ahead[0] if ahead else None  # for the runner (``Runner(spares=...)``)
    doc["energy"] = meter.end_window("sizing").to_dict()
    p, pr = doc["probes"], doc["predicted"]
    console.print(
        "sizing: "
        + ", ".join(f"{k}={v}" for k, v in doc["chosen"].items())
        + f" (predicted {pr['steps_per_s']:,.0f} steps/s, {pr['steps_per_joule']:.1f} steps/J, "
        f"lag {pr['policy_lag']:.1f})"
    )
    backends = doc["env_backend"]["predicted"]
    if len(backends) > 1:  # ``auto`` could step either: sized on both
        key = "steps_per_s" if objective == "steps_per_s" else "steps_per_joule"
        chosen = doc["env_backend"]["chosen"]
        console.print(
            f"  env backend: {chosen}, sized on each: "
            + ", ".join(f"{b} {backends[b][key]:,.1f}" for b in sorted(backends))
            + f" predicted {key.replace('_per_', '/').replace('joule', 'J')}"
        )
    learners = ", ".join(
        f"{d} {min(c['seconds'].values()) * 1e3:.1f} ms/update" for d, c in p["learners"].items()
    )
    console.print(
        f"  from: {doc['machine']['cores']} cores, env step {p['env_step_s'] * 1e6:.0f} us, "
        f"forward {min(p['forward_s'].values()) * 1e6:.0f} us, learner {learners}; "
        + (
            f"probes cached {time.strftime('%Y-%m-%d %H:%M', time.localtime(p['measured_at']))}"
            " (--reprobe measures again)"
            if p["cached"]
            else f"probes {p['probe_s']:.1f} s"
        )
        + f" (sizing {doc['energy']['elapsed_s']:.1f} s, "
        f"{(doc['energy']['gpu_j'] + doc['energy']['cpu_j']) / 1000:.2f} kJ)"
    )
    return sized, doc
