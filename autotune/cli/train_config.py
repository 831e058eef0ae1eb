"""``autotune train``'s config: a ``TrainConfig`` from the train flags, or from a ``--config``
file with the flags given explicitly over it (also used by ``bench.trace_run``)."""

from __future__ import annotations

import argparse
import dataclasses
import time

from autotune.cli.link_flags import link_settings
from policies.appo_config import LR_SCHEDULES, APPOConfig
from runtime.config import ConfigError, TrainConfig
from runtime.env_backends import BACKENDS

LEARNER_FLAGS = (
    "lr",
    "lr_schedule",
    "kl_target",
    "lr_scaling",
    "vtrace_lambda",
    "gamma",
    "epochs",
    "minibatches",
    "min_minibatch",
    "entropy_coef",
    "reward_scale",
    "normalize_reward",
    "max_policy_lag",
    "compile_loss",
)


def add_learner_args(parser: argparse.ArgumentParser) -> None:
    """The learner's flags of ``autotune train`` (``APPOConfig``)."""
    dl = APPOConfig()
    parser.add_argument("--lr", type=float, default=dl.lr, help=f"learning rate (default {dl.lr})")
    parser.add_argument(
        "--lr-schedule",
        choices=list(LR_SCHEDULES),
        default=dl.lr_schedule,
        help="adaptive (default): steer each update's KL divergence to --kl-target (the rate "
        "divided by 1.5 after an update past twice it, multiplied by 1.5 after one under half "
        "of it, within 0.01x to 10x of --lr, after --lr-scaling); linear: anneal the learning "
        "rate to 0 over --steps; constant: keep it",
    )
    parser.add_argument(
        "--kl-target",
        type=float,
        default=dl.kl_target,
        help=f"the KL divergence per update that --lr-schedule adaptive steers to; other "
        f"schedules only report each update's KL (default {dl.kl_target})",
    )
    parser.add_argument(
        "--lr-scaling",
        choices=["none", "sqrt", "linear"],
        default=dl.lr_scaling,
        help="when the batch size changes during the run (a tuner's change), scale the "
        "learning rate with it: sqrt or linear in the ratio to the batch the run started with; "
        "the result's learning_rate says what was done (default none)",
    )
    parser.add_argument(
        "--vtrace-lambda",
        type=float,
        default=dl.vtrace_lambda,
        help="V-trace trace decay: on-policy the value targets are GAE(lambda)'s returns "
        f"(default {dl.vtrace_lambda})",
    )
    parser.add_argument(
        "--gamma", type=float, default=dl.gamma, help=f"discount (default {dl.gamma})"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=dl.epochs,
        help=f"passes over each batch (default {dl.epochs})",
    )
    parser.add_argument(
        "--minibatches",
        type=int,
        default=dl.minibatches,
        help=f"minibatches per pass (default {dl.minibatches})",
    )
    parser.add_argument(
        "--min-minibatch",
        type=int,
        default=dl.min_minibatch,
        metavar="SAMPLES",
        help="the fewest samples a minibatch holds: a batch too small for --minibatches of "
        "this many (a tuner's or the sizing's smaller batch) is split into fewer; 0: off "
        f"(default {dl.min_minibatch})",
    )
    parser.add_argument(
        "--entropy-coef",
        type=float,
        default=None,
        help="entropy bonus weight (default: 0.01 for discrete actions, 0 for continuous)",
    )
    parser.add_argument(
        "--normalize-reward",
        choices=["on", "off"],
        default="off",
        help="divide rewards by the running std of their discounted returns, in the actors, "
        "as CleanRL's continuous PPO does (default off)",
    )
    parser.add_argument(
        "--reward-scale",
        type=float,
        default=dl.reward_scale,
        help=f"reward multiplier for learning (default {dl.reward_scale})",
    )
    parser.add_argument(
        "--max-policy-lag",
        type=int,
        default=dl.max_policy_lag,
        help=f"discard experience older than this many versions (default {dl.max_policy_lag})",
    )
    parser.add_argument(
        "--compile-loss",
        choices=["on", "off"],
        default="on",
        help="fuse the learner's loss kernels with torch.compile where it replays CUDA graphs "
        "(a single CUDA trainer; it compiles as it starts: 5-16 s, about 3 s once its cache "
        "holds the kernels); off: the plain loss (default on)",
    )


def explicit_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The ``dest`` of every option of ``parser`` given in ``argv`` (``--x V`` or ``--x=V``)."""
    out = set()
    for action in parser._actions:
        for opt in action.option_strings:
            if any(a == opt or (opt.startswith("--") and a.startswith(opt + "=")) for a in argv):
                out.add(action.dest)
    return out


def config_with_flags(base, args: argparse.Namespace, explicit: set[str]):
    """``base`` (from ``--config``) with the flags given explicitly on the command line."""
    fields = {f.name for f in dataclasses.fields(base)} - {"learner"}
    sized = {k for k in AUTO if getattr(args, k, None) == "auto"}  # left to the sizing
    changes = {k: getattr(args, k) for k in explicit & fields - sized}
    learner = {k: getattr(args, k) for k in explicit & set(LEARNER_FLAGS)}
    if "batch_size" in changes or "lr" in learner:  # --lr is for the batch this run starts with
        learner["lr_batch"] = None
    for name in ("normalize_reward", "compile_loss"):  # on/off on the command line
        if name in learner:
            learner[name] = learner[name] == "on"
    if "env_backend" in explicit:  # auto is a backend rule here, not a size to probe
        changes["env_backend"] = args.env_backend
    if "cluster" in explicit and "transport" not in explicit:
        changes["transport"] = "tcp"  # actors on other nodes reach the run over tcp
    if "env_module" in explicit:  # added to the file's
        changes["env_modules"] = tuple(dict.fromkeys([*base.env_modules, *args.env_module]))
    return dataclasses.replace(
        base, **changes, learner=dataclasses.replace(base.learner, **learner)
    )


AUTO = ("actors", "envs_per_actor", "batch_size", "trainer_device", "trainers", "mps_pct")
"""The flags that take ``auto`` (sized from probes before the run: ``autotune.workflows.
auto_size``)."""


def auto_fields(args: argparse.Namespace) -> set[str]:
    """The fields left ``auto``: every ``AUTO`` flag whose value is ``auto``; with ``--config``,
    only those given ``auto`` explicitly (the file's values stand otherwise)."""
    out = {f for f in AUTO if getattr(args, f, None) == "auto"}
    if getattr(args, "config", None) is not None:
        out &= set(getattr(args, "explicit", set()))
    if getattr(args, "trainer_device", None) == "cpu":
        out.discard("mps_pct")  # a CPU trainer has no GPU share to size
    return out


def _or_default(args: argparse.Namespace, name: str, default):
    value = getattr(args, name)
    return default if value == "auto" else value


def _batch_placeholder(args: argparse.Namespace) -> int:
    """What an ``auto`` batch size is checked as before the sizing sets it: the least batch
    this rollout length and minibatch count take (the sizing's are at least that), so no check
    fails on a value the user did not give."""
    rows, splits = args.rollout_len, args.minibatches
    ok = all(isinstance(v, int) and v >= 1 for v in (rows, splits))
    return rows * splits if ok else TrainConfig.batch_size


def config_from_args(args: argparse.Namespace):
    learner = APPOConfig(
        lr=args.lr,
        lr_schedule=args.lr_schedule,
        kl_target=getattr(args, "kl_target", APPOConfig.kl_target),
        lr_scaling=getattr(args, "lr_scaling", "none"),
        vtrace_lambda=args.vtrace_lambda,
        gamma=args.gamma,
        epochs=args.epochs,
        minibatches=args.minibatches,
        min_minibatch=getattr(args, "min_minibatch", 0),
        entropy_coef=args.entropy_coef,
        reward_scale=args.reward_scale,
        normalize_reward=args.normalize_reward == "on",
        max_policy_lag=args.max_policy_lag,
        compile_loss=getattr(args, "compile_loss", "on") == "on",
    )
    return TrainConfig(
        env=args.env,
        env_modules=tuple(getattr(args, "env_module", None) or ()),
        env_backend=getattr(args, "env_backend", "auto"),
        steps=args.steps,
        actors=_or_default(args, "actors", TrainConfig.actors),
        envs_per_actor=_or_default(args, "envs_per_actor", TrainConfig.envs_per_actor),
        actor_nice=args.actor_nice,
        pin_actors=args.pin_actors,
        rollout_len=args.rollout_len,
        batch_size=_or_default(args, "batch_size", _batch_placeholder(args)),
        policy=args.policy,
        seed=args.seed,
        chunk_bytes=args.chunk_bytes,
        trainer_device=args.trainer_device,
        trainer_threads=args.trainer_threads,
        trainer_precision=args.trainer_precision,
        trainers=_or_default(args, "trainers", TrainConfig.trainers),
        mps_pct=_or_default(args, "mps_pct", None),
        gpus=args.gpus,
        grad_sync=args.grad_sync,
        inference=args.inference,
        inference_mps_pct=args.inference_mps_pct,
        max_wall_s=args.max_wall_s,
        target_return=getattr(args, "target_return", None),
        **link_settings(args),
        checkpoint=args.checkpoint,
        checkpoint_every_s=args.checkpoint_every_s,
        cpu_idle_w=args.cpu_idle_w,
        learner=learner,
    )


def train_config(args: argparse.Namespace):
    """The run's ``TrainConfig``: the ``--config`` file with the flags given explicitly
    (``args.explicit``) over it, or the flags alone.

    Raises:
        ConfigError: a ``--config`` file that cannot be read as a config.
    """
    if args.config is None:
        return config_from_args(args)
    # optuna, through the tuning layer: imported by this command only
    from autotune.workflows.export import ExportError, load_config

    try:
        return config_with_flags(load_config(args.config), args, args.explicit)
    except ExportError as exc:
        raise ConfigError([str(exc)]) from None


def process_started() -> float:
    """This process's start, on the ``time.monotonic()`` clock (what ``--max-wall-s`` counts
    from)."""
    import psutil

    return time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())


PIN_MODES = {"auto": None, "on": True, "off": False}


def _pin_mode(text: str) -> bool | None:
    if text not in PIN_MODES:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed {', '.join(PIN_MODES)}")
    return PIN_MODES[text]


def add_actor_args(parser: argparse.ArgumentParser, d) -> None:
    """``--actor-nice`` and ``--pin-actors`` (``d``: the defaults, a ``TrainConfig``)."""
    parser.add_argument(
        "--actor-nice",
        type=int,
        default=d.actor_nice,
        help="niceness the actors add to their own (0..19): with as many actors as cores, a "
        f"positive value lets the stages and the trainer run first (default {d.actor_nice})",
    )
    parser.add_argument(
        "--pin-actors",
        type=_pin_mode,
        default=None,
        metavar="{auto,on,off}",
        help="on: where the run has no more actors than cores, actor i runs on the i-th block of "
        "cores // actors cores of the run's CPU set (an EnvPool actor runs a thread per core of "
        "it); off: the scheduler "
        "places them; auto: on where the run's CPU set is narrower than the machine's (a "
        "daemon's budget, taskset, a container), off where it shares the whole machine "
        "(default auto)",
    )


def add_env_args(parser: argparse.ArgumentParser, default: str) -> None:
    """``--env`` and ``--env-module``."""
    parser.add_argument(
        "--env",
        default=default,
        help=f"gymnasium env id (default {default}); MODULE:ID imports MODULE first, from the "
        "current directory too (a custom env that registers itself with gymnasium)",
    )
    parser.add_argument(
        "--env-backend",
        choices=BACKENDS,
        default="auto",
        help="how actors step their envs: gymnasium (one env at a time in Python), envpool "
        "(EnvPool's C++ vectorised envs, pip install 'rl-autotune[envpool]'), or auto (EnvPool "
        "when it is installed and has the env with Box observations, else gymnasium; a run "
        "sized from probes times both and steps on gymnasium where it is predicted over 10 %% "
        "better; a custom env always uses gymnasium) (default auto)",
    )
    parser.add_argument(
        "--env-module",
        action="append",
        metavar="MODULE",
        help="import MODULE in every process of the run before making an env (repeatable): "
        "a custom env module that calls gymnasium.register; the current directory is on the "
        "path (examples/custom_env.py)",
    )
