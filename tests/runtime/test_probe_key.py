"""The probe cache's entries: a key holds the learner settings an update's work depends on, and
only those; a workload reads the entry of one that measured all it asks and more."""

from __future__ import annotations

import json
import time

import pytest

from policies.appo_config import APPOConfig
from runtime import probe_cache
from runtime.probe_results import LearnerCost, Probes

ENV, POLICY = "CartPole-v1", "auto:64:64:auto"


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


def _stored(devices: list[str], backend: str, also: tuple[str, ...]) -> Probes:
    """An entry as a GPU host's run sized over ``devices`` on ``backend`` (timing ``also``'s
    env too) would have left it, written where that run would have."""
    learners = {"cpu": LearnerCost("cpu", {2048: 0.05, 4096: 0.1})}
    if "cuda" in devices:
        learners["cuda"] = LearnerCost("cuda", {2048: 0.004, 16384: 0.01})
        learners["cuda-group"] = LearnerCost("cuda-group", {2048: 0.02, 16384: 0.05})
    found = Probes(
        ENV,
        POLICY,
        10e-6,
        {1: 20e-6, 8: 25e-6, 32: 45e-6},
        learners,
        [132] if "cuda" in devices else [],
        measured_at=time.time(),
        round_loaded_s={2: 40e-6, 16: 200e-6},
        backend=backend,
        other_backends={
            b: {"env_step_s": 5e-6, "round_loaded_s": {2: 30e-6, 16: 90e-6}} for b in also
        },
    )
    learner = APPOConfig().to_dict()
    path = probe_cache.entry_path(ENV, POLICY, 32, learner, devices, backend, also)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found.to_dict()))
    return found


def test_a_gpu_trained_workload_reads_the_probes_of_one_sized_over_both_devices(path_of):
    _stored(["cpu", "cuda"], "gymnasium", ())
    learner = APPOConfig().to_dict()
    read = probe_cache.probes(ENV, POLICY, 32, learner, ["cuda"])  # read: nothing measured
    assert read.cached and set(read.learners) == {"cuda", "cuda-group"}
    assert read.learners["cuda"].seconds == {2048: 0.004, 16384: 0.01}
    # not a CPU-trained one: its CPU learner may have been timed at one size only there
    assert probe_cache._read_wider(ENV, POLICY, 32, learner, ["cpu"], "gymnasium", ()) is None


def test_an_explicit_backend_reads_autos_probes_and_sizes_on_its_own_backend_alone(path_of):
    pytest.importorskip("envpool")
    from autotune.workflows.auto_size import size_config
    from runtime.config import TrainConfig

    _stored(["cpu"], "envpool", ("gymnasium",))  # `--env-backend auto`'s, gymnasium's env faster
    cfg = TrainConfig(env=ENV, policy=POLICY, trainer_device="cpu", env_backend="envpool")
    sized, doc = size_config(cfg, {"actors", "envs_per_actor", "batch_size"})
    assert doc["probes"]["cached"] and doc["probes"]["other_backends"] == {}
    assert sized.env_backend == "envpool" and list(doc["env_backend"]["predicted"]) == ["envpool"]


def test_an_explicit_gymnasium_backend_reads_the_gymnasium_figures_auto_took(path_of):
    from autotune.workflows.auto_size import size_config
    from runtime.config import TrainConfig

    _stored(["cpu"], "envpool", ("gymnasium",))
    cfg = TrainConfig(env=ENV, policy=POLICY, trainer_device="cpu", env_backend="gymnasium")
    sized, doc = size_config(cfg, {"actors", "envs_per_actor", "batch_size"})
    probes = doc["probes"]
    assert probes["cached"] and probes["backend"] == "gymnasium" and probes["env_step_s"] == 5e-6
    assert sized.env_backend == "gymnasium" and list(doc["env_backend"]["predicted"]) == [
        "gymnasium"
    ]
