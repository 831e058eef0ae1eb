"""The probe cache's key: the learner settings an update's work depends on, and only those."""

from __future__ import annotations

import pytest

from policies.appo_config import APPOConfig
from runtime import probe_cache


@pytest.fixture
def path_of(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    return lambda learner: probe_cache.entry_path("CartPole-v1", "auto", 32, learner, ["cpu"])


SAME = [
    {"lr": 1e-4},
    {"lr_schedule": "constant"},
    {"kl_target": 0.03},
    {"lr_scaling": "sqrt", "lr_batch": 4096},
    {"gamma": 0.9},
    {"clip": 0.1},
    {"value_coef": 1.0},
    {"entropy_coef": 0.0},
    {"max_grad_norm": 1.0},
    {"rho_bar": 2.0, "c_bar": 2.0, "vtrace_lambda": 1.0},
    {"reward_scale": 0.1, "normalize_reward": True},
    {"max_policy_lag": 5},
]
"""Changes that leave an update's work as it was."""
OTHER = [
    {"epochs": 10},
    {"minibatches": 32},
    {"min_minibatch": 512},
    {"normalize_obs": False},
    {"compile_loss": False},
]
"""Changes to an update's work."""


def test_every_learner_setting_is_placed_in_the_key_or_out_of_it():
    """A new learner setting fails here until it joins one of the two lists."""
    placed = {k for change in SAME + OTHER for k in change}
    assert placed == set(APPOConfig().to_dict())
    assert set(probe_cache.COST_SETTINGS) == {k for change in OTHER for k in change}


def test_a_run_that_changes_only_the_learning_numbers_reads_the_same_probes(path_of):
    base = APPOConfig().to_dict()
    for change in SAME:
        assert set(change) <= set(base), change  # settings the learner has
        assert path_of({**base, **change}) == path_of(base), change


def test_the_settings_an_updates_work_depends_on_make_another_workload(path_of):
    base = APPOConfig().to_dict()
    paths = {path_of({**base, **change}) for change in OTHER}
    assert len(paths) == len(OTHER) and path_of(base) not in paths
