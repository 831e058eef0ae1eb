"""An actor process on a Ray node: the same rollout loop (``runtime.actor_process.run_actor``) in a
Ray actor that needs one CPU, told to stop through Ray.

Ray hands it the run's endpoints with the CURVE client keys (never the server's secret) and
the run key with its other start-up arguments, so nothing secret is on a command line or in a
file. Its experience, receipts, weights and telemetry go over the run's ``tcp://`` links, as
a local actor's go over ``ipc://``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import ray


class _Count:
    """What ``run_actor`` bumps per env step (a local actor's is shared memory)."""

    value = 0


@ray.remote(num_cpus=1, max_concurrency=3, max_restarts=0)
class RemoteActor:
    """One actor incarnation: ``run`` blocks until ``stop`` (called concurrently) is set."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._stepped = _Count()

    def node(self) -> str:
        """The Ray node it was placed on (answers once the actor has started)."""
        return ray.get_runtime_context().get_node_id()

    def run(self, cfg: Any, info: Any, endpoints: Any, actor: int, incarnation: int, initial: Any):
        """Returns ``(exit code, steps taken)``: see ``runtime.actor_process.run_actor``."""
        from runtime.actor_process import run_actor

        if cfg.actor_nice:
            os.nice(cfg.actor_nice)
        code = run_actor(
            cfg, info, endpoints, actor, incarnation, self._stepped, self._stop, initial
        )
        return code, int(self._stepped.value)

    def stop(self) -> None:
        self._stop.set()
