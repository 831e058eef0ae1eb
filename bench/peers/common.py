"""What the peer scripts share: their flags, the MLP sizes and the stop rule."""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable


def add_peer_args(ap: argparse.ArgumentParser) -> None:
    """The flags every peer takes (env, vector size, MLP, device, threads, seed, budget, curve)."""
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--num-envs", type=int, default=0, help="vector envs (0: one per core)")
    ap.add_argument(
        "--net",
        default="64,64",
        help="hidden sizes of the policy and of the value MLP, e.g. 256,128,64",
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--total-steps", type=int, default=1_000_000)
    ap.add_argument(
        "--seconds", type=float, default=0.0, help="stop after this wall time (0: none)"
    )
    ap.add_argument(
        "--min-steps",
        type=int,
        default=0,
        help="with --seconds, go on past them until this run trained this many steps: a loaded "
        "machine gets a longer run, not an empty one (0: the seconds alone)",
    )
    ap.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="with --seconds, go on past them until two progress lines lie this many seconds "
        "or more after the first trained one: the window a benchmark measures after its "
        "warm-up (default: the seconds alone)",
    )
    ap.add_argument(
        "--progress",
        default=None,
        metavar="FILE",
        help="write the learning curve here (autotune/workflows/progress_log.py)",
    )


def check_peer_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Fills --num-envs 0, --device auto and ``a.hidden``; refuses bad values, saying what is
    allowed."""
    a.num_envs = a.num_envs or os.cpu_count() or 1
    try:
        a.hidden = [int(x) for x in a.net.split(",")]
    except ValueError:
        a.hidden = []
    if not a.hidden or min(a.hidden) < 1:
        ap.error(f"--net {a.net!r}: expected comma-separated positive integers, e.g. 256,128,64")
    budgets = (a.seconds, a.min_steps, 0.0 if a.warmup_s is None else a.warmup_s)
    finite = all(math.isfinite(v) and v >= 0 for v in budgets)  # NaN passes a min()
    if a.num_envs < 1 or a.threads < 1 or a.total_steps < 1 or not finite:
        ap.error(
            "--num-envs, --threads and --total-steps must be >= 1; --seconds, --min-steps and "
            "--warmup-s finite numbers >= 0"
        )
    if a.device == "auto":
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device not in ("cpu", "cuda"):
        ap.error(f"--device {a.device!r}: allowed cpu, cuda, auto")


class StopRule:
    """When a run that starts training now must stop: ``--seconds`` after now (never without
    it), not before it trained ``--min-steps`` more than ``start_steps``, and, with
    ``--warmup-s``, not before two progress lines (``line``) lie that long or longer after its
    first trained one: on a loaded machine a rollout may take longer than the window."""

    def __init__(
        self, a: argparse.Namespace, start_steps: int = 0, clock: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.at = clock() + a.seconds if a.seconds else float("inf")
        self.min_steps, self.start_steps = a.min_steps, start_steps
        self.warmup_s: float | None = a.warmup_s
        self.first_t: float | None = None  # when the first trained line was written
        self.after = 0  # lines written warmup_s or more after it

    def line(self, steps: int) -> None:
        """A progress line at ``steps`` was written now."""
        if steps <= self.start_steps:
            return
        now = self.clock()
        if self.first_t is None:
            self.first_t = now
        if self.warmup_s is not None and now >= self.first_t + self.warmup_s:
            self.after += 1

    def due(self, trained: int) -> bool:
        window = self.warmup_s is None or self.after >= 2
        return self.clock() >= self.at and trained - self.start_steps >= self.min_steps and window


def hidden_from_policy(spec: str) -> str:
    """``auto:256:128:64:auto`` (``autotune train --policy``) -> ``256,128,64`` (``--net``)."""
    parts = spec.split(":")
    inner = parts[1:-1] if parts[0] == "auto" or parts[-1] == "auto" else parts
    return ",".join(inner)
