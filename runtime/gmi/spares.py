"""Spare GMI processes: started ahead, with the interpreter up and torch imported, so that the
next GMI generation starts sooner.

A hand-over's new GMI trains only once it has started (``runtime.gmi.fleet``), and a tuner
measures its config only after that. On an H200 host with 15 busy actors a new GMI took
12-21 s: 1.2-3.2 s for the process, 3.0-6.1 s to import torch, 4.6-6.7 s for the learner
(mostly TorchDynamo's and TorchInductor's imports) and 4.4-7.2 s to compile the loss from the
warm kernel cache (the result's ``gmis[].startup``). A spare has done the first two, and
imported the learner's own modules, while the run went on; it has not touched a device. CUDA
reads the MPS client's percentage and the visible devices when its driver starts, so a spare
can still become a GMI on any GPU at any percentage, or on the CPU. Where torch is built with
CUDA the compiler's modules are not imported ahead: on that host a spare that had imported them
too had started the CUDA driver, and its GMI ran on all SMs at a share of 50 %. ``spare_main``
checks that no import did.

A spare is a child of the runner like every service (the same ``spawn`` context: it dies with
the runner). Its role comes down a pipe the runner made for it, pickled as ``spawn`` passes a
process's arguments; nothing else writes to that pipe. Spares are kept only in runs whose GMIs
are likely to be replaced (MPS may be set later: a tuner, live changes or a planned change;
or the run has replaced them once), one per GMI of the current generation, and started once
that generation has reported, so that their imports never compete with its start.
``AUTOTUNE_GMI_SPARES=0`` keeps none (a start as before, for a side-by-side measurement:
``python -m bench.handover``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from runtime.gmi.process import spare_main

logger = logging.getLogger(__name__)

SPARES_ENV = "AUTOTUNE_GMI_SPARES"
MODULES = ("torch", "policies.actor_critic", "policies.appo")
"""What a spare imports ahead (not TorchDynamo or TorchInductor: see the module docstring)."""
CPU_BUILD_MODULES = ("torch._dynamo", "torch._inductor.compile_fx")
"""Imported ahead too where torch is built without CUDA (no driver to start): the learner's
optimiser loads TorchDynamo as it is built (about 1 s of a 2-core CPU GMI's start)."""

Adopt = Callable[[str, Any], None]


def spares_allowed() -> bool:
    """False where ``AUTOTUNE_GMI_SPARES`` is 0 (see the module docstring)."""
    value = os.environ.get(SPARES_ENV, "").strip()
    if value in ("", "1"):
        return True
    if value == "0":
        return False
    raise ValueError(f"{SPARES_ENV}={value!r}: allowed are 0 (no spare GMIs) and 1 (the default)")


class Spares:
    """The runner's spare GMI processes.

    Args:
        ctx: The runner's multiprocessing context (``spawn``).
        adopt: Registers a process as the service of a name (``Services.adopt``), once a spare
            has been given that GMI's role.

    Raises:
        ValueError: ``AUTOTUNE_GMI_SPARES`` holds neither 0 nor 1.
    """

    def __init__(self, ctx: Any, adopt: Adopt) -> None:
        self.ctx, self.adopt = ctx, adopt
        self.allowed = spares_allowed()
        self.modules = MODULES
        self.wanted = 0
        self.idle: list[tuple[Any, Any]] = []  # (process, the write end of its pipe)
        self.taken = 0
        """Roles handed to spares so far (the result's ``gmi_spares``)."""

    def top_up(self) -> None:
        """Starts spares until ``wanted`` are up (see ``_drop_dead``)."""
        self._drop_dead()
        while self.allowed and len(self.idle) < self.wanted:
            read, write = self.ctx.Pipe(duplex=False)
            proc = self.ctx.Process(
                target=spare_main,
                args=(read, self.modules, CPU_BUILD_MODULES),
                name="spare-gmi",
                daemon=True,
            )
            proc.start()
            read.close()
            self.idle.append((proc, write))

    def take(self, name: str, args: tuple[Any, ...]) -> bool:
        """Hands ``args`` (``trainer_main``'s, less ``asked_at``) to a spare, which becomes the
        service ``name``; False when none is up (the caller starts the GMI afresh)."""
        self._drop_dead()
        while self.idle:
            proc, write = self.idle.pop(0)
            try:  # a few KB: the pipe holds it, so a spare still importing holds no one up
                write.send((*args, time.monotonic()))
            except OSError:  # it died since the check: the pipe has no reader
                proc.join(timeout=5)
                continue
            finally:
                write.close()
            self.adopt(name, proc)
            self.taken += 1
            logger.info("%s starts from a spare process (pid %d)", name, proc.pid)
            return True
        return False

    def stop(self) -> None:
        """Kills every idle spare (it holds nothing: no device, no socket) and reaps it."""
        for proc, write in self.idle:
            write.close()
            if proc.is_alive():
                proc.kill()
        for proc, _ in self.idle:
            proc.join(timeout=5)
        self.idle = []

    def _drop_dead(self) -> None:
        """Drops spares that exited idle; one that did means the next would too (its imports
        loaded the CUDA driver, or it died): no more are started in this run."""
        for proc, write in [s for s in self.idle if not s[0].is_alive()]:
            logger.warning(
                "a spare GMI process exited (code %s) before it was used; GMIs start afresh "
                "for the rest of the run",
                proc.exitcode,
            )
            write.close()
            proc.join(timeout=5)
            self.idle.remove((proc, write))
            self.allowed = False
