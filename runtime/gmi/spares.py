"""Spare GMI processes: started ahead, with the interpreter up and torch imported, so that the
next GMI generation starts sooner.

A hand-over's new GMI trains only once it has started (``runtime.gmi.fleet``), and a tuner
measures its config only after that. On an H200 host with 15 busy actors a new GMI took
12-23 s: 1.2-3.2 s for the process, 3.0-6.1 s to import torch, 4.6-6.7 s for the learner
(mostly TorchDynamo's imports: its optimiser loads them) and 4.4-7.2 s to compile the loss
from the warm kernel cache (the result's ``gmis[].startup``). A spare has done the first two,
and imported the learner's modules and TorchDynamo, while the run went on; it has not touched
a device. CUDA reads the MPS client's percentage and the visible devices when its driver starts
(``cuInit``), so a spare can still become a GMI on any GPU at any percentage, or on the CPU.
Importing torch maps the driver's library but does not start it, nor does TorchDynamo; on that
host TorchInductor's ``compile_fx`` does, and a spare that had imported it became a GMI that
ran on all 132 SMs at a share of 50 %. So TorchInductor is left to the GMI, and
``spare_main`` checks that no import started the driver.

A spare is a child of the runner like every service (the same ``spawn`` context: it dies with
the runner). Its role comes down a pipe the runner made for it, pickled as ``spawn`` passes a
process's arguments; nothing else writes to that pipe. Spares are kept only in runs whose GMIs
are likely to be replaced (MPS may be set later: a tuner, live changes or a planned change;
or the run has replaced them once), one per GMI of the current generation, and started once
that generation has reported, so that their imports never compete with its start.
A run that sizes itself on a GPU starts one spare ahead, before the run exists
(``started_ahead``), while its probes time the GPU learner (``runtime.probe_child``), so that
its first GMI starts from it instead of importing torch beside every actor's start. The env
steps on every core are timed by then; what is left (the GPU learner, the CPU learner's one
thread) leaves cores free, so a spare is started ahead only where the run may use at least
``AHEAD_MIN_CORES``. A run that keeps no spares lets it go once its first generation reported.
``AUTOTUNE_GMI_SPARES=0`` keeps none (a start as before, for a side-by-side measurement:
``python -m bench.handover``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.cache_dirs import use_bytecode_cache
from runtime.child_start import ctrl_c_held
from runtime.gmi.process import READY, spare_main

logger = logging.getLogger(__name__)

SPARES_ENV = "AUTOTUNE_GMI_SPARES"
MODULES = ("torch", "policies.actor_critic", "policies.appo", "torch._dynamo")
"""What a spare imports ahead (not TorchInductor: see the module docstring)."""

AHEAD_MIN_CORES = 4
"""The fewest cores a run may use for a spare to import beside its probes (``started_ahead``)."""

Adopt = Callable[[str, Any], None]


def spares_allowed() -> bool:
    """False where ``AUTOTUNE_GMI_SPARES`` is 0 (see the module docstring)."""
    value = os.environ.get(SPARES_ENV, "").strip()
    if value in ("", "1"):
        return True
    if value == "0":
        return False
    raise ValueError(f"{SPARES_ENV}={value!r}: allowed are 0 (no spare GMIs) and 1 (the default)")


@dataclass
class _Spare:
    proc: Any
    role_out: Any  # the write end of the pipe the role goes down (pickled)
    ready_in: Any  # the read end of the pipe the spare says READY on (bytes, never unpickled)
    ready: bool = False  # READY read


class Spares:
    """The runner's spare GMI processes.

    Args:
        ctx: The runner's multiprocessing context (``spawn``).
        adopt: Registers a process as the service of a name (``Services.adopt``), once a spare
            has been given that GMI's role.
        modules: What a spare imports ahead (``MODULES``).

    Raises:
        ValueError: ``AUTOTUNE_GMI_SPARES`` holds neither 0 nor 1.
    """

    def __init__(self, ctx: Any, adopt: Adopt, modules: tuple[str, ...] = MODULES) -> None:
        self.ctx, self.adopt, self.modules = ctx, adopt, modules
        use_bytecode_cache()  # a spare imports torch and TorchDynamo as it starts
        self.allowed = spares_allowed()
        self.wanted = 0
        self.idle: list[_Spare] = []
        self.taken = 0
        """Roles handed to spares so far (the result's ``gmi_spares``)."""

    def top_up(self) -> None:
        """Starts spares until ``wanted`` are up (see ``_drop_dead``)."""
        self._drop_dead()
        while self.allowed and len(self.idle) < self.wanted:
            role_in, role_out = self.ctx.Pipe(duplex=False)
            ready_in, ready_out = self.ctx.Pipe(duplex=False)
            args = (role_in, ready_out, self.modules)
            proc = self.ctx.Process(target=spare_main, args=args, name="spare-gmi", daemon=True)
            self.idle.append(_Spare(proc, role_out, ready_in))  # tracked before it runs
            with ctrl_c_held():
                proc.start()
            role_in.close()
            ready_out.close()

    def take(self, name: str, args: tuple[Any, ...]) -> bool:
        """Hands ``args`` (``trainer_main``'s, less ``asked_at``) to a spare that has said it is
        ready (its imports done, no CUDA driver loaded; it waits on the pipe, so the send never
        waits on it), which becomes the service ``name``. False when none is ready: the caller
        starts the GMI afresh, and spares still importing stay for the next time."""
        self._drop_dead()
        for spare in list(self.idle):
            if not (self.allowed and _ready(spare)):
                continue
            self.idle.remove(spare)
            self.adopt(name, spare.proc)  # before the send: no moment it is nobody's
            try:
                spare.role_out.send((*args, time.monotonic()))
            except OSError:  # it died since: the caller's fresh GMI replaces it under ``name``
                logger.warning("a ready spare GMI died before it took %s", name)
                continue
            finally:
                spare.role_out.close()
                spare.ready_in.close()
            self.taken += 1
            logger.info("%s starts from a spare process (pid %d)", name, spare.proc.pid)
            return True
        return False

    def ready(self) -> int:
        """How many idle spares have said they are ready."""
        return sum(_ready(spare) for spare in self.idle)

    def stop(self) -> None:
        """Kills every idle spare (it holds nothing: no device, no socket) and reaps it."""
        idle, self.idle = self.idle, []
        for spare in idle:
            spare.role_out.close()
            spare.ready_in.close()
            if spare.proc.is_alive():
                spare.proc.kill()
        for spare in idle:
            if spare.proc.pid is not None:  # started
                spare.proc.join(timeout=5)

    def _drop_dead(self) -> None:
        """Drops spares that exited idle; one that did means the next would too (its imports
        loaded the CUDA driver, or it died): no more are started or taken in this run."""
        for spare in [s for s in self.idle if s.proc.pid is not None and not s.proc.is_alive()]:
            logger.warning(
                "a spare GMI process exited (code %s) before it was used; GMIs start afresh "
                "for the rest of the run",
                spare.proc.exitcode,
            )
            spare.role_out.close()
            spare.ready_in.close()
            spare.proc.join(timeout=5)
            self.idle.remove(spare)
            self.allowed = False


def _not_adopted(name: str, _proc: Any) -> None:
    raise RuntimeError(f"a spare started ahead was given {name} before a run took it")


def started_ahead(
    modules: tuple[str, ...] = MODULES, min_cores: int = AHEAD_MIN_CORES
) -> Spares | None:
    """One spare GMI started before its run exists, for the run's first GMI (see the module
    docstring); the run takes it (``Runner(spares=...)``), and with it its ``adopt``. None
    where spares are off (``AUTOTUNE_GMI_SPARES=0``) or the process may use fewer than
    ``min_cores`` cores.

    Raises:
        ValueError: ``AUTOTUNE_GMI_SPARES`` holds neither 0 nor 1.
    """
    import multiprocessing as mp

    spares = Spares(mp.get_context("spawn"), _not_adopted, modules)
    if not spares.allowed or len(os.sched_getaffinity(0)) < min_cores:
        return None
    spares.wanted = 1
    spares.top_up()
    return spares


def _ready(spare: _Spare) -> bool:
    """Whether ``spare`` has said READY (its pipe says nothing else, once)."""
    if not spare.ready:
        try:
            spare.ready = spare.ready_in.poll(0) and spare.ready_in.recv_bytes() == READY
        except (OSError, EOFError):  # it died: ``_drop_dead`` will see it
            return False
    return spare.ready
