"""``auto`` sizing is pure given its measurements: synthetic machines of 2, 16 and 64 cores,
with and without a GPU, get the expected configs."""

from __future__ import annotations

import pytest

from autotune.tuning.perf_model import MachineModel
from autotune.tuning.sizing import MIN_MINIBATCH, size_run


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
    assert v["actors"] + cpu_threads <= max(cores, 2)
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


def ant_on_h100_loaded_probe_without_intercept() -> MachineModel:
    """Ant-v5's model as probed on an H100 80GB 16-core host (15 cores in the job's budget):
    the loaded actor round measured 0.85 ms at 2 envs and 6.83 ms at 16, a line whose intercept
    clamps to zero, so the model sees no fixed cost per round; the GPU learner's update costs
    the same at every batch."""
    return MachineModel(
        cores=15,
        rollout_len=32,
        t_env=295e-6,
        f0=27e-6,
        f1=3e-6,
        learner={"cuda": (0.1197, 1e-12), "cpu": (0.0601, 4.21e-5)},
        gpu_idle_w=77.2,
        gpu_limit_w=700.0,
        cpu_idle_w=24.0,
        gpu_ctx_w=67.2,
        gpu_busy_w=1.0,
        load=1.436,
        g0=0.0,
        g1=427e-6,
    )


def test_a_cpu_trainer_needs_a_clear_margin_and_ties_take_the_most_envs():
    m = ant_on_h100_loaded_probe_without_intercept()
    s = size_run(m, 1, {}, 4)
    # the model alone scores two CPU trainers about 11 % above the GPU trainer: inside the margin
    assert s.values["trainer_device"] == "cuda"
    assert s.rules["cpu_trainer_margin"] > 0
    # every env count predicts alike here; one env per actor trained at 0.6-0.7 of eight
    assert s.values["envs_per_actor"] >= 8
    assert s.predicted["policy_lag"] <= s.rules["lag_ceiling"]
    # a CPU trainer still wins where it is far better: a learner the GPU cannot speed up
    slow_gpu = MachineModel(**{**m.__dict__, "learner": {"cuda": (0.5, 1e-4), "cpu": (0.01, 1e-6)}})
    assert size_run(slow_gpu, 1, {}, 4).values["trainer_device"] == "cpu"
    # and where the user holds the device, the margin does not apply
    held = size_run(m, 1, {"trainer_device": "cpu"}, 4)
    assert held.values["trainer_device"] == "cpu"


def test_a_trainer_group_on_cuda_is_predicted_with_its_own_eager_line():
    """A single CUDA trainer replays CUDA graphs; a group's members run the eager loop. Where
    the probes measured that line, two trainers are predicted at its (slower) rate, and the
    sizing keeps one trainer; probes without it (older caches) keep the single line."""
    from autotune.tuning.perf_model import GROUP_LEARNER, evaluate, features, prior_params

    base = machine(16, True)
    graphed = MachineModel(**{**base.__dict__, "learner": {**base.learner, "cuda": (0.15, 1e-7)}})
    grouped = MachineModel(
        **{**graphed.__dict__, "learner": {**graphed.learner, GROUP_LEARNER: (1.8, 1e-6)}}
    )
    configs = [
        {
            "actors": 15,
            "envs_per_actor": 32,
            "batch_size": 16384,
            "trainer_device": "cuda",
            "trainers": g,
            "mps_pct": 100,
            "trainer_threads": 1,
        }
        for g in (1, 2)
    ]
    x = features(configs, {})
    one, two = evaluate(grouped, prior_params(grouped), x).train_rate
    assert two < 0.2 * one  # the eager line: about 10x slower per update
    old_one, old_two = evaluate(graphed, prior_params(graphed), x).train_rate
    assert old_one == pytest.approx(one) and old_two > 0.9 * one  # one line for both
    assert size_run(grouped, 1, {}, 4).values["trainers"] == 1


def ant_on_h200() -> MachineModel:
    """Ant-v5's model as probed on an H200 16-core host for a goodput-tuned run (EnvPool actors,
    the graphed GPU learner, 10 epochs x 32 minibatches)."""
    return MachineModel(
        cores=16,
        rollout_len=32,
        t_env=274.6e-6,
        f0=22.0e-6,
        f1=1.84e-6,
        learner={"cuda": (0.1799, 1.63e-7), "cpu": (0.0, 1.03e-3), "cuda-group": (1.334, 7.65e-5)},
        gpu_idle_w=77.4,
        gpu_limit_w=700.0,
        cpu_idle_w=24.0,
        gpu_ctx_w=43.4,
        gpu_busy_w=1.0,
        load=1.17,
        g0=249e-6,
        g1=323e-6,
    )


def test_the_goodput_start_takes_a_smaller_batch_within_a_wider_tie():
    m = ant_on_h200()
    by_spj = size_run(m, 1, {}, 32)
    good = size_run(m, 1, {}, 32, objective="goodput_per_joule")
    # steps/J: 16,384 is predicted 2.3 % under 32,768's best, outside the 2 % tie
    assert by_spj.values["batch_size"] == 32768 and by_spj.rules["tie_share"] == 0.02
    # goodput: no noise scale yet, so the smallest batch within 10 % of the best steps/J
    assert good.values["batch_size"] == 16384 and good.rules["tie_share"] == 0.10
    assert good.rules["objective"] == "goodput_per_joule"
    assert good.predicted["steps_per_joule"] >= 0.9 * by_spj.predicted["steps_per_joule"]
    with pytest.raises(ValueError, match="sizing objective 'joules': allowed steps_per_joule"):
        size_run(m, 1, {}, 32, objective="joules")


def test_the_model_predicts_the_actors_held_back_by_the_runs_in_flight_budget():
    """At a batch of half an actor round (16 x 4 x 32 = 2,048 steps), two batches in flight
    leave each actor one rollout out, and the model predicts the actors held back between
    rollouts; eight leave four, and they are not."""
    from autotune.tuning.perf_model import evaluate, features, prior_params

    config = {
        "actors": 16,
        "envs_per_actor": 4,
        "batch_size": 1024,
        "trainer_device": "cuda",
        "trainers": 1,
        "mps_pct": 50,
        "trainer_threads": 1,
    }
    x = features([config], {})
    rates = {}
    for inflight in (2.0, 8.0):
        m = MachineModel(**{**machine(16, True).__dict__, "inflight_batches": inflight})
        rates[inflight] = float(evaluate(m, prior_params(m), x).sample_rate[0])
    assert rates[8.0] > 1.2 * rates[2.0]
    assert MachineModel(**machine(16, True).__dict__).inflight_batches == 2.0  # the default
