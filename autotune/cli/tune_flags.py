"""The ``--tune`` flags of ``autotune train``, the ``TuneOptions`` they give, and the flags of
a tuned job's claim on a machine the daemon shares out (with the budget it is offered)."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.console import Console

from autotune.control.allocator import DEFAULT_MIN_SHARE
from autotune.tuning.settings import OBJECTIVES, SAMPLERS
from autotune.tuning.sizing import DEFAULT_LAG_CEILING
from runtime.config import ConfigError

if TYPE_CHECKING:
    from autotune.workflows.tune import TuneOptions


def seconds(text: str) -> float:
    """A number of seconds > 0 (argparse type): 0, negative, NaN or infinite is refused
    before anything starts, saying what is allowed."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed a finite number of seconds > 0")
    return value


def add_tune_args(parser: argparse.ArgumentParser) -> None:
    """The ``--tune`` flags of ``autotune train``."""
    tune = parser.add_argument_group(
        "online tuning (--tune)",
        "move the live knobs of this run toward the objective while it trains; every trial is "
        "kept in an Optuna study (a rerun with the same --storage and --study resumes it)",
    )
    tune.add_argument("--tune", action="store_true", help="tune this run online")
    tune.add_argument(
        "--knob",
        action="append",
        default=None,
        metavar="NAME=SPEC",
        help="fix or narrow a knob: NAME=VALUE, NAME=LOW..HIGH or NAME=A,B (repeatable); "
        "knobs: actors, envs_per_actor, rollout_len, batch_size, chunk_bytes, trainers, "
        "mps_pct, trainer_device, inference, trainer_threads; tuned only when named: "
        "trainer_precision (fp32,bf16), actor_nice (0,5,10; any of 0..19), "
        "env_backend (gymnasium,envpool). Unless named, batch_size tries 512..65536 where "
        "each of the learner's minibatches holds 128 samples and 2 rollouts or more (as the "
        "learner splits the batch: fewer minibatches under --min-minibatch)",
    )
    tune.add_argument(
        "--objective",
        choices=list(OBJECTIVES),
        default="steps_per_joule",
        help="what to maximise: steps_per_joule, steps_per_s, weighted (the mean of steps/s "
        "and steps/J, each relative to the study's first trial's), or goodput_per_joule "
        "(steps per joule times the statistical efficiency of the config's batch at "
        "the learner's gradient noise scale, which favours smaller batches when the noise "
        "scale is small) (default steps_per_joule)",
    )
    tune.add_argument(
        "--storage",
        default="sqlite:///autotune.db",
        help="Optuna RDB storage URL (any SQLAlchemy URL; default sqlite:///autotune.db)",
    )
    tune.add_argument("--study", default=None, help="study name (default online-<env>)")
    tune.add_argument(
        "--tune-trials", type=int, default=30, help="trials before holding the best (default 30)"
    )
    tune.add_argument(
        "--tune-window-s",
        type=seconds,
        default=None,
        help="a trial's shortest measurement window (default 10 with a GPU, 5 without; under "
        "goodput_per_joule, with the batch size tuned, a window ends sooner once its batch's "
        "efficiency moved 1.5x and its estimate is within 3x --tune-window-target)",
    )
    tune.add_argument(
        "--tune-warmup-s", type=seconds, default=5.0, help="warm-up after a change (default 5)"
    )
    tune.add_argument(
        "--tune-window-max-s",
        type=seconds,
        default=30.0,
        help="a window ends by then even if its estimate is not within --tune-window-target "
        "(default 30; --tune-window-s is its floor)",
    )
    tune.add_argument(
        "--tune-window-target",
        type=float,
        default=0.03,
        help="a window ends once its steps/J estimate's 95 %% interval is within this share "
        "(default 0.03)",
    )
    tune.add_argument(
        "--tune-sampler",
        choices=list(SAMPLERS),
        default="model",
        help="model (default): the config with the best expected gain under a throughput and "
        "power model fitted to the windows so far, primed by probes; tpe: Optuna's TPE; grid: "
        "every combination of the tuned knobs once (baselines)",
    )
    tune.add_argument(
        "--control",
        default=None,
        help="the daemon's control endpoint (default $AUTOTUNE_CONTROL or the private ipc "
        "socket of 'autotune daemon start')",
    )
    tune.add_argument(
        "--in-process",
        action="store_true",
        help="tune in this process even if a daemon runs",
    )
    tune.add_argument(
        "--min-steps-per-s", type=float, default=None, help="throughput floor (constraint)"
    )
    tune.add_argument(
        "--max-lag",
        type=float,
        default=DEFAULT_LAG_CEILING,
        help=f"policy-lag ceiling, versions (constraint; default {DEFAULT_LAG_CEILING:g})",
    )


def add_share_args(parser: argparse.ArgumentParser) -> None:
    """The flags of a tuned job's claim on a machine the daemon shares out."""
    share = parser.add_argument_group(
        "sharing the machine (--tune with a daemon running)",
        "the daemon gives each job a budget of cores, a GPU and an MPS share, pins the job "
        "there and tunes it inside; it maximises the machine's steps per joule above each job's "
        "fairness floor",
    )
    share.add_argument(
        "--weight",
        type=float,
        default=1.0,
        help="this job's weight in the equal split the floors are taken from (default 1)",
    )
    share.add_argument(
        "--min-share",
        type=float,
        default=DEFAULT_MIN_SHARE,
        metavar="F",
        help="fairness floor: at least F (0..1) of the steps/s, the cores and the GPU share "
        f"the weighted equal split would give this job (default {DEFAULT_MIN_SHARE})",
    )
    share.add_argument(
        "--exclusive",
        action="store_true",
        help="the whole machine to this job (refused while other jobs hold budgets)",
    )
    share.add_argument(
        "--cores",
        default=None,
        metavar="LIST",
        help="a fixed budget the allocator leaves alone: these cores, e.g. 0-3,8",
    )
    share.add_argument(
        "--gpu-share",
        type=int,
        default=None,
        metavar="PCT",
        help="with --cores: a fixed share of the GPU's SMs for this job's GMIs (10..100); "
        "needed with --cores where there is a GPU",
    )


def tune_options(args: argparse.Namespace) -> TuneOptions:
    """The ``TuneOptions`` of parsed ``autotune train`` flags."""
    from autotune.workflows.tune import TuneOptions  # optuna: only when tuning

    return TuneOptions(
        knobs=tuple(args.knob or ()),
        objective=args.objective,
        storage=args.storage,
        study=args.study,
        trials=args.tune_trials,
        window_s=args.tune_window_s,
        window_max_s=args.tune_window_max_s,
        window_target=args.tune_window_target,
        warmup_s=args.tune_warmup_s,
        sampler=args.tune_sampler,
        control=args.control,
        in_process=args.in_process,
        min_steps_per_s=args.min_steps_per_s,
        max_policy_lag=args.max_lag,
        weight=args.weight,
        min_share=args.min_share,
        exclusive=args.exclusive,
        cores=args.cores,
        gpu_share=args.gpu_share,
    )


TUNE_ONLY = tuple(
    [
        "knob",
        "storage",
        "study",
        "tune_trials",
        "tune_window_s",
        "tune_warmup_s",
        "tune_window_max_s",
        "tune_window_target",
        "tune_sampler",
        "control",
        "in_process",
        "min_steps_per_s",
        "max_lag",
    ]
)
"""The tuning flags that do nothing without --tune (``--objective`` also picks the sizing's)."""


def tune_only_flags(args: argparse.Namespace) -> list[str]:
    """The tuning flags given on the command line that need --tune."""
    given = getattr(args, "explicit", set())
    return ["--" + d.replace("_", "-") for d in TUNE_ONLY if d in given]


def share_flags(args: argparse.Namespace) -> list[str]:
    """The machine-sharing flags given (they need --tune)."""
    given = {
        "--weight": args.weight != 1.0,
        "--min-share": args.min_share != DEFAULT_MIN_SHARE,
        "--exclusive": args.exclusive,
        "--cores": args.cores is not None,
        "--gpu-share": args.gpu_share is not None,
    }
    return [flag for flag, on in given.items() if on]


def daemon_budget(console: Console, args: argparse.Namespace, cfg: Any) -> Any:
    """The budget a running daemon offers this tuned job, with this process pinned there
    before it sizes itself (None with no daemon). First, before anything is probed, the study
    named is refused where it holds another env's or policy's trials.

    Raises:
        ConfigError: a study of another workload, a malformed claim, the daemon cannot take
            the job, or sharing flags were given with no daemon to give the budget.
    """
    from autotune.workflows.study_workload import refuse_other_workload  # optuna: when tuning
    from autotune.workflows.tune import take_offer, tuner_settings

    options = tune_options(args)
    try:  # what cannot tune is refused before the probes are paid for
        tuner_settings(options, gpus=False)
        refuse_other_workload(options.storage, options.study, cfg, options.objective)
        offer = take_offer(options, cfg)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    if offer is None:
        if share_flags(args):  # a budget asked for, and no one to give it
            why = "--in-process tunes without it" if args.in_process else "none is running"
            raise ConfigError(
                [
                    f"{', '.join(share_flags(args))} take effect under a running daemon "
                    f"('autotune daemon'), which shares the machine out; {why}"
                ]
            )
        return None
    held, args.energy_shares = offer
    share = "" if held.mps_pct is None else f", {held.mps_pct} % of GPU {held.gpu}"
    console.print(
        f"budget from the daemon: cores {list(held.cores)}{share} (charged "
        f"{args.energy_shares['cpu_share']:.0%} of the CPU's idle draw, "
        f"{args.energy_shares['gpu_share']:.0%} of the GPU's)"
    )
    return held


def inference_within(console: Console, cfg: Any, held: Any) -> Any:
    """``cfg`` with its inference GMI's MPS share bounded by a daemon's budget (``held``), as
    its trainer GMIs' are (unbounded, it would take SMs of the other jobs' shares)."""
    if held is None or held.mps_pct is None or cfg.inference != "gmi":
        return cfg
    if cfg.resolved_device() != "cuda":
        return cfg
    pct = cfg.inference_mps_pct
    if pct is not None and pct <= held.mps_pct:
        return cfg
    if pct is not None:
        console.print(f"inference GMI at {held.mps_pct} % of the GPU, the budget's, not {pct} %")
    return replace(cfg, inference_mps_pct=held.mps_pct)
