"""Changing a running job: which settings apply live, and how each kind of change is applied.

Every ``TrainConfig`` field falls in one of these classes:

* ``RUNNER``: the runner alone uses it (``actors``: actors are started or told to stop after
  their current rollout, which they deliver before exiting; ``steps``, ``max_wall_s``).
* ``ACTOR_RESPAWN``: actors read it when they start (``envs_per_actor``, ``actor_nice``,
  ``env_backend``);
  every actor is replaced by a new incarnation, each old one delivering what it collected.
* ``SERVICE_LIVE``: the compressor, trainers and actors take it from a COMMAND ``live``
  message (``chunk_bytes``, ``chunk_timeout_s``, ``batch_size``, ``max_inflight_batches``).
  The message carries an epoch and the whole set, and the runner resends it every
  ``RESEND_S`` (PUB/SUB can drop a message sent before a subscriber joined); a process applies
  an epoch once (``runtime.stages.common.LiveSettings``) and reports ``live_epoch`` in its
  telemetry.
* ``GMI_HANDOVER``: trainer GMIs are started with it; a change starts a new generation of GMIs
  that takes over the learner state (``runtime.gmi.fleet``): ``trainers``, ``mps_pct``,
  ``gpus``, ``trainer_device``, ``trainer_threads``, ``trainer_precision``, ``grad_sync``.
* everything else needs a new run (the environment, rollout length, policy, seed, inference
  placement, transport, learner hyper-parameters): ``plan`` refuses it with the reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from runtime import commands
from runtime.config import ConfigError, TrainConfig

if TYPE_CHECKING:
    from runtime.envs import EnvInfo

RUNNER = ("actors", "steps", "max_wall_s")
ACTOR_RESPAWN = ("envs_per_actor", "actor_nice", "env_backend")
SERVICE_LIVE = ("chunk_bytes", "chunk_timeout_s", "batch_size", "max_inflight_batches")
GMI_HANDOVER = (
    "trainers",
    "mps_pct",
    "gpus",
    "trainer_device",
    "trainer_threads",
    "trainer_precision",
    "grad_sync",
)
LIVE_FIELDS = RUNNER + ACTOR_RESPAWN + SERVICE_LIVE + GMI_HANDOVER
RESEND_S = 1.0


@dataclass(frozen=True)
class Plan:
    """What a change from one config to another takes (see the module docstring)."""

    changed: tuple[str, ...]
    actors: bool
    respawn_actors: bool
    services: bool
    handover: bool

    @property
    def empty(self) -> bool:
        return not self.changed


def plan(old: TrainConfig, new: TrainConfig, info: EnvInfo | None = None) -> Plan:
    """Classifies the fields that differ between ``old`` and ``new``.

    Raises:
        ConfigError: if a field that needs a new run differs, naming it and the live fields;
            or, given the run's ``info``, if ``new``'s env backend gives the env other spaces
            than the run's policy was made for (Blackjack-v1's observation on EnvPool and on
            gymnasium).
    """
    changed = tuple(
        f.name for f in fields(TrainConfig) if getattr(old, f.name) != getattr(new, f.name)
    )
    frozen = [name for name in changed if name not in LIVE_FIELDS]
    if frozen:
        raise ConfigError(
            [
                f"{', '.join(frozen)} cannot change in a running job (start a new "
                f"run); live settings: {', '.join(LIVE_FIELDS)}"
            ]
        )
    if info is not None and "env_backend" in changed:
        _same_spaces(new, info)
    inflight_changed = old.inflight_steps_per_actor() != new.inflight_steps_per_actor()
    return Plan(
        changed=changed,
        actors=new.actors != old.actors,
        respawn_actors=any(n in ACTOR_RESPAWN for n in changed),
        services=inflight_changed or any(n in SERVICE_LIVE for n in changed),
        handover=any(n in GMI_HANDOVER for n in changed),
    )


def _same_spaces(new: TrainConfig, info: EnvInfo) -> None:
    from runtime.env_backends import resolve_backend
    from runtime.envs import EnvError, probe_env

    try:
        there = probe_env(new.env, resolve_backend(new.env, new.env_backend))
    except EnvError as exc:
        raise ConfigError([f"env_backend={new.env_backend!r}: {exc}"]) from None
    shape = (there.obs_dim, there.discrete, there.act_dim)
    if shape != (info.obs_dim, info.discrete, info.act_dim):
        raise ConfigError(
            [
                f"env_backend={new.env_backend!r}: {new.env} there has {there.obs_dim} "
                f"observation values and {there.act_dim} actions, the run's policy "
                f"{info.obs_dim} and {info.act_dim}: a run keeps its backend's spaces"
            ]
        )


def live_meta(cfg: TrainConfig, epoch: int) -> dict[str, Any]:
    """The COMMAND ``live`` message for ``cfg``: every SERVICE_LIVE value, and each actor's
    in-flight budget in steps (it depends on ``actors`` too)."""
    return {
        "cmd": "live",
        "epoch": epoch,
        "chunk_bytes": cfg.chunk_bytes,
        "chunk_timeout_s": cfg.chunk_timeout_s,
        "batch_size": cfg.batch_size,
        "inflight_steps_per_actor": cfg.inflight_steps_per_actor(),
    }


class LiveBroadcaster:
    """The runner's side of the COMMAND ``live`` message: a new epoch per change, and the
    current one resent every ``RESEND_S`` (PUB/SUB drops what a late subscriber missed)."""

    def __init__(self) -> None:
        self.epoch = 0
        self._sent = 0.0

    def bump(self, sock: commands.CommandOut, cfg: TrainConfig) -> None:
        """Sends ``cfg``'s live settings as a new epoch."""
        self.epoch += 1
        self.send(sock, cfg, force=True)

    def send(self, sock: commands.CommandOut, cfg: TrainConfig, force: bool = False) -> None:
        """Resends the current epoch (after the first change) if ``RESEND_S`` has passed."""
        now = time.monotonic()
        if self.epoch and (force or now - self._sent >= RESEND_S):
            sock.send(live_meta(cfg, self.epoch))
            self._sent = now
