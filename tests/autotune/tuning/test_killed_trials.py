"""A study trial whose run is killed from outside runs its config once more before the
config counts as unrunnable."""

from __future__ import annotations

import pytest
from test_offline_study import FakeRuns, _study

from runtime.config import TrainConfig


class KilledRuns(FakeRuns):
    """FakeRuns whose actors=2 runs are killed from outside (SIGKILL of a service), the first
    ``kills`` times."""

    def __init__(self, kills: int):
        super().__init__()
        self.kills, self.killed = kills, 0

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        from runtime.runner import RunError

        if cfg.actors == 2 and self.killed < self.kills:
            self.killed += 1
            raise RunError("trainer-0 process died (exit code -9)", killed=True)
        return super().__call__(cfg, warmup_s, meter)


@pytest.mark.parametrize("kills", [1, 2])
def test_a_killed_trials_config_runs_once_more_before_it_counts_as_unrunnable(tmp_path, kills):
    runs = KilledRuns(kills)
    offline = _study(tmp_path, runs)
    rows = []
    while runs.killed < kills or len(rows) < 30:
        rows.append(offline.step())
        assert len(rows) < 200
    killed = [i for i, r in enumerate(rows) if r.error and "exit code -9" in r.error]
    assert len(killed) == kills
    retry = rows[killed[0] + 1]  # the killed config is the very next trial
    assert retry.values == rows[killed[0]].values
    two = [c for c in runs.ran if c.actors == 2]
    if kills == 1:
        assert retry.error is None and two  # measured the second time
    else:
        # killed twice: unrunnable now, never run again
        assert all(c.actors != 2 or c.batch_size != retry.values["batch_size"] for c in two)
        again = [r for r in rows[killed[1] + 1 :] if r.values == retry.values]
        assert all(r.error == "skipped: failed before" for r in again)
