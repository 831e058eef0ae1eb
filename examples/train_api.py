"""Run a training job from Python instead of the CLI, and read the result document.

    python examples/train_api.py --env Pendulum-v1 --steps 300000

The same runtime as ``autotune train``: ``autotune.train`` checks every setting against the
environment before any process starts (``TrainConfig.validate()``), starts the actors, the four
stages and the trainer, drains them at the end, and returns the dict that ``--json`` writes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import autotune
from policies.appo import APPOConfig
from runtime.config import ConfigError, TrainConfig
from runtime.runner import RunState


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--actors", type=int, default=2)
    args = ap.parse_args()

    learner = APPOConfig()
    if args.env == "Pendulum-v1":  # rewards of -16..0 per step: scale them, shorter horizon
        learner = replace(learner, reward_scale=0.1, gamma=0.95)
    cfg = TrainConfig(env=args.env, steps=args.steps, actors=args.actors, learner=learner)

    def progress(state: RunState) -> None:
        if int(state.elapsed_s * 10) % 50 == 0:  # about every 5 s
            print(
                f"{state.elapsed_s:5.0f}s trained {state.trained_steps:>9,} "
                f"return {state.return_mean}"
            )

    try:
        result = autotune.train(cfg, on_progress=progress)
    except ConfigError as exc:
        print(exc)
        return 2
    summary = {
        k: result[k]
        for k in (
            "env_steps",
            "sampled_steps",
            "lost_steps",
            "steps_per_s",
            "steps_per_joule",
            "return_mean",
            "policy_lag",
        )
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
