"""Holding the best config once exploring is over (the ``OnlineTuner``'s side; mixed in).

The best is the config with the best median among those whose newest window met the constraints
and that never failed for good (``History.best``). It is applied once, then measured again every
``recheck_s``. Exploring starts again (``repeat_every`` more trials) when a recheck finds it
drifted below its earlier median by more than ``drift_tol``, or breaking a constraint (it is then
not the best until a window of it meets them again). Where the best changes while held (it
failed, or a recheck dropped it), the new best is applied at once. A resumed study whose trials
all failed or were cut has measured nothing: it explores its trial budget again, once, before it
gives up.
"""

from __future__ import annotations

import json
import logging
import statistics
from typing import Any

logger = logging.getLogger(__name__)


class Holding:
    """Mixed into ``OnlineTuner``: ``_hold`` and ``_recheck``."""

    held: str | None = None
    """The key of the config applied as the best (None: none applied yet)."""
    restored = 0
    """The trials a resumed study held when the tuner opened it."""
    _explored_again = False

    def _hold(self: Any, now: float) -> None:
        """Holds the best config; re-measures it every ``recheck_s``."""
        best = self.history.best()
        if best is None:
            blind = self.restored and not self.history.speed and not self.log
            if blind and not self._explored_again:  # a resumed study that measured nothing
                self._explored_again = True
                self.holding = False
                self.explore_until = self.trials_done + self.settings.trials
                logger.warning("no config of the study was measured; exploring again")
            elif self.unmet is None:
                self._give_up()
            return
        last = self.t0 + self.log[-1]["t"] if self.log else now
        if not self.holding or best[0] != self.held or now - last >= self.settings.recheck_s:
            self.holding, self.held = True, best[0]
            self._start(None, self._inside(json.loads(best[0])), now)

    def _recheck(self: Any, key: str, feasible: bool, best_before: tuple | None) -> None:
        """After a window of the held best (``key``): explores again where it drifted down or
        broke a constraint."""
        if not best_before or best_before[0] != key:
            return
        values = self.history.values(key)
        if not feasible:
            why = "broke a constraint"
        elif len(values) > 1 and values[-1] < statistics.median(values[:-1]) * (
            1 - self.settings.drift_tol
        ):  # this window against the earlier ones, each rated alike
            why = f"drifted ({values[-1]:.3g} vs median {statistics.median(values[:-1]):.3g})"
        else:
            return
        logger.warning("the best config %s; exploring again", why)
        self.holding = False
        self.explore_until = self.trials_done + self.settings.repeat_every
