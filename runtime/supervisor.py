"""The runner's watch over its service processes: a dead compressor, migrator, trainer GMI or
inference GMI is replaced and the run goes on.

The compressor and the migrator hold only experience in flight, so they are replaced together
(one dying leaves the other with half-routed chunks): the survivor is killed, both start again
on the same endpoints, every actor is replaced by a new incarnation (each was waiting for
receipts of what went to the old services), and the trainers get a COMMAND ``reset``: they drop
chunks that will never complete and grant their credits to the new migrator. The runner resends
``reset`` until every current trainer reports it. Whatever the old processes held is lost, and
the run's accounting stays exact: with a replacement, ``lost_steps`` is what was sampled and
neither trained nor discarded once the drain is done.

A trainer GMI that dies takes its generation with it: every trainer process is killed, and a
new generation starts from the learner state kept that has come furthest
(``runtime.gmi.fleet.GMIFleet.restart``: the lead GMI's recovery state, kept every
``runtime.trainer.RECOVERY_S``, a hand-over file, the run's checkpoint, or the state the run
started from), with the pipeline replaced as above. What the old generation trained beyond
that state is lost to the learner: those steps are rolled back
(``runtime.telemetry.RunTelemetry.roll_back``), no longer counted as learned, and the
replacement's entry says from which state the new generation went on and how many steps were
rolled back. The new actors act with the version-0 weights until the new
generation publishes, so every actor takes its weights, whatever version they carry. With
``inference='gmi'`` the inference GMI is replaced too (it would hold newer weights than the
recovered ones), and an inference GMI that dies is replaced with the pipeline and the actors
(each was waiting for its answers); the new one takes the trainer's next weights.

A compressor, migrator or trainer GMI silent for ``STALL_KILL_S`` (it reports every 0.5 s; a
stall is reported at ``runtime.telemetry.STALL_S``) that used less than a second of CPU since
its stall began is stuck (stopped, deadlocked; not a trainer in a long update): it is killed,
and replaced as a dead one is. Its stall entry in the result says so (``killed``).

Replacements back off (``BACKOFF_S``: 0.1 s, doubling with each death in ``WINDOW_S``, at most
10 s) and are limited: the ``LIMIT``-th death within ``WINDOW_S`` ends the run with an error
(``RunError``), whose result is marked failed with the reason and the counts so far. A process
that exits with code 0 is not a death (its final report is on its way).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime import commands, topology
from runtime.inference import NAME as INFERENCE
from runtime.services import PIPELINE, RunError
from runtime.stages.compressor import compressor_main
from runtime.stages.migrator import migrator_main

logger = logging.getLogger(__name__)

WINDOW_S = 60.0
LIMIT = 5
"""Deaths of replaceable processes (any of them) within ``WINDOW_S`` that end the run."""
BACKOFF_S = (0.1, 10.0)
STALL_KILL_S = 120.0
"""A replaceable process silent this long is killed and replaced."""
RESET_RESEND_S = 0.5
BUSY_MAX_S = 60.0
"""How long after a replacement the run waits for the trainers' reset acknowledgements before
its step target and wall limit apply again."""
CHUNK_ID_STRIDE = 1 << 40
"""Each compressor numbers its chunks from its replacement count times this, so ids keep
increasing across replacements (and its migrator refuses any below)."""


@dataclass
class Supervisor:
    """Watches the services of one run (see the module docstring).

    Attributes:
        services: The run's ``runtime.services.Services``.
        actors: Its ``runtime.actor_pool.ActorPool``.
        telemetry: Its ``runtime.telemetry.RunTelemetry``.
        generations: Its ``runtime.generations.Generations``: the GMIs (``fleet``; the current
            ones must acknowledge a reset, a new migrator retires every older generation), and
            the phase a restarted generation begins.
        chunk_args: The compressor's chunk settings now, ``(chunk_bytes, chunk_timeout_s)``.
        resumed: The checkpoint the run started from (``runtime.checkpoint.Resume``), or None.
        inference: With ``inference='gmi'``, the inference GMI's process target and arguments
            (set by the runner when it starts it), to start a new one.
    """

    services: Any
    actors: Any
    telemetry: Any
    generations: Any
    chunk_args: Callable[[], tuple[int, float]]
    resumed: Any = None
    inference: tuple[Callable[..., None], tuple[Any, ...]] | None = None
    replacements: list[dict[str, Any]] = field(default_factory=list)
    """One entry per replacement: seconds into the run, the process that died, its exit code;
    for a trainer's, the state the new generation went on from (``resumed_from``: its file,
    version and trained steps, None for a fresh learner) and the ``rolled_back_steps``."""
    failure: str | None = None
    """Why the pipeline is no longer replaced (the run then stops), or None."""
    _deaths: list[float] = field(default_factory=list)
    _due: float | None = None
    _dead: tuple[str, int | None] | None = None
    _reset_epoch: int = 0
    _reset_sent: float = 0.0
    _started: float = field(default_factory=time.monotonic)
    _run_dir: str = ""
    _replaced_at: float = 0.0
    _cpu_at_stall: dict[str, float] = field(default_factory=dict)

    @property
    def fleet(self) -> Any:
        return self.generations.fleet

    def start(self, ep: topology.Endpoints, run_dir: str) -> None:
        """Starts the compressor and the migrator (the first time, or in place of dead ones)."""
        self._run_dir = run_dir
        chunk_bytes, chunk_timeout_s = self.chunk_args()
        first_chunk = len(self.replacements) * CHUNK_ID_STRIDE
        first_inc = self.actors.next_incarnations()  # those ``replace_all`` starts next
        args = (ep, chunk_bytes, chunk_timeout_s, first_chunk, first_inc)
        self.telemetry.expect("compressor")  # watched from now, first report or not
        self.services.spawn("compressor", compressor_main, args)
        gen, trainers = self.fleet.generation, len(self.fleet.names())
        args = (ep, trainers, gen, first_chunk, self._reset_epoch)
        self.telemetry.expect("migrator")
        self.services.spawn("migrator", migrator_main, args)

    def start_inference(self, target: tuple[Any, tuple[Any, ...]] | None = None) -> None:
        """Starts the inference GMI (``target``: its main and arguments, kept for the ones that
        replace it), watched from now, first report or not."""
        if target is not None:
            self.inference = target
        self.telemetry.expect(INFERENCE)
        self.services.spawn(INFERENCE, *self.inference)

    def check(self, ep: topology.Endpoints, command_sock: commands.CommandOut) -> None:
        """Replaces a dead compressor or migrator (after its back-off); resends ``reset``
        until acknowledged.

        Raises:
            RunError: the ``LIMIT``-th death within ``WINDOW_S``.
        """
        self._kill_stuck()
        for name, proc in self.services.items():
            if proc.is_alive() or self.telemetry.is_final(name) or proc.exitcode == 0:
                continue  # a clean exit's final report may still be on its way
            if not self._replaceable(name):
                raise RunError(
                    f"{name} process died (exit code {proc.exitcode})",
                    killed=proc.exitcode is not None and proc.exitcode < 0,
                )
            if self._dead is None:
                self._died(name, proc.exitcode)
            if self.failure is not None:
                raise RunError(self.failure, killed=proc.exitcode is not None and proc.exitcode < 0)
        now = time.monotonic()
        if self._due is not None and now >= self._due:
            self._replace(ep)
        self._send_reset(command_sock, now)

    def _replaceable(self, name: str) -> bool:
        return name in PIPELINE or name == INFERENCE or name.startswith("trainer-")

    def _kill_stuck(self) -> None:
        """Kills a replaceable process silent for ``STALL_KILL_S`` that used less than a second
        of CPU meanwhile: stopped or deadlocked, not busy in a long update."""
        for name, proc in list(self.services.items()):
            stall = self.telemetry.stall(name)
            if stall is None or not proc.is_alive() or not self._replaceable(name):
                self._cpu_at_stall.pop(name, None)
                continue
            used = _cpu_s(proc.pid)
            start = self._cpu_at_stall.setdefault(name, used)
            if stall[1] < STALL_KILL_S or used - start >= 1.0 or self._group_waits(name):
                continue
            logger.error("%s has been silent for %.0f s: killed, to be replaced", name, stall[1])
            stall[0].update(killed=True, silent_s=stall[1])
            proc.kill()
            proc.join(timeout=5)

    def _group_waits(self, name: str) -> bool:
        """Whether ``name`` is a trainer that went silent waiting in its group's agreement
        on the next update while a member of its group still reports: it waits for that
        member's batch, however long that takes (the member, if stuck, is the one killed)."""
        latest = self.telemetry.latest.get(name, {})
        if not (name.startswith("trainer-") and latest.get("group_wait")):
            return False
        gen = latest.get("generation")
        return any(
            other != name
            and self.telemetry.latest.get(other, {}).get("generation") == gen
            and self.telemetry.stall(other) is None
            for other in self.telemetry.trainer_sources()
        )

    @property
    def busy(self) -> bool:
        """A replacement is pending, or not yet acknowledged by every trainer that reports
        (for at most ``BUSY_MAX_S`` after it: a run's step target and wall limit then apply
        again whatever a trainer does)."""
        if self._due is not None:
            return True
        recent = time.monotonic() - self._replaced_at < BUSY_MAX_S
        return recent and self._reset_pending()

    def _died(self, name: str, code: int | None) -> None:
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < WINDOW_S] + [now]
        if len(self._deaths) >= LIMIT:
            self.failure = (
                f"{name} died (exit code {code}) for the {len(self._deaths)}th time within "
                f"{WINDOW_S:.0f} s; the pipeline is not replaced again"
            )
            logger.error("%s", self.failure)
            return
        delay = min(BACKOFF_S[0] * 2 ** (len(self._deaths) - 1), BACKOFF_S[1])
        logger.error(
            "%s died (exit code %s); replacing %sthe compressor and the migrator in %.1f s "
            "(what they held is counted as lost)",
            name,
            code,
            "" if name in PIPELINE else "the trainer GMIs, " if name != INFERENCE else "it, ",
            delay,
        )
        self._dead, self._due = (name, code), now + delay

    def _replace(self, ep: topology.Endpoints) -> None:
        name, code = self._dead or ("?", None)
        self._reset_epoch += 1
        self.fleet.reset_epoch = self._reset_epoch  # GMIs started from now on hold it
        entry = {"t": time.monotonic() - self._started, "process": name, "exit_code": code}
        if name.startswith("trainer-"):  # its whole generation goes, and any retiring
            trainers = [n for n, _ in self.services.items() if n.startswith("trainer-")]
            for service in trainers:
                self.services.stop(service)
            self.telemetry.retire(trainers)  # before the roll-back: no late report counts
            entry.update(self._restart_trainers(ep))
        if self.inference is not None and name != "compressor" and name != "migrator":
            self.services.stop(INFERENCE)  # it died, or holds weights newer than recovered ones
            self.telemetry.replace(INFERENCE)
            self.start_inference()
        for service in PIPELINE:
            self.services.stop(service)
            self.telemetry.replace(service)
        self.replacements.append(entry)
        self.start(ep, self._run_dir)
        self.actors.replace_all(ep)
        self._reset_sent = 0.0
        self._replaced_at = time.monotonic()
        self._dead = self._due = None
        logger.warning(
            "replaced after %s died (%d so far); actors restarted", name, len(self.replacements)
        )

    def _restart_trainers(self, ep: topology.Endpoints) -> dict[str, Any]:
        """Starts a trainer generation in place of the dead one, and rolls back what the
        learner lost: the trained steps beyond the state it goes on from."""
        start = self.resumed
        before = start.trained_steps if start is not None else 0  # the runs' before this one
        saved = self.fleet.restart(ep, self._run_dir, start.state_file if start else None)
        held = max(0, saved.trained_steps - before) if saved is not None else 0
        rolled = self.telemetry.roll_back(held)
        if rolled:
            logger.warning(
                "%d trained steps rolled back: the new trainer generation goes on from a "
                "learner that holds %d of this run's trained steps",
                rolled,
                held,
            )
        self.generations.restarted(self.telemetry.trained_steps)
        resumed = None if saved is None else dataclasses.asdict(saved)
        return {"resumed_from": resumed, "rolled_back_steps": rolled}

    def _reset_pending(self) -> bool:
        """Whether a current trainer that reports has not taken the newest reset (one started
        since holds it from its start, ``GMIRole.reset_epoch``)."""
        if not self._reset_epoch:
            return False
        reports = [self.telemetry.source(t) for t in self.fleet.names()]
        epochs = [r.get("reset_epoch", 0) for r in reports if r]
        return any(not isinstance(e, int) or e < self._reset_epoch for e in epochs)

    def _send_reset(self, command_sock: commands.CommandOut, now: float) -> None:
        if self._reset_pending() and now - self._reset_sent >= RESET_RESEND_S:
            meta = {"cmd": "reset", "epoch": self._reset_epoch}
            command_sock.send(meta)
            self._reset_sent = now


def _cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has used (user and system), 0 where it cannot be read."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return 0.0
    return times.user + times.system
