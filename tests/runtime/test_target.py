"""``runtime.target``: the target's figures add the sizing's probes to the run's own, and keep
the earlier runs' apart."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.target import RunTotals, TargetReturn
from runtime.telemetry import RETURN_WINDOW


def _telemetry(mean: float, steps: int) -> SimpleNamespace:
    return SimpleNamespace(returns=[mean] * RETURN_WINDOW, return_mean=mean, trained_steps=steps)


def test_the_sizings_seconds_and_joules_are_counted_in_the_target_and_said():
    before = RunTotals()
    before.add_sizing(30.5, 4_200.0)
    target = TargetReturn(450.0, before)
    assert not target.check(_telemetry(300.0, 10_000), 12.0, lambda: 1_000.0)
    assert target.check(_telemetry(460.0, 50_000), 40.0, lambda: 9_000.0)
    doc = target.doc()
    assert doc["reached"] and doc["steps"] == 50_000
    assert doc["seconds"] == pytest.approx(70.5) and doc["joules"] == pytest.approx(13_200.0)
    assert doc["sizing"]["seconds"] == 30.5 and doc["sizing"]["joules"] == 4_200.0
    assert "earlier_runs" not in doc
    # saved with a checkpoint, the totals carry the probes on to the runs after
    assert before.through(40.0, 9_000.0) == {"seconds": 70.5, "joules": 13_200.0}


def test_earlier_runs_are_reported_without_this_runs_sizing():
    before = RunTotals(100_000, {"seconds": 200.0, "joules": 50_000.0})
    before.add_sizing(0.2, 30.0)  # probes read from the cache: little
    target = TargetReturn(450.0, before)
    assert target.check(_telemetry(500.0, 20_000), 10.0, lambda: 2_000.0)
    doc = target.doc()
    assert doc["steps"] == 120_000
    assert doc["joules"] == pytest.approx(52_030.0) and doc["seconds"] == pytest.approx(210.2)
    assert doc["earlier_runs"]["joules"] == pytest.approx(50_000.0)
    assert doc["earlier_runs"]["seconds"] == pytest.approx(200.0)
    # without a sizing (explicit flags) nothing is added and nothing said
    plain = TargetReturn(450.0, RunTotals())
    assert plain.check(_telemetry(500.0, 20_000), 10.0, lambda: 2_000.0)
    assert "sizing" not in plain.doc() and plain.doc()["joules"] == 2_000.0


def test_a_killed_earlier_run_leaves_this_runs_figures_with_its_sizing():
    before = RunTotals(100_000, None)  # the earlier runs' seconds and joules were not saved
    before.add_sizing(5.0, 500.0)
    target = TargetReturn(450.0, before)
    assert target.check(_telemetry(500.0, 20_000), 10.0, lambda: 2_000.0)
    doc = target.doc()
    assert doc["joules"] == pytest.approx(2_500.0) and doc["seconds"] == pytest.approx(15.0)
    assert doc["earlier_runs"]["joules"] is None and "not saved" in doc["earlier_runs"]["note"]
    assert before.through(10.0, 2_000.0) is None  # unknown stays unknown


def test_an_unmet_target_says_what_the_run_spent_without_getting_there():
    before = RunTotals()
    before.add_sizing(30.0, 6_000.0)
    target = TargetReturn(1_000.0, before)
    assert not target.check(_telemetry(816.0, 5_000_000), 180.0, lambda: 50_000.0)
    doc = target.doc((5_100_000, 185.0, 53_600.0))
    assert not doc["reached"] and doc["best_return"] == 816.0
    assert doc["spent"] == {"steps": 5_100_000, "seconds": 215.0, "joules": 59_600.0}
    assert "spent" not in target.doc()  # the end's figures not given: nothing made up
    met = TargetReturn(450.0, RunTotals())
    assert met.check(_telemetry(500.0, 20_000), 10.0, lambda: 2_000.0)
    assert "spent" not in met.doc((30_000, 14.0, 3_000.0))  # a met target has its own figures
