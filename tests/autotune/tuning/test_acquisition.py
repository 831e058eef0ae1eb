"""The model sampler's acquisition (``autotune.tuning.acquisition``): a trial is worth its
expected improvement only net of what it is expected to give up while it runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from autotune.tuning.acquisition import expected_improvement, net_gain
from autotune.tuning.knobs import Knob
from autotune.tuning.model_inputs import machine_from_doc
from autotune.tuning.model_sampler import sampler_for
from autotune.tuning.settings import TunerSettings

RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"
H, W = 60.0, 10.0


def test_a_config_predicted_below_the_incumbent_is_tried_only_where_the_model_is_unsure():
    gap = math.log(0.91)  # predicted at 0.91 of the incumbent
    mu, cost = np.array([gap, gap]), np.array([15.0, 15.0])
    sure, unsure = net_gain(mu, np.array([0.155, 0.5]), 0.0, cost, H, W)
    assert sure < 0 < unsure
    # plain EI would have rated both worth a try (the old score: EI x H / (H + cost))
    assert (expected_improvement(mu, np.array([0.155, 0.5]), 0.0) * H / (H + 15.0) > 0.01).all()


def test_a_config_predicted_above_it_keeps_nearly_all_of_its_expected_improvement():
    mu, sd, cost = np.array([math.log(1.2)]), np.array([0.05]), np.array([0.0])
    gain = net_gain(mu, sd, 0.0, cost, H, W)[0]
    assert gain == pytest.approx(math.log(1.2), rel=1e-3)
    # a change that costs seconds is worth less than the same one that costs none
    assert net_gain(mu, sd, 0.0, np.array([15.0]), H, W)[0] < gain


def test_with_nothing_measured_nothing_is_given_up():
    mu, sd = np.array([0.0, -0.1]), np.array([0.2, 0.2])
    gain = net_gain(mu, sd, None, np.zeros(2), H, W)
    assert gain[0] > gain[1] > 0


def test_the_goodput_runs_first_plan_on_ant_keeps_its_incumbent():
    """Replayed from a real run (Ant-v5 on an H200 host, goodput per joule): after its first
    window (15 x 8 envs, batches of 4,096, 116 steps/J) the sampler had tried 14 actors x 2
    envs without a MPS limit, predicted at 0.91 of it, which measured 80 steps/J over a 37-s
    trial. Net of that trial's expected shortfall, it keeps the incumbent, and adds a 16th actor
    on the core no longer left to the stages (a live change)."""
    doc = json.loads((RESULTS / "goodput/ant-h200-floor-seed0/goodput-seed0.json").read_text())
    tuning = doc["tuning"]
    space = {
        n: Knob(n, tuple(k["choices"]), k["apply"], k["unavailable"])
        for n, k in tuning["knobs"].items()
    }
    settings = TunerSettings(objective=tuning["objective"], window_s=10.0, window_max_s=30.0)
    machine = machine_from_doc(doc["sizing"]["model"])
    sampler = sampler_for(machine, space, tuning["default"], settings, 0)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    first = tuning["windows"][0]
    online = [k for k in space.values() if k.online]
    params = {k.name: first["values"][k.name] for k in online}
    attrs = ("steps_per_s", "steps_per_joule", "gpu_j", "cpu_j", "window_s", "policy_lag")
    study.add_trial(
        optuna.trial.create_trial(
            params=params,
            distributions={n: CategoricalDistribution(list(space[n].choices)) for n in params},
            value=first["objective"],
            user_attrs={a: first[a] for a in (*attrs, "noise_scale")},
        )
    )
    plan = sampler.plan(study)
    # the incumbent with one more actor: the change the model expects to gain most by
    assert sampler.last["chosen"] == "model"
    assert {k: plan[k] for k in params} == {**params, "actors": 16}
