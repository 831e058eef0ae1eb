"""``auto`` sizing is pure given its measurements: synthetic machines of 2, 16 and 64 cores,
with and without a GPU, get the expected configs."""

from __future__ import annotations

import pytest

from autotune.tuning.perf_model import MachineModel
from autotune.tuning.sizing import MIN_MINIBATCH, reserved_cores, size_run


def machine(cores: int, gpu: bool, t_env: float = 0.5e-3) -> MachineModel:
    learner = {"cpu": (0.02, 15e-6), **({"cuda": (0.01, 1e-7)} if gpu else {})}
    return MachineModel(
        cores=cores,
        rollout_len=32,
        t_env=t_env,
        f0=60e-6,
        f1=2e-6,
        learner=learner,
        gpu_idle_w=76.0 if gpu else 0.0,
        gpu_limit_w=700.0 if gpu else 0.0,
        cpu_idle_w=60.0,
    )


@pytest.mark.parametrize("cores,gpu", [(2, False), (16, False), (16, True), (64, True)])
def test_sizing_fills_the_cores_without_oversubscribing_them(cores, gpu):
    s = size_run(machine(cores, gpu), int(gpu), {}, 4)
    v = s.values
    cpu_threads = v["trainers"] * v["trainer_threads"] if v["trainer_device"] == "cpu" else 0
    assert v["actors"] + cpu_threads + reserved_cores(cores) <= max(cores, 2)
    assert v["actors"] + cpu_threads >= cores - 2  # env-bound: every free core works
    assert v["batch_size"] % 32 == 0 and v["batch_size"] // 4 >= MIN_MINIBATCH
    assert s.predicted["policy_lag"] <= s.rules["lag_ceiling"]
    assert s.predicted["train_rate"] >= s.predicted["sample_rate"]  # training keeps up


def test_two_cores_get_a_working_cartpole_run():
    m = machine(2, False, t_env=25e-6)
    s = size_run(m, 0, {}, 4, steps=200_000)
    assert s.values["actors"] == 1 and s.values["trainer_device"] == "cpu"
    assert s.values["batch_size"] <= 200_000 // 64  # the run learns in at least 64 updates


def test_a_heavy_learner_goes_to_the_gpu_and_a_light_one_may_stay_on_the_cpu():
    heavy = machine(16, True)
    heavy = MachineModel(
        **{**heavy.__dict__, "learner": {"cpu": (0.2, 4e-4), "cuda": (0.01, 2e-7)}}
    )
    assert size_run(heavy, 1, {}, 4).values["trainer_device"] == "cuda"
    assert size_run(machine(16, False), 0, {}, 4).values["trainer_device"] == "cpu"


def test_explicit_values_win_and_the_rest_is_sized_around_them():
    s = size_run(machine(16, True), 1, {"actors": 4, "trainer_device": "cuda"}, 4)
    assert s.values["actors"] == 4 and s.values["trainer_device"] == "cuda"
    assert s.rules["fixed"] == {"actors": 4, "trainer_device": "cuda"}


def test_no_batch_that_fits_the_rules_is_a_clear_error():
    with pytest.raises(ValueError, match="multiple of the rollout length"):
        size_run(machine(16, False), 0, {}, 1024)


def test_a_tuned_runs_narrowed_knobs_bound_the_start():
    allowed = {"actors": (1, 2), "envs_per_actor": (4, 8), "batch_size": (512, 1024)}
    s = size_run(machine(16, True), 1, {}, 4, allowed=allowed)
    assert s.values["actors"] in (1, 2) and s.values["envs_per_actor"] in (4, 8)
    assert s.values["batch_size"] in (512, 1024)
    assert s.rules["allowed"] == {k: list(v) for k, v in allowed.items()}
    # an explicit value still wins over the narrowed knob
    held = size_run(machine(16, True), 1, {"actors": 3}, 4, allowed=allowed)
    assert held.values["actors"] == 3
