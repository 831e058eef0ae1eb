"""The runner's view of a run: the newest counters of every process, and episode returns.

Every process sends cumulative counters (``StatsSender``), so keeping the newest report per
source is enough; only episode returns are deltas (each report carries the episodes finished
since the previous one) and are appended here.
"""

from __future__ import annotations

import collections
import logging
import statistics
import time
from typing import Any

from runtime import wire
from runtime.divergence import DivergenceWatch
from runtime.services import PIPELINE

logger = logging.getLogger(__name__)

RETURN_WINDOW = 100
"""``return_mean`` is the mean over the last this-many finished episodes."""
STALL_S = 30.0
"""A running service or trainer silent this long (no telemetry; it reports every 0.5 s) is
reported as stalled (a warning, and the result's ``stalls``)."""
START_S = 10.0
"""How much longer than ``STALL_S`` a stage may take to send its first report (its interpreter
starting, its imports on a loaded machine) before it counts as stalled."""


class RunTelemetry:
    """Aggregates STATS messages into run-level figures."""

    def __init__(self, key: bytes = b"", act_dim: int | None = None) -> None:
        self.key = key
        """The run's key: reports must be signed with it and numbered (``StatsSender``);
        empty: no check (tests that feed the telemetry alone)."""
        self.divergence = DivergenceWatch(act_dim)
        """Whether the run looks like it is diverging (``runtime.divergence``)."""
        self._senders: dict[str, tuple[str, int]] = {}
        """By source: the sender taken (``inst``) and its newest report number."""
        self._gone: set[str] = set()
        """Senders of sources that were replaced: their reports are refused."""
        self._since: dict[str, float] = {}
        """By source started here (``expect``) or replaced: when (monotonic, this host's) its
        newest process was about to start. A report sent before then is an older process's,
        read late, and refused; one that never reports is watched from then."""
        self.latest: dict[str, dict[str, Any]] = {}
        self.returns: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
        self.episodes = 0
        self.malformed = wire.MalformedCounter("runner-telemetry")
        self.seen: dict[str, float] = {}
        """Monotonic time of each source's newest report."""
        self.stalls: list[dict[str, Any]] = []
        """One entry per stall seen: the process, when it fell silent and for how long."""
        self._silent: dict[str, tuple[dict[str, Any], float]] = {}
        self.replaced: dict[str, list[dict[str, Any]]] = {}
        """The last counters of each process that was replaced (it died and a new one took
        its name), by name, oldest first."""
        self.rolled_back_steps = 0
        """Steps the trainers reported trained that trainer restarts rolled back (``roll_back``):
        trained after the state the new generation went on from, so lost to the learner."""
        self._not_held = 0
        """Of ``trained_steps``, how many the learner does not hold since the last restart."""
        self._retired: set[str] = set()
        """Sources stopped for good (``retire``): their reports still on the way are ignored."""

    def handle(self, msg: wire.Message) -> None:
        """Takes one STATS message."""
        if msg.type is not wire.MsgType.STATS:
            raise wire.ProtocolError(f"telemetry takes stats messages, got {msg.type.value}")
        source, counters = msg.meta.get("src"), msg.meta.get("c")
        if not isinstance(source, str) or not isinstance(counters, dict):
            raise wire.ProtocolError("stats message needs 'src' (str) and 'c' (map)")
        if source in self._retired:
            return
        if self.key:
            self._check_sender(source, msg)
        episodes = counters.pop("episodes", None) or []
        if not isinstance(episodes, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(x, int | float) for x in e)
            for e in episodes
        ):
            raise wire.ProtocolError(f"stats from {source}: 'episodes' must be [[return, length]]")
        if not all(
            isinstance(v, int | float | str | bool | dict | list | None) for v in counters.values()
        ):
            raise wire.ProtocolError(f"stats from {source}: counters must be plain values")
        for ret, _length in episodes:
            self.returns.append(float(ret))
            self.episodes += 1
        self.latest[source] = counters
        self.seen[source] = time.monotonic()
        if episodes or source.startswith("trainer-"):
            lead = self.lead_trainer()
            version = lead.get("version")
            updates = version if type(version) is int else None
            spread = None  # the returns' spread, where the watch takes its starting level
            if self.divergence.first_return is None and len(self.returns) >= 2:
                spread = statistics.pstdev(self.returns)
            self.divergence.check(
                self.episodes, self.return_mean, lead.get("entropy"), updates, spread
            )

    def _check_sender(self, source: str, msg: wire.Message) -> None:
        """Refuses a report not signed with the run's key, one from a sender other than the
        one taken for ``source`` (the first to report, or the first after a replacement), and
        one numbered at or below that sender's newest (sent again). A report sent before its
        source was replaced is the old process's (queued while the runner was busy replacing),
        even where none of that process's reports had been read yet: its sender is not taken."""
        wire.check_signed(self.key, msg)
        inst, n = msg.meta.get("inst"), wire.meta_int(msg.meta, "n")
        sent = msg.meta.get("mono")
        since = self._since.get(source)
        if since is not None and not (isinstance(sent, int | float) and sent >= since):
            if isinstance(inst, str):
                self._gone.add(inst)
            raise wire.ProtocolError(f"stats for {source!r} sent before it was replaced")
        if not isinstance(inst, str) or inst in self._gone:
            raise wire.ProtocolError(f"stats for {source!r} from a process no longer running")
        taken, last = self._senders.get(source, (inst, -1))
        if inst != taken:
            raise wire.ProtocolError(f"stats for {source!r} from another process than its own")
        if n <= last:
            raise wire.ProtocolError(f"stats {n} for {source!r} after its {last}: sent again")
        self._senders[source] = (inst, n)

    def replace(self, name: str) -> None:
        """``name`` died and a new process takes its name: the dead one's sender is refused
        from now on, and the new one is expected (``expect``)."""
        if name in self._senders:
            self._gone.add(self._senders.pop(name)[0])
        self.expect(name)

    def expect(self, name: str) -> None:
        """A process is about to start as ``name`` (call it before the spawn): it is watched
        from now even before its first report, a report sent before now is refused, and the
        name's last counters, an earlier process's, move to ``replaced`` (the new one starts
        from nothing). Calling it again before the spawn only moves ``now`` on."""
        self._since[name] = time.monotonic()
        if name in self.latest:
            self.replaced.setdefault(name, []).append(self.latest.pop(name))
        self.seen.pop(name, None)
        self._silent.pop(name, None)

    def retire(self, names: list[str]) -> None:
        """``names`` were stopped for good (a trainer generation restarted from a saved state,
        ``runtime.supervisor``): their last counters stand, and a report of theirs still on its
        way is ignored. Taken after the restart's ``roll_back``, it would count steps as
        learned that the new generation's learner does not hold."""
        self._retired.update(names)

    def total(self, name: str, key: str) -> int:
        """One integer counter of ``name`` summed over it and every process it replaced."""
        return int(self.total_float(name, key))

    def total_float(self, name: str, key: str) -> float:
        """One counter of ``name`` (a count, or seconds) summed over it and every process it
        replaced; a non-number counts as 0."""
        sources = [*self.replaced.get(name, []), self.source(name)]
        values = (c.get(key, 0) for c in sources)
        return sum(float(v) if isinstance(v, int | float) else 0.0 for v in values)

    def source(self, name: str) -> dict[str, Any]:
        """Newest counters of one source (empty if it never reported)."""
        return self.latest.get(name, {})

    def is_final(self, name: str) -> bool:
        """Whether ``name`` sent its final report (after its drain)."""
        return bool(self.source(name).get("final"))

    def watch(self, names: list[str], now: float | None = None) -> None:
        """Reports each of ``names`` (running processes that report) that has been silent for
        ``STALL_S``, once per stall, and notes when it reports again. A process started as
        ``expect`` says (a stage, or any replacement) that has not reported yet is silent since
        then, and stalled after ``START_S`` more (it may still be starting); others (a trainer
        GMI, which reports once its learner is built) are watched from their first report."""
        now = time.monotonic() if now is None else now
        for name in names:
            last = self.seen.get(name)
            if name in self._silent:
                stall, since = self._silent[name]
                back = last is not None and last > since
                stall["silent_s"] = (last if back else now) - since
                if back:
                    del self._silent[name]
                    logger.warning("%s reports again after %.0f s", name, stall["silent_s"])
                continue
            quiet_from, allowed = last, STALL_S
            if last is None:
                quiet_from, allowed = self._since.get(name), STALL_S + START_S
            if quiet_from is not None and now - quiet_from >= allowed:
                stall = {"process": name, "silent_s": now - quiet_from}
                self._silent[name] = (stall, quiet_from)
                self.stalls.append(stall)
                logger.warning(
                    "%s has sent nothing for %.0f s: it is stopped or stuck (SIGSTOP, a "
                    "debugger, swapping); the run waits for it",
                    name,
                    now - quiet_from,
                )

    def stall(self, name: str) -> tuple[dict[str, Any], float] | None:
        """``name``'s stall going on now (its ``stalls`` entry and how long it has been
        silent), or None."""
        if name not in self._silent:
            return None
        entry, since = self._silent[name]
        return entry, time.monotonic() - since

    def fatal(self) -> str | None:
        """The first reason a process gave for stopping the run (a non-finite value), or None."""
        for counters in self.latest.values():
            if isinstance(counters.get("fatal"), str):
                return counters["fatal"]
        return None

    def actor_sources(self) -> list[str]:
        return [s for s in self.latest if s.startswith("actor-")]

    def trainer_sources(self) -> list[str]:
        return [s for s in self.latest if s.startswith("trainer-")]

    def lead_trainer(self) -> dict[str, Any]:
        """The newest counters of the trainer that reported last (empty before any): after a
        hand-over the retired GMI's last report stays in ``latest``, the new one's is newer."""
        trainers = self.trainer_sources()
        if not trainers:
            return {}
        return self.latest[max(trainers, key=lambda s: self.seen.get(s, float("-inf")))]

    def sum_over(self, sources: list[str], key: str) -> int:
        """Sum of one integer counter over sources (a non-number counts as 0)."""
        values = (self.latest[s].get(key, 0) for s in sources)
        return sum(int(v) for v in values if isinstance(v, int | float))

    @property
    def trained_steps(self) -> int:
        return self.sum_over(self.trainer_sources(), "trained_steps")

    @property
    def learned_steps(self) -> int:
        """The trained steps the learner holds: ``trained_steps`` (every step the trainers
        reported trained, a throughput figure) less those trainer restarts rolled back. What
        counts toward the run's ``steps``, and the result's ``env_steps``."""
        return self.trained_steps - self._not_held

    def roll_back(self, held: int) -> int:
        """A trainer generation was restarted from a state that holds ``held`` of this run's
        trained steps: the steps counted as learned beyond them are rolled back (added to
        ``rolled_back_steps`` and returned), and ``learned_steps`` goes on from ``held``.

        A state may hold steps its trainer trained but had not reported yet (it reports every
        0.5 s): they count as learned from now on, and nothing is rolled back."""
        rolled = self.learned_steps - held
        self._not_held = self.trained_steps - held
        if rolled < 0:
            logger.info("the state restarted from holds %d trained steps not reported", -rolled)
        self.rolled_back_steps += max(0, rolled)
        return max(0, rolled)

    @property
    def discarded_steps(self) -> int:
        return self.sum_over(self.trainer_sources(), "discarded_steps")

    @property
    def return_mean(self) -> float | None:
        return sum(self.returns) / len(self.returns) if self.returns else None

    def policy_lag(self) -> tuple[float, int]:
        """(mean over trained steps, max) across trainers."""
        trainers = self.trainer_sources()
        steps = self.sum_over(trainers, "trained_steps")
        if not steps:
            return 0.0, 0
        total = sum(
            self.latest[t].get("policy_lag_mean", 0.0) * self.latest[t].get("trained_steps", 0)
            for t in trainers
        )
        return total / steps, max(int(self.latest[t].get("policy_lag_max", 0)) for t in trainers)

    def stages(self) -> dict[str, dict[str, int]]:
        """Messages and payload bytes each of the four stages handled."""
        actors, trainers = self.actor_sources(), self.trainer_sources()
        pick = {"messages", "bytes"}
        return {
            "dispenser": {k: self.sum_over(actors, k) for k in pick},
            "compressor": {k: self.total("compressor", k) for k in pick},
            "migrator": {k: self.total("migrator", k) for k in pick},
            "batcher": {k: self.sum_over(trainers, k) for k in pick},
        }

    def service_cpu_s(self) -> dict[str, float]:
        """CPU seconds (every thread) of the compressor and the migrator processes, each summed
        over the processes that held its name (the dispenser runs in the actors, the batcher
        in the trainer GMIs: their CPU is theirs)."""
        return {name: round(self.total_float(name, "cpu_s"), 2) for name in PIPELINE}
