"""Dispenser (in each actor): splits a rollout into typed channels and pushes each on its own.

A rollout of ``K`` environments x ``T`` steps becomes one ROLLOUT message per channel, each
carrying the rollout's identity ``(actor, incarnation, seq)`` so the compressor can realign
them. Every channel is env-major (``[K, ...]``): row ``k`` is environment ``k``'s trajectory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import zmq

from runtime import wire

CHANNELS = ("obs", "actions", "rewards", "dones", "logp", "versions")
"""Channel names in their fixed order: obs ``[K, T+1, D]`` (the last entry bootstraps),
actions ``[K, T]`` or ``[K, T, A]``, rewards ``[K, T]``, dones ``[K, T]`` (1 where an episode
ended at that step), logp ``[K, T]`` (behaviour log-probs), versions ``[K, T]`` (the policy
version each step was sampled with)."""


def layout_problem(channels: Mapping[str, np.ndarray], steps: int | None = None) -> str | None:
    """What is wrong with a rollout's or chunk's channels (None if they fit ``CHANNELS``).

    Every channel in order, the same rows, obs ``[rows, T+1, D]``, the others ``[rows, T, ...]``
    and, when ``steps`` is given, ``steps == rows * T``.
    """
    if list(channels) != list(CHANNELS):
        return f"channels {list(channels)}; expected {list(CHANNELS)}"
    obs = channels["obs"]
    if obs.ndim != 3 or obs.shape[1] < 2:
        return f"obs has shape {obs.shape}; expected [rows, T+1, D]"
    rows, t = obs.shape[0], obs.shape[1] - 1
    for name in CHANNELS[1:]:
        shape = channels[name].shape
        if len(shape) < 2 or shape[:2] != (rows, t):
            return f"{name} has shape {shape}; expected [{rows}, {t}, ...]"
    if steps is not None and steps != rows * t:
        return f"declares {steps} steps; {rows} rows x {t} steps hold {rows * t}"
    return None


@dataclass(frozen=True)
class RolloutId:
    """Who produced a rollout: actor slot, its incarnation (restart count) and sequence number."""

    actor: int
    incarnation: int
    seq: int


class Dispenser:
    """Pushes rollouts channel by channel on one PUSH socket.

    Args:
        sock: The actor's experience PUSH socket (``topology.actor_experience_out``).
        actor: Actor slot index.
        incarnation: How many times this slot was restarted before this process.
    """

    def __init__(self, sock: zmq.Socket, actor: int, incarnation: int, key: bytes = b"") -> None:
        self.sock = sock
        self.key = key
        self.actor = actor
        self.incarnation = incarnation
        self.seq = 0
        self.messages = 0
        self.bytes = 0

    def dispatch(self, rollout: Mapping[str, np.ndarray], steps: int) -> RolloutId:
        """Sends one rollout as ``len(CHANNELS)`` messages; blocks only on back-pressure.

        Args:
            rollout: Channel name to array, every channel in ``CHANNELS``, same row count.
            steps: Environment steps in the rollout (``K * T``).

        Raises:
            ValueError: A channel is missing or the channels disagree on the row count.
        """
        missing = [c for c in CHANNELS if c not in rollout]
        if missing:
            raise ValueError(f"rollout lacks channels {missing}; needs {list(CHANNELS)}")
        rows = {c: rollout[c].shape[0] for c in CHANNELS}
        if len(set(rows.values())) != 1:
            raise ValueError(f"rollout channels disagree on rows (environments): {rows}")
        rid = RolloutId(self.actor, self.incarnation, self.seq)
        for index, name in enumerate(CHANNELS):
            meta = {
                "ch": name,
                "ci": index,
                "nch": len(CHANNELS),
                "actor": rid.actor,
                "inc": rid.incarnation,
                "seq": rid.seq,
                "steps": steps,
                "rows": rows[name],
            }
            if self.key:
                meta = wire.sign(self.key, wire.MsgType.ROLLOUT, meta, [rollout[name]])
            self.bytes += wire.send_msg(self.sock, wire.MsgType.ROLLOUT, meta, [rollout[name]])
            self.messages += 1
        self.seq += 1
        return rid

    def end_of_stream(self) -> None:
        """Tells the compressor this incarnation will send nothing more."""
        meta = {"actor": self.actor, "inc": self.incarnation, "rollouts": self.seq}
        if self.key:
            meta = wire.sign(self.key, wire.MsgType.EOS, meta)
        wire.send_msg(self.sock, wire.MsgType.EOS, meta)
