"""Every GMI change of a run goes through ``Generations.replace`` (no processes: a fake fleet)."""

from __future__ import annotations

import pytest

from runtime.generations import Generations


class FakeFleet:
    """Records replacements; percentages above 100 do not fit."""

    def __init__(self) -> None:
        self.generation = 0
        self.pct: tuple[int, ...] | None = None
        self.replaced: list[tuple[tuple[int, ...] | None, object]] = []

    @property
    def gmis(self) -> list:
        return [type("Spec", (), {"mps_pct": self.pct[0] if self.pct else None})()]

    def check(self, mps_pct, cfg=None) -> None:
        if mps_pct is not None and max(mps_pct) > 100:
            raise ValueError(f"{mps_pct} does not fit")

    def replace(self, ep, run_dir, command_sock, mps_pct, cfg=None) -> None:
        assert (ep, run_dir, command_sock) == ("ep", "dir", "sock")
        self.generation += 1
        self.pct = mps_pct if mps_pct is not None else self.pct
        self.replaced.append((mps_pct, cfg))


class FakeMeter:
    def begin_window(self, name: str) -> None:
        pass

    def end_window(self, name: str) -> None:
        raise ValueError(name)  # no energy: the phase keeps None


def test_planned_requested_and_reconfigured_changes_all_replace_and_open_phases():
    fleet = FakeFleet()
    gens = Generations(fleet, [(5.0, (30,)), (1.0, None)])  # in any order
    assert gens.mps_later
    gens.begin("ep", "dir", "sock", FakeMeter(), started=0.0)
    gens.replace_due(0.5, trained=0)
    assert fleet.replaced == []
    gens.request((50,))
    gens.replace_due(6.0, trained=100)  # the requests, then one planned change a tick
    assert fleet.replaced == [((50,), None), (None, None)]
    gens.replace_due(6.1, trained=150)
    gens.replace(200, cfg="new cfg")
    gens.end(300)
    assert fleet.replaced[2:] == [((30,), None), (None, "new cfg")]
    phases = gens.phases.to_list()
    assert [p["generation"] for p in phases] == [0, 1, 2, 3, 4]
    assert [p["mps_pct"] for p in phases] == [[None], [50], [50], [30], [30]]
    assert [p["trained_steps"] for p in phases] == [100, 0, 50, 50, 100]


def test_a_change_that_does_not_fit_is_refused_when_asked_for():
    fleet = FakeFleet()
    with pytest.raises(ValueError, match="does not fit"):
        Generations(fleet, [(1.0, (101,))])
    gens = Generations(fleet)
    assert not gens.mps_later
    with pytest.raises(ValueError, match="does not fit"):
        gens.request((150,))
    assert gens.requested == []


def test_a_live_change_that_a_change_still_to_come_would_not_fit_is_refused(monkeypatch):
    """Two cuda GMIs with a planned change to 30 % and 70 %: a live change to one GMI, or to
    CPU GMIs, fits now but would make that change fail the run when it comes, so it is refused
    when asked for; so is one that a queued request would not fit."""
    import dataclasses

    import torch

    from runtime.config import TrainConfig
    from runtime.gmi.fleet import GMIFleet

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # placement checks counts
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = TrainConfig(trainer_device="cuda", trainers=2)
    fleet = GMIFleet(cfg, info=None, spawn=lambda *args: None)
    gens = Generations(fleet, [(10.0, (30, 70))])
    one, cpu = (dataclasses.replace(cfg, **c) for c in ({"trainers": 1}, {"trainer_device": "cpu"}))
    for new in (one, cpu):
        fleet.check(None, new)  # the change itself fits
        with pytest.raises(ValueError, match="MPS percentages"):
            gens.check(new)
    gens.check(dataclasses.replace(cfg, batch_size=cfg.batch_size * 2))  # unaffected: taken
    gens.planned, gens._due = [], []  # the planned change made: a request queued instead
    gens.request((40, 60))
    with pytest.raises(ValueError, match="MPS percentages"):
        gens.check(one)
    gens.requested = []
    gens.check(one)  # nothing to come: the change is taken
