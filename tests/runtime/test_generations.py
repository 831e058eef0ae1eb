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
