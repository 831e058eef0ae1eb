"""A job registered with the daemon, as the tuner's ``Job`` (``autotune.tuning.job``): configs
go out as sequenced APPLY messages, readiness and windows come from the job's reports."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from autotune.control import protocol
from autotune.control.protocol import MsgType
from autotune.control.status import valid_nodes
from autotune.tuning.counters import Counters
from autotune.tuning.knobs import Knob
from autotune.tuning.online_tuner import OnlineTuner
from runtime.config import ConfigError


class RemoteJob:
    """A job in another process as the tuner's ``Job``: applies are sequenced messages,
    readiness and windows come from the job's reports."""

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send
        self.seq = 0
        self.values: dict[str, Any] | None = None
        self.sent_at = 0.0
        self.applied = 0
        self.refused: str | None = None
        self.settled = False
        self.latest: Counters | None = None
        self.nodes: list[dict[str, Any]] | None = None
        self.noise_scale: float | None = None

    def apply(self, values: dict[str, Any]) -> None:
        self.seq += 1
        self.values = dict(values)
        self.resend()

    def resend(self) -> None:
        self.sent_at = time.monotonic()
        self._send(MsgType.APPLY, seq=self.seq, values=self.values)

    def ready(self) -> bool:
        if self.applied < self.seq:
            return False
        if self.refused is not None:
            raise ConfigError([self.refused])
        return self.settled

    def counters(self) -> Counters:
        if self.latest is None:
            raise ConfigError(["the job has not reported its counters yet"])
        return self.latest

    def on_report(self, msg: dict[str, Any]) -> None:
        """Takes a REPORT (raises ``ValueError`` for a malformed one, taking nothing of it)."""
        config = msg.get("config")
        if config is not None and not (
            isinstance(config, dict) and all(isinstance(k, str) for k in config)
        ):
            raise ValueError(f"'config': {str(config)[:80]!r} is not a map of field names")
        self.latest = Counters.from_wire(msg["counters"])
        self.nodes = valid_nodes(msg.get("nodes"))  # a cluster run's, for status
        noise = msg.get("noise_scale")
        if noise is not None and not (isinstance(noise, float) and math.isfinite(noise)):
            raise ValueError(f"'noise_scale': {noise!r} is not a finite float or none")
        self.noise_scale = noise
        applied = int(msg.get("applied", 0))
        if applied == self.seq:
            self.applied, self.refused = applied, msg.get("refused")
            self.settled = bool(msg.get("settled"))
        elif applied < self.seq and time.monotonic() - self.sent_at >= protocol.APPLY_RESEND_S:
            self.resend()


def tuner_for(msg: dict[str, Any], remote: RemoteJob) -> tuple[OnlineTuner, dict[str, Knob]]:
    """The online tuner a job's HELLO asks for (its knobs, settings, sampler and study),
    tuning ``remote``; and the knob space.

    Raises:
        KeyError, TypeError, ValueError: a field missing or malformed, bad settings or knobs,
            a study that cannot be opened (``StudyError``).
    """
    from autotune.tuning.knobs import knobs_from_wire
    from autotune.tuning.model_inputs import machine_from_doc
    from autotune.tuning.model_sampler import sampler_for
    from autotune.tuning.settings import TunerSettings
    from autotune.tuning.storage import open_study

    space = knobs_from_wire(msg["knobs"])
    settings = TunerSettings(**msg["settings"])
    online = [k for k in space.values() if k.online]
    grid = {k.name: list(k.choices) for k in online} if settings.sampler == "grid" else None
    defaults = msg.get("defaults") or {}
    sampler = None
    if settings.sampler == "model" and msg.get("machine"):
        machine = machine_from_doc(msg["machine"])
        sampler = sampler_for(machine, space, defaults, settings, msg.get("seed"))
    study = open_study(
        msg["storage"], msg["study"], seed=msg.get("seed"), grid=grid, sampler=sampler
    )
    return OnlineTuner(study, space, remote, settings, msg["base"], defaults=defaults), space
