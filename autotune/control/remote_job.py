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
