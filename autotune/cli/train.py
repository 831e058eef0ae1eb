"""``autotune train``: one training job through the experience pipeline, its flags and its
config (``--config`` files, explicit flags over them), with a live display and a summary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from autotune.cli.auto_flags import int_list, int_or_auto, mps_or_auto, size_run_config
from autotune.cli.display import ProgressDisplay, summary_table
from autotune.cli.link_flags import add_link_args, cluster_actors
from autotune.cli.output import complete_result, untrained_note, write_json
from autotune.cli.train_config import (
    add_actor_args,
    add_env_args,
    add_learner_args,
    auto_fields,
    process_started,
    train_config,
)
from autotune.cli.tune_flags import (
    add_share_args,
    add_tune_args,
    daemon_budget,
    inference_within,
    share_flags,
    tune_only_flags,
    tune_options,
)
from autotune.workflows.progress_log import ProgressLog
from runtime import checkpoint
from runtime.cache_dirs import bytecode_note
from runtime.config import TRAINER_PRECISIONS, ConfigError, TrainConfig
from runtime.energy.shares import job_meter
from runtime.hw.gpus import no_gpu_reason
from runtime.results import failure_text
from runtime.runner import RunError, Runner


def add_train_command(sub: Any) -> None:
    d = TrainConfig()
    train = sub.add_parser(
        "train",
        help="run an RL training job (actors -> dispenser -> compressor -> migrator -> "
        "batcher -> trainer) and report steps/s and steps per joule",
        description="Run one training job on this machine through the asynchronous experience "
        "pipeline, with a live progress display and a final summary.",
        allow_abbrev=False,  # a flag over --config must be named whole (``explicit_flags``)
    )
    train.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="run this config (an 'autotune export' file, a 'train --json' "
        "result or a mapping of config fields; JSON or YAML); flags given "
        "as well override it",
    )
    add_env_args(train, d.env)
    train.add_argument(
        "--steps",
        type=int,
        default=d.steps,
        help=f"trained env steps to run for, at least (default {d.steps}): sampling stops once "
        "this many are trained, and what is in flight then is trained too, in whole batches "
        "(nothing sampled is dropped), so a run trains somewhat more",
    )
    train.add_argument(
        "--actors",
        type=int_or_auto,
        default="auto",
        help="actor processes, or auto: sized from probes of the env, the policy and the "
        "learner on this machine (default auto; every auto value and the measurements behind "
        "it are printed and stored in the result's 'sizing')",
    )
    train.add_argument(
        "--reprobe",
        action="store_true",
        help="measure the workload's probes again instead of reading them from the cache "
        "(they are kept a week per workload and machine, under $AUTOTUNE_CACHE_DIR, else "
        "$XDG_CACHE_HOME/autotune, else ~/.cache/autotune)",
    )
    train.add_argument(
        "--envs-per-actor",
        type=int_or_auto,
        default="auto",
        help="environments per actor, or auto (default auto)",
    )
    train.add_argument(
        "--rollout-len",
        type=int,
        default=d.rollout_len,
        help=f"steps per env per rollout (default {d.rollout_len})",
    )
    train.add_argument(
        "--batch-size",
        type=int_or_auto,
        default="auto",
        help="env steps per training batch, a multiple of --rollout-len, or auto (default auto)",
    )
    train.add_argument(
        "--policy",
        default=d.policy,
        help="MLP spec, e.g. 60:256:128:64:8; 'auto' takes the env's sizes "
        "(default auto = auto:64:64:auto)",
    )
    train.add_argument("--seed", type=int, default=d.seed, help=f"seed (default {d.seed})")
    train.add_argument(
        "--chunk-bytes",
        type=int,
        default=d.chunk_bytes,
        help=f"compressor chunk size in bytes (default {d.chunk_bytes})",
    )
    train.add_argument(
        "--trainer-device",
        choices=["auto", "cpu", "cuda"],
        default=d.trainer_device,
        help="trainer device; auto picks the one the probes predict best for the objective "
        "(default auto)",
    )
    train.add_argument(
        "--trainers",
        type=int_or_auto,
        default="auto",
        help="trainer GMIs per GPU (or trainer processes on the CPU), data-parallel, or auto "
        "(default auto)",
    )
    train.add_argument(
        "--mps-pct",
        type=mps_or_auto,
        default="auto",
        metavar="P[,P...]",
        help="MPS active-thread percentage (1..100) of every GMI, or one per GMI in GPU-major "
        "order; starts or reuses an MPS daemon; auto sizes it (100: no limit) (default auto)",
    )
    train.add_argument(
        "--gpus",
        type=int_list,
        default=None,
        metavar="I[,I...]",
        help="CUDA device indices for the trainer GMIs (default 0)",
    )
    train.add_argument(
        "--mps-change",
        type=_mps_change,
        action="append",
        default=None,
        metavar="SECONDS:P[,P...]",
        help="at SECONDS into the run, replace the GMIs by new ones with these MPS "
        "percentages (hand-over without losing experience); repeatable",
    )
    train.add_argument(
        "--grad-sync",
        choices=["auto", "mpr", "mrr", "har"],
        default=d.grad_sync,
        help="gradient sync among GMIs: auto picks from the GMI-to-GPU layout (GMI-DRL "
        "Algorithm 1); mpr = one host all-reduce, mrr = rings (NCCL between GPUs), "
        "har = hierarchical (default auto)",
    )
    add_actor_args(train, d)
    train.add_argument(
        "--trainer-threads",
        type=int,
        default=d.trainer_threads,
        help=f"torch threads per trainer GMI (default {d.trainer_threads})",
    )
    train.add_argument(
        "--trainer-precision",
        choices=list(TRAINER_PRECISIONS),
        default=d.trainer_precision,
        help="bf16: the trainer's hidden-layer matmuls in bfloat16 (torch.autocast; output "
        "layers, weights, log-probs and losses stay float32); on CPUs with bfloat16 "
        "instructions (AVX512-BF16, AMX) or GPUs from Ampere on; about 2x a CPU learner "
        "update, 1.29x a Humanoid run's steps/s on the H100 host (default "
        f"{d.trainer_precision})",
    )
    train.add_argument(
        "--cpu-idle-w",
        type=float,
        default=d.cpu_idle_w,
        metavar="W",
        help="idle power of the CPU packages in watts, charged per second by the CPU energy "
        "model where RAPL cannot be read (default: a share of the CPU's TDP from CodeCarbon's "
        "table, or a per-core figure for an unknown CPU; the result's energy.cpu_model says "
        "which)",
    )
    train.add_argument(
        "--inference",
        choices=["actor", "gmi"],
        default=d.inference,
        help="where actions are computed: actor = the policy on each actor's core; gmi = one "
        "batched inference GMI on the trainer device that every actor sends observations to "
        f"(default {d.inference})",
    )
    train.add_argument(
        "--inference-mps-pct",
        type=int,
        default=None,
        metavar="P",
        help="MPS active-thread percentage (1..100) of the inference GMI (default: no limit)",
    )
    add_tune_args(train)
    add_share_args(train)
    train.add_argument(
        "--target-return",
        type=float,
        default=None,
        metavar="R",
        help="stop at the first 100-episode mean return of at least R; the result's target "
        "section gives the trained steps, seconds and joules it took (or says it was not "
        "reached, with the best mean)",
    )
    train.add_argument(
        "--max-wall-s",
        type=float,
        default=None,
        help="end by this many seconds after the process started (start-up and probes "
        "included): the drain begins early enough to train what is in flight",
    )
    add_link_args(train)
    add_learner_args(train)
    train.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="write the result document to PATH"
    )
    train.add_argument(
        "--progress",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the learning curve to PATH as JSON lines, about once a second: Unix time, "
        "trained steps, mean return of the last 100 episodes, episodes, joules, and the "
        "learner's noise scale, lr and KL once measured (autotune/workflows/progress_log.py)",
    )
    train.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="keep the learner's state in DIR: a run whose DIR holds one goes on from it (--steps "
        "then counts every run's trained steps, the return window and episode count go on, and "
        "--progress is appended to), and every run saves its state there while it trains "
        "(--checkpoint-every) and when it ends (runtime/checkpoint.py)",
    )
    train.add_argument(
        "--checkpoint-every",
        dest="checkpoint_every_s",
        type=float,
        default=d.checkpoint_every_s,
        metavar="SECONDS",
        help=f"with --checkpoint: seconds between saves while training (default "
        f"{d.checkpoint_every_s:g})",
    )
    train.add_argument("--quiet", action="store_true", help="no live display")
    train.set_defaults(func=cmd_train)


def _mps_change(text: str) -> tuple[float, tuple[int, ...]]:
    """``"60:50"`` or ``"60:50,25"`` -> (60.0, (50, 25)) (argparse type)."""
    when, sep, pcts = text.partition(":")
    try:
        seconds = float(when)
    except ValueError:
        seconds = -1.0
    if not sep or seconds < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected SECONDS:P[,P...] with SECONDS >= 0, e.g. 60:50 or 60:50,25"
        )
    return seconds, int_list(pcts)


def cmd_train(args: argparse.Namespace) -> int:
    console = Console(stderr=True, emoji=False)
    sizing = held = None
    try:
        cfg = train_config(args)
        if args.config is not None:
            console.print(f"config: {args.config}")
        if note := bytecode_note():
            console.print(f"[yellow]note:[/yellow] {escape(note)}")
        if args.tune:
            held = args.held_budget = daemon_budget(console, args, cfg)
        elif share_flags(args) or tune_only_flags(args):
            raise ConfigError(
                [
                    f"{', '.join(share_flags(args) + tune_only_flags(args))} take effect with "
                    "--tune (only a tuned job has a study, knobs to move and a daemon's share)"
                ]
            )
        auto = auto_fields(args)
        if cfg.cluster is not None and "actors" in auto:
            cfg = cluster_actors(console, cfg)
            auto.discard("actors")
        if auto:  # a bad env, policy or checkpoint is reported before the probes
            checkpoint.check(cfg, info := cfg.validate())
            cfg, sizing = size_run_config(console, cfg, auto, args, info)
            if sizing is None:
                return 2
        cfg = inference_within(console, cfg, held)  # the inference GMI's share too
        info = cfg.validate()
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    try:
        runner = Runner(
            cfg,
            info,
            mps_changes=args.mps_change,
            # a tuner may move the trainer to a GPU share: MPS from the start where there is one
            mps_live=args.tune and (cfg.resolved_device() == "cuda" or no_gpu_reason() is None),
            meter=job_meter(cfg.cpu_idle_w, getattr(args, "energy_shares", None)),  # its share
            spares=getattr(args, "spares_ahead", None),  # started as the probes timed the GPU
        )
    except ConfigError as exc:  # the checkpoint
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except ValueError as exc:
        console.print(f"[red]error:[/red] --mps-change: {escape(str(exc))}")
        return 2
    runner.wall_from = process_started()  # --max-wall-s counts the start-up and probes too
    if sizing is not None:  # and the target's figures what the probes spent
        runner.target.before.add_sizing(
            sizing["energy"]["elapsed_s"], sizing["energy"]["gpu_j"] + sizing["energy"]["cpu_j"]
        )
    done, episodes = runner.resumed_steps, runner.resumed_episodes  # of the runs before
    if runner.resume is not None:
        console.print(
            f"checkpoint: {cfg.checkpoint}: going on from {done} trained steps "
            f"(learner version {runner.resume.version}) to {cfg.steps}"
        )
    display = ProgressDisplay(console, cfg, enabled=not args.quiet, steps_before=done)
    curve = None
    if args.progress is not None:
        curve = ProgressLog(args.progress, append=runner.resume is not None)

    def show(state) -> None:
        display.update(state)
        steps, ret, n = done + state.trained_steps, state.return_mean, episodes + state.episodes
        if curve is not None and curve.due(steps):  # the meter is read only for a line
            learner = {"noise_scale": state.noise_scale, "lr": state.lr, "kl": state.kl}
            curve.write(steps, ret, n, joules=runner.joules_so_far(), **learner)

    runner.on_progress = show
    tuning = None
    if args.tune:
        try:
            from autotune.workflows.tune import start_tuning  # optuna: only when tuning

            tuning = start_tuning(tune_options(args), runner.cfg, runner, sizing, held)
        except ValueError as exc:  # KnobError, StudyError, ControlError, bad settings, refusal
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            return 2
        console.print(f"tuning: {tuning.where}")

        def progress(state) -> None:
            show(state)
            if not state.draining:
                tuning.tick()

        runner.on_progress = progress
    result = None
    try:
        with display:
            result = runner.run()
    except ConfigError as exc:  # a --cluster that cannot be reached or used
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except Exception as exc:  # a service died, or a fault in the run's own loop
        if not isinstance(exc, RunError):  # where it happened, to report it
            console.print_exception()
        console.print(f"[red]run failed:[/red] {escape(failure_text(exc))}")
        failed = getattr(exc, "result", None)
        if failed is not None and args.json is not None:
            write_json(args.json, failed)  # what it had done: steps, lost, checkpoint
            console.print(f"wrote {args.json} (failed)")
        return 1
    except KeyboardInterrupt:
        console.print("[red]aborted[/red] (second Ctrl-C): no result written")
        return 130
    finally:
        doc = tuning.finish() if tuning is not None else None
        try:
            if curve is not None and result is not None:  # the final count, after the drain
                curve.write_result(result, done, episodes, runner.target.before.joules)
            if curve is not None:
                curve.close()
        except OSError as exc:  # a full disk: said, and the result is still written
            console.print(f"[yellow]progress curve incomplete:[/yellow] {escape(str(exc))}")
    complete_result(result, sizing, tuning.where if tuning is not None else None, doc)
    Console(emoji=False).print(summary_table(result))
    if (note := untrained_note(result, cfg.max_wall_s)) is not None:
        console.print(f"[yellow]{escape(note)}[/yellow]")
    write_json(args.json, result)
    if args.json is not None:
        console.print(f"wrote {args.json}")
    if result.get("failure"):
        console.print(f"[red]run stopped early:[/red] {escape(str(result['failure']))}")
        return 1
    return 0
