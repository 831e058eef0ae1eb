"""What a change costs the online tuner, measured: each trial records how its change applied
and how long it took from being applied to its window's start, and the model sampler scores
its next plans with this study's own costs (``tuner_rules.change_kind``, ``change_costs``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autotune.tuning.tuner_rules import CHANGE_COST_S, change_costs, change_kind
from bench import tuner_sim

APPLIES = {"actors": "respawn", "envs_per_actor": "respawn", "batch_size": "live"}
APPLIES |= {"mps_pct": "handover"}
START = {"actors": 8, "envs_per_actor": 16, "batch_size": 4096, "mps_pct": 50}


@pytest.mark.parametrize(
    ("moved", "kind"),
    [
        ({}, None),
        ({"batch_size": 8192}, "live"),
        ({"actors": 9, "batch_size": 8192}, "actors"),
        ({"envs_per_actor": 32, "batch_size": 8192}, "respawn"),
        ({"envs_per_actor": 32, "mps_pct": 25, "actors": 9}, "handover"),
    ],
)
def test_a_change_applies_the_costliest_way_of_the_knobs_it_moves(moved, kind):
    assert change_kind(APPLIES, START, {**START, **moved}) == kind


def test_the_first_config_is_no_change():
    assert change_kind(APPLIES, {}, START) is None


def _trial(change):
    return SimpleNamespace(user_attrs={} if change is None else {"change": change})


def test_costs_are_nominal_until_measured_then_the_median_of_each_kind():
    assert change_costs([]) == CHANGE_COST_S
    trials = [_trial({"kind": "handover", "s": s}) for s in (9.0, 7.5, 30.0)]
    trials += [_trial({"kind": "live", "s": 0.4}), _trial(None), _trial({"kind": "x", "s": 1})]
    trials += [_trial({"kind": "respawn", "s": "soon"}), _trial("handover")]  # malformed: left
    costs = change_costs(trials)
    assert costs == {**CHANGE_COST_S, "handover": 9.0, "live": 0.4}


def test_the_tuner_records_each_change_and_the_sampler_plans_with_what_they_cost():
    tuner, _ = tuner_sim.tune("model", seed=0, windows=12)
    done = [t for t in tuner.study.trials if t.state.name == "COMPLETE"]
    changes = [t.user_attrs["change"] for t in done if "change" in t.user_attrs]
    assert changes, "no trial recorded its change"
    warmup = tuner.settings.warmup_s
    for c in changes:
        assert c["kind"] in CHANGE_COST_S and c["s"] >= 0.0
        # the simulated job takes a change at once (seen a tick or two later): processes
        # started then warm up, live settings do not
        assert (
            c["s"] >= warmup if c["kind"] in ("respawn", "handover", "actors") else c["s"] < warmup
        )
    assert tuner.study.sampler.costs == change_costs(done[:-1]) or (
        tuner.study.sampler.costs == change_costs(done)
    )
    measured = {c["kind"] for c in changes}
    assert any(tuner.study.sampler.costs[k] != CHANGE_COST_S[k] for k in measured - {"live"})
