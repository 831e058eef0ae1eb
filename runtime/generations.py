"""The trainer GMI generations of a run: every change of GMIs, and the phase each one opens.

Every change of trainer GMIs goes through ``Generations.replace``, whoever asks for it: a
planned percentage change (``mps_changes``, due some seconds into the run), one asked for with
``Runner.request_replace`` (queued until the next tick), or a GMI setting changed with
``Runner.reconfigure`` (``runtime.live``: applied with the rest of that change). ``replace``
starts the next generation (``runtime.gmi.fleet``: an MPS client's percentage is fixed for its
life, so new GMIs take the learner state over from the old ones, and nothing is dropped) and
begins its phase, with its own energy window (``runtime.phases``).
"""

from __future__ import annotations

from typing import Any

from runtime import commands, topology
from runtime.config import TrainConfig
from runtime.gmi.fleet import GMIFleet
from runtime.phases import PhaseLog

MPSChange = tuple[float, tuple[int, ...] | None]
"""``(seconds into the run, percentages or None)``: a planned GMI replacement."""


class Generations:
    """The runner's GMI changes (see the module docstring).

    Args:
        fleet: The run's GMIs.
        mps_changes: Planned replacements, in any order; None percentages keep the current ones.

    Raises:
        ValueError: a planned percentage does not fit the GMIs (checked now, not mid-run).
    """

    def __init__(self, fleet: GMIFleet, mps_changes: list[MPSChange] | None = None) -> None:
        self.fleet = fleet
        self.planned = sorted(mps_changes or [], key=lambda change: change[0])
        for _, pct in self.planned:
            fleet.check(pct)
        self.requested: list[tuple[int, ...] | None] = []
        """Replacements asked for since the last tick (their percentages, None: the same)."""
        self.phases: PhaseLog | None = None
        self._due: list[MPSChange] = []
        self._where: tuple[topology.Endpoints, str, commands.CommandOut] | None = None

    @property
    def mps_later(self) -> bool:
        """Whether a planned change sets percentages (MPS must then run from the start)."""
        return any(pct is not None for _, pct in self.planned)

    def begin(
        self,
        ep: topology.Endpoints,
        run_dir: str,
        command_sock: commands.CommandOut,
        meter: Any,
        started: float,
    ) -> None:
        """Starts the run's bookkeeping: generation 0's phase opens, the planned changes are due
        from ``started`` (``time.monotonic()``)."""
        self._where = (ep, run_dir, command_sock)
        self._due = list(self.planned)
        self.phases = PhaseLog(meter, started)
        self.phases.begin(0, self._mps_pcts(), 0)

    def check(self, cfg: TrainConfig) -> None:
        """Raises ValueError if the GMIs of ``cfg`` (a live change's) do not fit, or if a
        change still to come, planned or requested, would not fit them: such a live change is
        refused now instead of failing the run when that change comes."""
        self.fleet.check(None, cfg)
        started = self.phases is not None
        for pct in [p for _, p in (self._due if started else self.planned)] + self.requested:
            if pct is not None:
                self.fleet.check(pct, cfg)

    def request(self, mps_pct: tuple[int, ...] | None = None) -> None:
        """Queues a replacement for the next tick.

        Raises:
            ValueError: if ``mps_pct`` does not fit the GMIs (checked now, not mid-run).
        """
        self.fleet.check(mps_pct)
        self.requested.append(mps_pct)

    def replace_due(self, elapsed_s: float, trained: int) -> None:
        """Makes the changes due at a tick ``elapsed_s`` into the run: every queued request,
        in order, then the next planned one if its time has come (at most one a tick)."""
        if self._due and elapsed_s >= self._due[0][0]:
            self.requested.append(self._due.pop(0)[1])
        while self.requested:
            self.replace(trained, self.requested.pop(0))

    def replace(
        self,
        trained: int,
        mps_pct: tuple[int, ...] | None = None,
        cfg: TrainConfig | None = None,
    ) -> None:
        """Replaces every GMI by a new generation and begins its phase.

        Args:
            trained: Steps trained so far (where the old phase ends).
            mps_pct: New percentages (None: the same, or ``cfg``'s).
            cfg: A new configuration for the GMIs (``reconfigure``, already checked).
        """
        assert self._where is not None and self.phases is not None, "begin() first"
        ep, run_dir, command_sock = self._where
        self.fleet.replace(ep, run_dir, command_sock, mps_pct, cfg)
        self.phases.begin(self.fleet.generation, self._mps_pcts(), trained)

    def restarted(self, trained: int) -> None:
        """The supervisor started a generation in place of one that died
        (``runtime.supervisor``): its phase begins."""
        if self.phases is not None:
            self.phases.begin(self.fleet.generation, self._mps_pcts(), trained)

    def end(self, trained: int) -> None:
        """Ends the last phase at the end of the run."""
        if self.phases is not None:
            self.phases.end(trained)

    def _mps_pcts(self) -> list[int | None]:
        return [s.mps_pct for s in self.fleet.gmis]
