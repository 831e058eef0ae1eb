"""What each arm of ``python -m bench peers`` runs: the arm names and their command lines.

The ``peers`` suite runs and measures these commands one after the other; its help
(``bench/suites/peers.py``) describes every arm.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench.peers.common import hidden_from_policy

ARMS = (
    "limit",
    "learner",
    "sb3-cpu",
    "sb3-cuda",
    "cleanrl",
    "default",
    "states",
    "exported",
    "tuned",
    "tuned-tpe",
    "tuned-best",
)
PEERS = ("sb3-cpu", "sb3-cuda", "cleanrl")
OURS = ("default", "exported", "tuned")
UNTRAINED = ("learner", "states")
"""Arms that train nothing: their documents hold their tool's JSON, not a progress window."""


LIMIT_END = "limit-end"
"""The limit measured again after every other arm (``--limit-again``)."""


def arm_kind(name: str) -> str:
    """The arm an arm name stands for (``exported-cpu`` is an ``exported`` arm, ``limit-end`` a
    ``limit`` arm)."""
    if name == LIMIT_END:
        return "limit"
    if name == "tuned-tpe":
        return "tuned"
    if name == "tuned-best":
        return "exported"  # a static config, found by the tuned arm
    return "exported" if name.startswith("exported-") else name


def tuned_best_flags(out_dir: Path, env: str) -> list[str]:
    """The ``tuned`` arm's best config (its result's ``tuning.best.values``) as ``autotune
    train`` flags: the best static config known where no study's export exists.

    Raises:
        SystemExit: the tuned arm has not run, or found no best.
    """
    import json

    path = out_dir / f"{env}-tuned.result.json"
    try:
        values = json.loads(path.read_text())["tuning"]["best"]["values"]
    except (OSError, ValueError, KeyError, TypeError):
        raise SystemExit(f"tuned-best: no tuned best in {path} (run the tuned arm first)") from None
    flags = []
    for knob, value in sorted(values.items()):
        flags += [f"--{knob.replace('_', '-')}", str(value)]
    return flags


def default_checkpoint(out_dir: Path, env: str) -> Path:
    """Where the ``default`` arm keeps its learner's state when a ``states`` arm follows it."""
    return out_dir / f"{env}-default.checkpoint"


def states_flags(out_dir: Path, env: str) -> list[str]:
    """``bench.actor_loop_rate`` flags that step the ``default`` arm's final policy at its env
    backend and envs per actor (its result's config and its checkpoint).

    Raises:
        SystemExit: the default arm has not run with its checkpoint kept.
    """
    import json

    path = out_dir / f"{env}-default.result.json"
    weights = default_checkpoint(out_dir, env) / "learner.pt"
    try:
        cfg = json.loads(path.read_text())["config"]
        flags = ["--backend", cfg["env_backend"], "--envs-per-actor", str(cfg["envs_per_actor"])]
    except (OSError, ValueError, KeyError, TypeError):
        raise SystemExit(
            f"states: no default arm's result in {path} (list default first)"
        ) from None
    if not weights.is_file():
        raise SystemExit(f"states: the default arm left no policy in {weights}")
    return [*flags, "--weights", str(weights)]


def exported_arms(specs: list[str] | None) -> dict[str, Path]:
    """``--exported`` values (``FILE`` or ``LABEL=FILE``) -> ``{arm name: file}``.

    Raises:
        SystemExit: a file that does not exist, a bad or repeated label.
    """
    out: dict[str, Path] = {}
    for spec in specs or []:
        label, sep, file = spec.partition("=")
        if not sep or Path(spec).is_file():
            label, file = "", spec
        elif not label.replace("_", "").isalnum():
            raise SystemExit(f"--exported {spec!r}: a label is letters, digits and _ (LABEL=FILE)")
        name = f"exported-{label}" if label else "exported"
        if name in out:
            raise SystemExit(f"--exported {spec!r}: the arm {name!r} is given twice")
        if not Path(file).is_file():
            raise SystemExit(
                f"--exported {spec!r}: no such file {file!r} (an `autotune export` file)"
            )
        out[name] = Path(file)
    return out


TUNE_KNOBS = [
    "actors=4..16",
    "envs_per_actor=4..64",
    "batch_size=2048..16384",
    "mps_pct=25,50,100",
    "trainers=1",
    "chunk_bytes=262144",
    "trainer_threads=1",
    "inference=actor",
    "rollout_len=32",
    "trainer_device=cuda",
]
MIN_STEPS_WALL_FACTOR = 20.0
"""With ``--min-steps``, an arm's own wall limit is this many times its budget (a safety net)."""
TRAIN_STARTUP_S = 15.0
"""Added to ``autotune train``'s wall budget by default (``--startup-s``): its process start-up
(Ant-v5 on an H100 80GB, 16-core host: about 12 s to the first trained step), which the peers'
``--seconds`` do not count."""
SIZING_S = 45.0
"""Added as well to the wall budget of an arm that sizes itself (``default``): its probes on the
empty probe cache each arm starts with (Ant-v5 on an H200, 16-core host: 44.6 s, the CUDA
learner's compile most of it; with only ``TRAIN_STARTUP_S`` a 60-s arm trained for 21.6 s and
its window was too short to read)."""


def arm_command(arm: str, a: argparse.Namespace, progress: Path, out: Path) -> list[str]:
    """The command line of one arm."""
    py, cores, secs = sys.executable, str(os.cpu_count() or 1), str(a.seconds)
    net = hidden_from_policy(a.policy)
    peer = [
        "--env",
        a.env,
        "--num-envs",
        cores,
        "--net",
        net,
        "--seconds",
        secs,
        "--total-steps",
        "1000000000",
        "--progress",
        str(progress),
        "--rollout",
        str(a.peer_rollout),
    ]
    if getattr(a, "min_steps", 0):  # a peer goes on past its --seconds until it trained these
        peer += ["--min-steps", str(a.min_steps)]
    if getattr(a, "warmup_s", None) is not None:  # and until its window can be measured
        peer += ["--warmup-s", str(a.warmup_s)]
    train = [
        py,
        "-m",
        "autotune.cli",
        "train",
        "--steps",
        "1000000000",
        "--quiet",
        "--policy",
        a.policy,
        "--progress",
        str(progress),
        "--json",
        str(out),
    ]
    if arm_kind(arm) == "limit":
        return [
            py,
            "-m",
            "bench.raw_env_rate",
            "--env",
            a.env,
            "--processes",
            "0",
            "--envs-per-process",
            "16",
            "--seconds",
            secs,
            "--progress",
            str(progress),
            "--backend",
            "fastest",
        ]
    if arm == "learner":
        return [py, "-m", "bench.learner_limit", "--env", a.env, "--policy", a.policy]
    if arm == "states":  # both loops on every core, the learned policy's first
        loops = ["--loops", "collect,raw", "--processes", "0", "--seconds", str(a.states_s)]
        states = states_flags(Path(a.out), a.env)
        return [
            py,
            "-m",
            "bench.actor_loop_rate",
            "--env",
            a.env,
            "--policy",
            a.policy,
            *loops,
            *states,
        ]
    if arm in ("sb3-cpu", "sb3-cuda"):
        return [py, "-m", "bench.peers.sb3_ppo", *peer, "--device", arm.split("-")[1]]
    if arm == "cleanrl":
        return [py, "-m", "bench.peers.cleanrl_ppo", *peer, "--device", "auto"]
    wall = str(a.seconds + a.startup_s)  # the peers' --seconds start at their training
    if arm == "default":
        if "states" in getattr(a, "arm_list", ()):  # its final policy, for the states arm
            train += ["--checkpoint", str(default_checkpoint(Path(a.out), a.env))]
        return [*train, "--env", a.env, "--max-wall-s", str(a.seconds + a.startup_s + SIZING_S)]
    if arm == "tuned-best":
        return [*train, "--env", a.env, "--max-wall-s", wall, *tuned_best_flags(Path(a.out), a.env)]
    if arm_kind(arm) == "exported":
        return [*train, "--config", str(a.exports[arm]), "--env", a.env, "--max-wall-s", wall]
    space = a.knob or (TUNE_KNOBS if a.tune_space == "narrow" else [])
    knobs = [x for k in space for x in ("--knob", k)]
    return [
        *train,
        "--env",
        a.env,
        "--max-wall-s",
        str(a.tuned_s),
        "--tune",
        "--in-process",
        "--storage",
        f"sqlite:///{Path(a.out).resolve()}/tuned.db",
        "--study",
        f"compare-{a.env}-{int(time.time())}",
        "--tune-warmup-s",
        "4",
        "--tune-sampler",
        "tpe" if arm == "tuned-tpe" else "model",
        *knobs,
    ]
