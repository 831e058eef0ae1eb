"""A tuner inside a budget: nothing outside it is applied, a shrinking budget moves the running
config at once, and the clamping picks the nearest config inside."""

from __future__ import annotations

from optuna.trial import TrialState
from test_online_tuner import World, _run, _tuner

from autotune.tuning.budget import clamp, fits, limits_for
from autotune.tuning.knobs import Machine, default_space


def test_the_tuner_stays_inside_its_budget_and_finds_the_best_there(tmp_path):
    world = World(0)
    tuner = _tuner(tmp_path, world)
    tuner.set_limits({"actors": 4})  # the unconstrained best has 6 actors
    _run(tuner, world, 20)
    assert world.applied and max(v["actors"] for v in world.applied) <= 4
    assert tuner.best()["values"]["actors"] == 4
    pruned = tuner.study.get_trials(states=(TrialState.PRUNED,))
    assert all("outside the job's budget" in t.user_attrs["pruned"] for t in pruned)


def test_a_budget_that_shrinks_under_the_running_config_moves_it_at_once(tmp_path):
    world = World(1)
    tuner = _tuner(tmp_path, world, trials=60)
    _run(tuner, world, 12)
    while world.values.get("actors", 0) <= 3:  # until a config past the new budget runs
        world.t += 0.5
        tuner.tick()
    before = len(world.applied)
    tuner.set_limits({"actors": 3})
    assert len(world.applied) == before + 1 and world.applied[-1]["actors"] == 3
    _run(tuner, world, tuner.trials_done + 8)
    assert all(v["actors"] <= 3 for v in world.applied[before:])
    tuner.set_limits(None)  # the budget grew back to the machine: the space is whole again
    _run(tuner, world, tuner.trials_done + 10)
    assert max(v["actors"] for v in world.applied[before:]) > 3


def test_limits_and_clamping():
    knobs = list(default_space(Machine(cores=16, gpus=1)).values())
    assert limits_for(16, 35) == {"actors": 16, "trainer_threads": 16, "mps_pct": 35}
    assert limits_for(2, None) == {"actors": 2, "trainer_threads": 2}
    gpu = {"actors": 12, "trainer_device": "cuda", "mps_pct": 50, "trainer_threads": 1}
    assert not fits(gpu, {"actors": 8, "mps_pct": 35})
    assert clamp(gpu, {"actors": 8, "mps_pct": 35}, knobs) == {**gpu, "actors": 8, "mps_pct": 25}
    # no share of the GPU, or one below every choice: the trainer moves to the CPU
    cpu = clamp(gpu, {"actors": 8, "mps_pct": 5}, knobs)
    assert cpu["trainer_device"] == "cpu" and "mps_pct" not in cpu
    assert fits(cpu, {"actors": 8, "mps_pct": 0})
    assert fits({"actors": 99}, None)
    # a CPU trainer's threads take cores beside the actors, as auto sizing counts them
    on_cpu = {"actors": 15, "trainer_device": "cpu", "trainers": 1, "trainer_threads": 1}
    assert clamp(on_cpu, limits_for(8, None), knobs)["actors"] == 7
    assert clamp(on_cpu, limits_for(2, None), knobs)["actors"] == 1
    assert fits({**on_cpu, "actors": 7}, limits_for(8, None))
    wide = {**on_cpu, "actors": 16, "trainers": 2, "trainer_threads": 4}
    assert not fits(wide, limits_for(16, None))
    assert clamp(wide, limits_for(16, None), knobs)["actors"] == 8
    # threads that alone fill the cores give one back for an actor
    full = clamp({**on_cpu, "actors": 4, "trainer_threads": 8}, limits_for(8, None), knobs)
    assert full["actors"] + full["trainer_threads"] <= 8 and full["actors"] >= 1
    assert fits({**on_cpu, "actors": 16}, limits_for(16, 35)) is False
    assert fits({"actors": 16, "trainer_device": "cuda", "mps_pct": 25}, limits_for(16, 35))


def test_a_run_sized_under_a_budget_keeps_to_its_gpu_share():
    from autotune.cli.auto_flags import within_budget
    from autotune.control.allocator import Budget

    assert within_budget(None, None) is None
    assert within_budget(None, Budget((0, 1), 0, 35)) == {"mps_pct": (10, 25)}
    narrowed = within_budget({"mps_pct": (25, 50)}, Budget((0,), 0, 30))
    assert narrowed == {"mps_pct": (25,)}
    assert within_budget({}, Budget((0,), 0, 5)) == {"trainer_device": ("cpu",)}
    assert within_budget({"actors": (2,)}, Budget((0, 1))) == {"actors": (2,)}  # no GPU term


def test_auto_sizing_considers_only_envs_per_actor_whose_rollouts_the_links_carry():
    from autotune.cli.auto_flags import within_frames

    assert within_frames(None, 32, 4) is None  # CartPole: every count fits
    # 40,000 floats a step (a 200x200 image): 64 envs x 33 rows pass the 256 MiB held
    assert within_frames(None, 32, 40_000) == {"envs_per_actor": (1, 2, 4, 8, 16, 32)}
    kept = within_frames({"actors": (2,), "envs_per_actor": (16, 64)}, 32, 40_000)
    assert kept == {"actors": (2,), "envs_per_actor": (16,)}
    # not even one env's rollout fits: one env, which the run's own check then refuses
    assert within_frames(None, 32, 10**8) == {"envs_per_actor": (1,)}


def test_a_tuner_holding_its_best_explores_again_when_its_budget_grows(tmp_path):
    world = World(0)
    tuner = _tuner(tmp_path, world, trials=12, recheck_s=1000.0)
    tuner.set_limits({"actors": 3})
    _run(tuner, world, 12)
    for _ in range(40):  # past the trials: it holds the best inside the budget
        world.t += 0.5
        tuner.tick()
    assert tuner.holding and tuner.best()["values"]["actors"] <= 3
    tuner.set_limits({"actors": 8})
    assert not tuner.holding
    _run(tuner, world, tuner.trials_done + 3)
    assert tuner.trials_done >= 15


def test_a_config_sized_for_a_new_budget_is_applied_at_once_and_compared_afresh(tmp_path):
    world = World(2)
    tuner = _tuner(tmp_path, world, trials=8, recheck_s=1000.0)
    tuner.set_limits({"actors": 3})
    _run(tuner, world, 8)
    old_best = tuner.best()["values"]
    assert old_best["actors"] <= 3
    tuner.set_limits({"actors": 10})
    tuner.adopt({"actors": 9, "batch_size": 4096, "envs_per_actor": 99})  # 99: not a choice
    assert world.applied[-1] == {"actors": 9, "batch_size": 4096}
    assert tuner.best() is None  # the old budget's measurements compare no longer
    world.ends_at = world.t + 6.0  # too little left for another trial: it holds what it has
    for _ in range(40):
        world.t += 0.5
        tuner.tick()
    assert tuner.best()["values"] == {"actors": 9, "batch_size": 4096}
    assert world.applied[-1] == {"actors": 9, "batch_size": 4096}


def test_a_cpu_trainer_the_job_fixed_is_counted_in_its_budget(tmp_path):
    """The tuner tunes no trainer device here: the job's own (a CPU trainer, one thread) is
    what the budget holds beside the actors, and a budget with no GPU share still fits it."""
    world = World(0)
    tuner = _tuner(tmp_path, world)
    tuner.defaults = {"trainer_device": "cpu", "trainers": 1, "trainer_threads": 1}
    tuner.set_limits({"actors": 4, "trainer_threads": 4, "mps_pct": 0})
    _run(tuner, world, 12)
    assert world.applied and max(v["actors"] for v in world.applied) <= 3  # and 1 trainer core
    pruned = tuner.study.get_trials(states=(TrialState.PRUNED,))
    assert len(pruned) < tuner.trials_done  # not every config pruned for a GPU it lacks


def test_a_tuner_that_gives_up_puts_the_default_inside_the_budget(tmp_path):
    world = World(0)
    tuner = _tuner(tmp_path, world)
    tuner.base = {**tuner.base, "actors": 8}
    tuner.set_limits({"actors": 4})
    tuner._give_up()
    assert world.applied[-1]["actors"] <= 4 and tuner.applied == world.applied[-1]
    assert tuner.unmet


def test_a_trial_whose_start_fails_is_told_failed_not_left_running(tmp_path, monkeypatch):
    import pytest

    world = World(0)
    tuner = _tuner(tmp_path, world)
    _run(tuner, world, 2)

    def broken(*_):
        raise RuntimeError("the job went away")

    monkeypatch.setattr(tuner, "_start", broken)
    with pytest.raises(RuntimeError, match="went away"):
        while True:
            world.t += 0.5
            tuner.tick()
    assert not tuner.study.get_trials(states=(TrialState.RUNNING,))


def test_a_config_that_never_took_effect_leaves_the_next_change_a_full_warmup(tmp_path):
    world = World(0, stuck=3)  # 3 actors never settle: the job did not run that config
    tuner = _tuner(tmp_path, world, settle_timeout_s=2.0)
    seen = False
    while tuner.trials_done < 25 and not seen:
        world.t += 0.5
        tuner.tick()
        failed = tuner.study.get_trials(states=(TrialState.FAIL,))
        seen = any("did not take effect" in t.user_attrs.get("error", "") for t in failed)
    assert seen and tuner.current is None and tuner.applied is None
    for _ in range(20):  # the next config started (a trial may be skipped or pruned first)
        if tuner.current is not None:
            break
        world.t += 0.5
        tuner.tick()
    # warmed up as after a respawn, not as a change of the batch alone
    assert tuner.current is not None and tuner.current.warmup_s == tuner.settings.warmup_s


def test_the_knob_space_counts_the_cores_of_the_affinity_mask():
    """Under ``taskset`` or a container's CPU set, the actors knob (and a CPU trainer's
    threads) go up to the cores the process may use, not the host's."""
    import subprocess
    import sys

    code = "import os; os.sched_setaffinity(0, {0}); from autotune.tuning.knobs import Machine; "
    code += "print(Machine.here().cores)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_a_budget_no_choice_of_a_knob_fits_never_enqueues_a_value_outside_its_choices(tmp_path):
    """``--knob actors=4,8`` on a 2-core budget: no choice fits. The tuner counts the trials
    it cannot run and ends holding, never asking Optuna for a value not among the choices."""
    knobs = ["actors=4,8", "batch_size=1024..16384", "envs_per_actor=8", "chunk_bytes=262144"]
    world = World(0)
    tuner = _tuner(tmp_path, world, knobs=knobs, base={"actors": 4, "batch_size": 1024}, trials=10)
    tuner.set_limits({"actors": 2})
    _run(tuner, world, 10)  # before the fix: ValueError '2' not in (4, 8) inside ask
    trials = tuner.study.get_trials()
    assert all(t.params.get("actors") in (4, 8) for t in trials if "actors" in t.params)
    assert all(v["actors"] <= 2 for v in world.applied)
