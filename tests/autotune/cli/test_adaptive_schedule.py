"""``autotune train --lr-schedule adaptive``: each update's KL divergence steers the learning
rate; the progress lines and the result say what it was and what the schedule did."""

from __future__ import annotations

import math

import pytest

from autotune.workflows.progress_log import read_progress
from tests.autotune.cli.test_target_return import _train


def test_a_run_steers_its_learning_rate_by_the_kl_of_each_update(tmp_path):
    lr = 0.02  # ten times CartPole's default: its updates move the policy past the target
    flags = ("--lr", str(lr), "--lr-schedule", "adaptive", "--kl-target", "0.01")
    _, r = _train(tmp_path, "--steps", "40000", *flags)
    doc = r["learning_rate"]
    assert doc["schedule"] == "adaptive" and doc["kl_target"] == 0.01
    assert doc["last_kl"] >= 0.0
    lines = [p for p in read_progress(tmp_path / "p.jsonl") if "lr" in p]
    assert lines and all(p["kl"] >= 0.0 for p in lines)
    steps = {round(math.log(p["lr"] / lr, 1.5), 6) for p in lines}  # gains are powers of 1.5
    assert all(s == int(s) for s in steps), steps
    assert min(steps) < 0, f"the rate was never lowered from {lr}: {steps}"
    assert doc["last"] == pytest.approx(lr * 1.5 ** round(math.log(doc["last"] / lr, 1.5)))
    assert r["lost_steps"] == 0
