"""The throughput/power model's fit (``autotune.tuning.perf_model.fit``) learns from a job that is
charged none of the GPU (a daemon's budget with no GPU share): its CPU-trainer windows show no
GPU watts and the model predicts none, which must not make every parameter's loss infinite."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import mujoco_like_model

from autotune.tuning.perf_model import Window, charged_share, evaluate, features, fit, prior_params

CFG = {
    "envs_per_actor": 16,
    "batch_size": 8192,
    "trainer_device": "cpu",
    "trainers": 1,
    "mps_pct": 100,
    "trainer_threads": 2,
}


def test_windows_of_a_job_charged_no_gpu_move_the_fit():
    m = charged_share(dataclasses.replace(mujoco_like_model(), cores=8), gpu=0.0, cpu=0.5)
    prior = prior_params(m)
    configs = [{**CFG, "actors": a} for a in (2, 4, 6)]
    pred = evaluate(m, prior, features(configs, {}))
    assert (pred.gpu_w == 0).all()  # nothing of the GPU is charged
    windows = [  # the job samples at 0.35 of what the prior says, at its predicted watts
        Window(c, 0.35 * float(r), 0.0, float(w), 1.0)
        for c, r, w in zip(configs, pred.steps_per_s, pred.cpu_w, strict=True)
    ]
    params, sigma = fit(m, windows, {})
    fitted = evaluate(m, params, features(configs, {}))
    assert fitted.steps_per_s == pytest.approx(0.35 * pred.steps_per_s, rel=0.25)
    assert sigma < 0.5
