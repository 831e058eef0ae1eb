"""The workload flags the training benchmarks share, and the learner they describe.

Defaults are the Ant-v5 settings of docs/BENCHMARKS.md: 16 envs per actor, rollouts of 32,
batches of 8192 steps, 2 epochs x 2 minibatches, lr 1e-3, no entropy bonus.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """Adds --policy, --envs-per-actor, --rollout-len, --batch-size and the learner flags."""
    ap.add_argument("--policy", default="auto:256:128:64:auto")
    ap.add_argument("--envs-per-actor", type=int, default=16)
    ap.add_argument("--rollout-len", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--entropy-coef", type=float, default=0.0)


def learner_from_args(a: argparse.Namespace) -> Any:
    """The learner configuration (``APPOConfig``) of ``add_workload_args``' flags."""
    from policies.appo import APPOConfig

    return replace(
        APPOConfig(),
        epochs=a.epochs,
        minibatches=a.minibatches,
        lr=a.lr,
        entropy_coef=a.entropy_coef,
    )
