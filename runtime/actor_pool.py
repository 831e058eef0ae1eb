"""The runner's actor processes: start, restart the dead, resize and respawn live, drain.

Each actor process has its own stop event, so one actor can be told to stop without the
others: it finishes its rollout, sends it, and exits once the migrator's receipts cover every
step it sent (``runtime.actor``), so an actor removed mid-run loses nothing. Removed and
replaced actors stay in ``leaving`` until they have exited. A respawned actor (other settings)
is made before it is broken: the old incarnation steps on until its successor has stepped (or
died, or ``HANDOVER_S`` passed), so the run keeps sampling while the new process starts, which
takes seconds (its interpreter, imports and envs).

Accounting: every incarnation (``"<slot>:<incarnation>"``) that ended has its final step
count in ``ended.stepped``; those that died (killed, crashed, or stuck past the exit timeout)
are in ``ended.died``, and ``clean`` holds the step counts of those that exited cleanly (the
compressor's drain waits for exactly those).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime import topology
from runtime.actor import NONFINITE_EXIT
from runtime.actor_placement import actor_cores, one_blas_thread, place_threads
from runtime.actor_process import actor_main
from runtime.child_start import ctrl_c_held
from runtime.config import TrainConfig
from runtime.env_backends import actor_threads
from runtime.envs import EnvError, EnvInfo
from runtime.initial_weights import InitialWeights

logger = logging.getLogger(__name__)

LEAVE_TIMEOUT_S = 60.0
"""How long a removed actor may take to deliver its last rollout and exit before it is killed
(and its undelivered steps counted as lost)."""


HANDOVER_S = 60.0
"""How long a replaced actor steps on at most while its successor starts."""

RESTART_WINDOW_S = 60.0
RESTART_LIMIT = 5
"""An actor slot that dies this many times within ``RESTART_WINDOW_S`` is not restarted again,
and the run stops (``ActorPool.gave_up`` says why): its env most likely fails at once."""
BACKOFF_S = (0.5, 10.0)
"""A dead actor is restarted after the first value, doubled for each death of its slot in the
window, up to the second."""


@dataclass
class ActorSlot:
    """One running actor process: slot index, incarnation, process, shared step counter."""

    index: int
    incarnation: int
    process: Any
    stepped: Any
    stop: Any
    cfg: TrainConfig
    leave_by: float | None = None
    threads: int = 1
    """The EnvPool threads its incarnation runs (fixed at its start: ``ActorPool.pin``)."""
    successor: ActorSlot | None = None
    """The incarnation replacing this one, while this one steps on (``ActorPool.check``)."""

    @property
    def key(self) -> str:
        return f"{self.index}:{self.incarnation}"


@dataclass
class Incarnations:
    """Final step counters of every actor incarnation that has ended, by ``"actor:inc"``."""

    stepped: dict[str, int] = field(default_factory=dict)
    died: set[str] = field(default_factory=set)
    clean: dict[str, int] = field(default_factory=dict)

    def settle(self, complete: dict[str, int]) -> None:
        """Raises each died incarnation's steps to at least what the compressor received whole
        of it (``complete``, its final counts): a remote actor's count is its last report
        (``runtime.cluster.launcher``), and one that died after sending more had stepped more.
        A local actor's count is never below (it counts each step before it sends it)."""
        for key in self.died:
            self.stepped[key] = max(self.stepped[key], int(complete.get(key, 0)))


def _threaded(cfg: TrainConfig) -> bool:
    """Whether ``cfg``'s actors run EnvPool, whose thread count is fixed when an actor starts."""
    with contextlib.suppress(EnvError):
        return cfg.resolved_backend() == "envpool"
    return False


class ActorPool:
    """Actor processes of one run (see the module docstring).

    Args:
        mp_ctx: The multiprocessing context (``spawn``).
        info: The environment description.
    """

    def __init__(self, mp_ctx: Any, info: EnvInfo) -> None:
        self.mp, self.info = mp_ctx, info
        self.slots: list[ActorSlot] = []
        self.count = 0
        """Actors the run has now (its config's count; slots waiting to restart included)."""
        self.leaving: list[ActorSlot] = []
        self.ended = Incarnations()
        self.restarts = 0
        self.gave_up: str | None = None
        """Why a slot is no longer restarted (the run then stops), or None."""
        self._deaths: dict[int, list[float]] = {}
        self._pending: dict[int, tuple[float, TrainConfig]] = {}
        """Slots waiting out their back-off: index -> (restart time, config)."""
        self._next_incarnation: dict[int, int] = {}
        self.initial = InitialWeights(info)
        """The actors' version-0 weights; its ``directory`` is set to the run's, so local
        actors get them as a file (``runtime.initial_weights``)."""
        self.launcher: Any = None
        """Starts incarnations elsewhere (``runtime.cluster.launcher.RemoteLauncher``: on a
        Ray cluster's nodes); None: this machine's processes."""

    def _start(self, cfg: TrainConfig, ep: topology.Endpoints, index: int) -> ActorSlot:
        incarnation = self._next_incarnation.get(index, 0)
        self._next_incarnation[index] = incarnation + 1
        if self.launcher is not None:
            initial = self.initial.arrays(cfg)
            return self.launcher.start(cfg, self.info, ep, index, incarnation, initial)
        stepped, stop = self.mp.RawValue("q", 0), self.mp.Event()
        cores, threads = self._placement(index, cfg)
        proc = self.mp.Process(
            target=actor_main,
            name=f"actor-{index}.{incarnation}",
            daemon=True,
            args=(
                cfg,
                self.info,
                ep,
                index,
                incarnation,
                stepped,
                stop,
                self.initial.for_local(cfg),
            ),
            kwargs={"threads": threads},
        )
        with one_blas_thread(), ctrl_c_held():
            proc.start()
        slot = ActorSlot(index, incarnation, proc, stepped, stop, cfg, threads=threads)
        if cores:  # from here, before the child starts a thread (its interpreter is starting)
            place_threads(slot.process.pid, slot.key, set(cores))
        return slot

    def _placement(self, index: int, cfg: TrainConfig) -> tuple[list[int] | None, int]:
        """Slot ``index``'s cores (``actor_cores``) and EnvPool threads (a core each or a share)."""
        cores = actor_cores(index, self.count, cfg.pin_actors)
        return cores, len(cores) if cores else actor_threads(self.count)

    def pin(self, ep: topology.Endpoints | None = None) -> int:
        """Pins every thread of each actor process of this machine to its cores under this
        process's CPU set as it is now (``actor_cores``), or spreads it over the whole set
        where it gets none: after the set or the actor count changed (a daemon's new budget,
        a resize). Given ``ep``, an EnvPool actor pinned to a block of another size than its
        threads (started once) is replaced by a new incarnation. Returns how many it pinned."""
        pinned, whole = 0, os.sched_getaffinity(0)
        for slot in [] if self.launcher is not None else list(self.slots):
            cores, threads = self._placement(slot.index, slot.cfg)
            if slot.process.pid is None or not slot.process.is_alive():
                continue
            if ep is not None and cores and threads != slot.threads and _threaded(slot.cfg):
                self._leave(slot)  # at once, not made before broken: its cores may be another's
                self.slots[self.slots.index(slot)] = self._start(slot.cfg, ep, slot.index)
                pinned += 1
                continue
            pinned += place_threads(
                slot.process.pid, slot.key, set(cores) if cores else whole
            ) and bool(cores)
        return pinned

    def start(self, cfg: TrainConfig, ep: topology.Endpoints) -> None:
        """Starts ``cfg.actors`` actors."""
        self.count, self.slots = cfg.actors, []
        for i in range(cfg.actors):  # each kept as it starts: a start that fails stops those
            self.slots.append(self._start(cfg, ep, i))

    def _end(self, slot: ActorSlot, died: bool) -> None:
        self.ended.stepped[slot.key] = int(slot.stepped.value)
        if died:
            self.ended.died.add(slot.key)
        else:
            self.ended.clean[slot.key] = int(slot.stepped.value)

    def _leave(self, slot: ActorSlot) -> None:
        slot.stop.set()
        slot.leave_by = time.monotonic() + LEAVE_TIMEOUT_S
        for old in self.leaving:  # one still stepping on for this incarnation stops with it
            if old.successor is slot:
                old.successor = None
                old.stop.set()
                old.leave_by = slot.leave_by
        self.leaving.append(slot)

    def _replace(self, slot: ActorSlot, cfg: TrainConfig, ep: topology.Endpoints) -> ActorSlot:
        """Starts ``slot``'s next incarnation with ``cfg``; ``slot`` leaves once it has stepped
        (see the module docstring); on a Ray cluster it leaves first (a remote actor holds a
        node's CPU: its successor could not be placed beside it). Returns the new slot."""
        if self.launcher is not None:
            self._leave(slot)
            return self._start(cfg, ep, slot.index)
        new = self._start(cfg, ep, slot.index)
        slot.successor = new
        slot.leave_by = time.monotonic() + HANDOVER_S  # then told to stop (``check``)
        self.leaving.append(slot)
        return new

    def _handed_over(self, slot: ActorSlot, now: float) -> bool:
        """Whether replaced ``slot`` should stop now: its successor stepped or ended, or
        ``HANDOVER_S`` passed."""
        new = slot.successor
        if new is None:
            return False
        started = new.stepped is None or new.stepped.value > 0 or not new.process.is_alive()
        return started or now >= (slot.leave_by or now)

    def _used(self) -> set[int]:
        return {s.index for s in self.slots} | set(self._pending)

    def resize(self, cfg: TrainConfig, ep: topology.Endpoints) -> None:
        """Adds actors (new slots) or removes the highest slots to reach ``cfg.actors`` (a slot
        waiting out its restart back-off counts, and is dropped first); then pins them
        (``pin``)."""
        self.count = cfg.actors
        while len(self._used()) < cfg.actors:
            free = min(set(range(len(self._used()) + 1)) - self._used())
            self.slots.append(self._start(cfg, ep, free))
        while len(self._used()) > cfg.actors:
            top = max(self._used())
            if self._pending.pop(top, None) is not None:
                continue
            self._leave(self.slots.pop(next(i for i, s in enumerate(self.slots) if s.index == top)))
        self.pin(ep)  # those started for another count, now on cores of their own

    def respawn(self, cfg: TrainConfig, ep: topology.Endpoints) -> None:
        """Replaces every actor by a new incarnation started with ``cfg``; slots beyond
        ``cfg.actors`` are left as they are, for ``resize`` to remove."""
        self.count = cfg.actors  # the new incarnations' cores are for the new count
        old, self.slots = self.slots, []
        for slot in old:
            if slot.index >= cfg.actors:
                self.slots.append(slot)
                continue
            self.slots.append(self._replace(slot, cfg, ep))
        self._pending = {i: (due, cfg) for i, (due, _) in self._pending.items()}

    def next_incarnations(self) -> dict[int, int]:
        """Per slot, the incarnation it starts next (a slot not started yet: none, 0)."""
        return dict(self._next_incarnation)

    def replace_all(self, ep: topology.Endpoints) -> None:
        """After the compressor and the migrator were replaced: every actor process is killed
        (what it sent and had no receipt for went with the old services, and it would wait for
        that receipt forever) and each slot starts a new incarnation at once. The killed
        incarnations are recorded as died (their undelivered steps are lost), but they are not
        deaths of their slots: no back-off, and they do not count toward ``RESTART_LIMIT``."""
        old = self.slots + self.leaving
        for slot in old:
            if slot.process.is_alive():
                slot.process.kill()
        for slot in old:
            slot.process.join(timeout=5)
            self._end(slot, died=True)
        running, self.slots, self.leaving = self.slots, [], []
        for slot in running:  # kept as they start (see ``start``)
            self.slots.append(self._start(slot.cfg, ep, slot.index))
        # what incarnations that ended cleanly before had sent went through the old services:
        # the new compressor's drain waits only for the incarnations it serves
        self.ended.clean.clear()

    def check(self, ep: topology.Endpoints | None) -> None:
        """Restarts actors that died (after a back-off that grows with each death of the slot;
        a slot that dies ``RESTART_LIMIT`` times in ``RESTART_WINDOW_S`` is given up, see
        ``gave_up``); reaps (or kills, past their timeout) leaving ones. With ``ep`` None (the
        drain) nothing is restarted."""
        now = time.monotonic()
        if self.launcher is not None:
            self.launcher.tick()
        for slot in [s for s in self.slots if not s.process.is_alive()]:
            _ = slot.process.exitcode  # a remote actor's exact final steps come with it
            self._end(slot, died=True)
            self.slots.remove(slot)
            deaths = [t for t in self._deaths.get(slot.index, []) if now - t < RESTART_WINDOW_S]
            deaths.append(now)
            self._deaths[slot.index] = deaths
            code, steps = slot.process.exitcode, int(slot.stepped.value)
            if code == NONFINITE_EXIT:
                self.gave_up = self.gave_up or (
                    f"actor {slot.index}: its env returned a non-finite value (the actor's "
                    "error names the env and the step); not restarted"
                )
                continue
            if len(deaths) >= RESTART_LIMIT:
                self.gave_up = self.gave_up or (
                    f"actor {slot.index} died {len(deaths)} times within "
                    f"{RESTART_WINDOW_S:.0f} s (last exit code {code}, after {steps} steps) and "
                    "is not restarted again: its env fails at once (the actor's error is logged "
                    "above)"
                )
                logger.error("%s", self.gave_up)
                continue
            delay = min(BACKOFF_S[0] * 2 ** (len(deaths) - 1), BACKOFF_S[1])
            logger.warning(
                "actor %s died (exit code %s) after %d steps; restarting in %.1f s",
                slot.key,
                code,
                steps,
                delay,
            )
            self._pending[slot.index] = (now + delay, slot.cfg)
        if ep is not None:
            for index, (due, cfg) in sorted(self._pending.items()):
                if now >= due:
                    del self._pending[index]
                    self.restarts += 1
                    self.slots.append(self._start(cfg, ep, index))
            self.slots.sort(key=lambda s: s.index)
        for slot in list(self.leaving):
            if self._handed_over(slot, now):
                slot.successor = None
                slot.stop.set()
                slot.leave_by = now + LEAVE_TIMEOUT_S
            if slot.process.is_alive() and time.monotonic() < (slot.leave_by or 0):
                continue
            if slot.process.is_alive():
                logger.error("actor %s did not stop in time; killing it", slot.key)
                slot.process.kill()
                slot.process.join()
            self._end(slot, died=slot.process.exitcode != 0)
            self.leaving.remove(slot)

    def sampled_steps(self) -> int:
        """Every env step of every incarnation so far."""
        running = sum(int(s.stepped.value) for s in self.slots + self.leaving)
        return sum(self.ended.stepped.values()) + running

    def drain(self, wait: Callable[[], None], timeout_s: float) -> None:
        """Stops every actor and waits (calling ``wait`` meanwhile) until all have exited;
        kills those still running after ``timeout_s``."""
        for slot in self.slots:
            self._leave(slot)
        self.slots = []
        self._pending.clear()  # a slot waiting to restart is not restarted now
        deadline = time.monotonic() + timeout_s
        for slot in self.leaving:
            slot.successor = None  # a replaced actor stepping on stops now too
            slot.stop.set()
            slot.leave_by = min(slot.leave_by or deadline, deadline)
        while self.leaving:
            self.check(None)  # no slots left to restart
            if self.leaving:
                wait()

    def hold_leaving(self, until: float) -> None:
        """Lets the actors told to stop run until ``until`` (``time.monotonic()``) at least,
        where their deadline was sooner: a drain that still trains waits for their receipts."""
        for slot in self.leaving:
            if slot.stop.is_set() and slot.leave_by is not None:
                slot.leave_by = max(slot.leave_by, until)

    def close_launcher(self) -> dict[str, Any] | None:
        """Ends a remote launcher (after every actor has ended); returns its per-node energy
        document, or None without one."""
        launcher, self.launcher = self.launcher, None
        return launcher.close() if launcher is not None else None

    def kill_all(self) -> None:
        procs = [s.process for s in self.slots + self.leaving]
        for slot in self.slots + self.leaving:
            slot.stop.set()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=5)
