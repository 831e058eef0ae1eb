"""The goodput objective (``--objective goodput_per_joule``): steps per joule times the
statistical efficiency of the window's batch (a learner update) at the learner's noise scale.
On a job whose steps per joule grow with the batch but whose noise scale is small, it picks a
smaller batch than steps per joule does."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest

from autotune.tuning.counters import Counters, measure
from autotune.tuning.knobs import Machine, build_space
from autotune.tuning.online_tuner import OnlineTuner, TunerSettings
from autotune.tuning.settings import objective_value
from autotune.tuning.storage import open_study
from policies.noise_scale import efficiency

NOISE = 2048.0


class BatchWorld:
    """Steps per joule rise 15 % per doubling of the batch (1024: 100, 16384: 160; 2 % noise);
    the learner's noise scale is ``NOISE`` samples, each update one batch."""

    def __init__(self, seed: int) -> None:
        self.t = self.last = self.steps = self.joules = 0.0
        self.values: dict = {}
        self.rng = random.Random(seed)

    def apply(self, values):
        self.values = dict(values)

    def ready(self):
        return True

    def counters(self):
        dt, self.last = self.t - self.last, self.t
        b = self.values.get("batch_size", 1024)
        if self.values and dt > 0:
            spj = 100 * (1 + 0.15 * math.log2(b / 1024)) * (1 + self.rng.gauss(0, 0.02))
            self.steps += 1000 * spj * dt
            self.joules += 1000 * dt
        return Counters(
            self.t,
            int(self.steps),
            0.0,
            0.0,
            self.joules,
            noise_scale=NOISE,
            step_samples=float(b),
        )


def _best_batch(tmp_path, objective: str, seed: int) -> int:
    space = build_space(
        Machine(cores=4, gpus=0),
        [
            *("actors=2", "batch_size=1024..16384", "envs_per_actor=8"),
            *("chunk_bytes=262144", "trainers=1", "trainer_threads=1"),
        ],
    )
    world = BatchWorld(seed)
    study = open_study(f"sqlite:///{tmp_path}/{objective}.db", "s", seed=seed)
    settings = TunerSettings(
        objective=objective, trials=20, warmup_s=1.0, window_s=1.0, window_max_s=5.0
    )
    tuner = OnlineTuner(
        study, space, world, settings, {"actors": 2, "batch_size": 1024}, clock=lambda: world.t
    )
    while tuner.trials_done < 20:
        world.t += 0.5
        tuner.tick()
    return tuner.best()["values"]["batch_size"]


@pytest.mark.parametrize("seed", [0, 1])
def test_goodput_picks_a_smaller_batch_than_steps_per_joule(tmp_path, seed):
    assert _best_batch(tmp_path, "steps_per_joule", seed) == 16384
    assert _best_batch(tmp_path, "goodput_per_joule", seed) <= 2048


def test_a_window_carries_the_noise_scale_and_its_efficiency_into_the_objective():
    a = Counters(0.0, 0, 0.0, 0.0, 0.0, noise_scale=NOISE, step_samples=512.0)
    b = Counters(10.0, 10_000, 0.0, 0.0, 100.0, noise_scale=NOISE, step_samples=512.0)
    m = measure(a, b)
    assert m.noise_scale == NOISE and m.efficiency == pytest.approx(0.8)
    goodput = TunerSettings(objective="goodput_per_joule")
    assert objective_value(goodput, m) == pytest.approx(100 * 0.8)
    # a job that reports no noise scale (a wrapped script): rated by steps per joule
    plain = measure(Counters(0.0, 0, 0.0, 0.0, 0.0), Counters(10.0, 10_000, 0.0, 0.0, 100.0))
    assert plain.efficiency is None and objective_value(goodput, plain) == pytest.approx(100)


def test_the_model_sampler_weighs_each_candidate_by_its_batchs_efficiency():
    import optuna

    from autotune.tuning.model_inputs import goodput_factor

    study = optuna.create_study(direction="maximize")
    dist = {"batch_size": optuna.distributions.CategoricalDistribution([1024, 2048, 16384])}
    study.add_trial(
        optuna.trial.create_trial(
            params={"batch_size": 2048},
            distributions=dist,
            value=1.0,
            user_attrs={"noise_scale": NOISE, "efficiency": 0.5},  # an update of 2048
        )
    )
    factor = goodput_factor(study, [{"batch_size": 1024}, {"batch_size": 16384}], {})
    assert factor == pytest.approx([NOISE / (NOISE + 1024), NOISE / (NOISE + 16384)])
    empty = optuna.create_study(direction="maximize")
    assert list(goodput_factor(empty, [{"batch_size": 1024}], {})) == [1.0]  # nothing measured


def test_an_offline_goodput_study_and_its_export_pick_the_smaller_batch(tmp_path):
    """Offline, each trial's goodput is its steps/J times the efficiency of its batch at the
    noise scale its learner reported: steps/J ranks the biggest batch first, goodput a
    smaller one, and export recommends that one."""
    from autotune.tuning.offline_study import OBJECTIVES, OfflineStudy, TrainTrials
    from autotune.workflows.export import export_doc
    from policies.noise_scale import efficiency
    from runtime.config import TrainConfig

    def run(cfg, warmup_s, meter=None):
        spj = 100 * 1.15 ** math.log2(cfg.batch_size / 1024)
        step = cfg.batch_size
        noise = {"samples": NOISE, "batch_samples": step, "efficiency": efficiency(NOISE, step)}
        rate = {"steps_per_s": spj * 10, "steps_per_joule": spj, "gpu_w": 0.0, "cpu_w": 10.0}
        return {"lost_steps": 0, "energy": {"cpu_source": "model"}, "noise_scale": noise}, rate

    space = build_space(Machine(cores=2, gpus=0), ["batch_size=1024,4096,16384", "actors=1"])
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=10)
    trials = TrainTrials(space, base, warmup_s=1.0, run=run)
    for objective, best_batch in (("steps_per_joule", 16384), ("goodput_per_joule", 1024)):
        metrics = OBJECTIVES[objective]
        study = open_study(f"sqlite:///{tmp_path}/{objective}.db", "g", seed=0, metrics=metrics)
        meta = {"kind": "train", "objective": objective, "base": base.to_dict(), "default": {}}
        study.set_user_attr("autotune", meta)
        offline = OfflineStudy(study, trials, objective, profile=False)
        for _ in range(6):
            offline.step()
        assert study.best_trial.params["batch_size"] == best_batch, objective
        doc = export_doc(study)
        assert doc["recommended"]["values"]["batch_size"] == best_batch
        if objective == "goodput_per_joule":
            rec = doc["evidence"]["recommended"]["goodput_per_joule"]["median"]
            assert rec == pytest.approx(100 * efficiency(NOISE, 1024))


def test_configs_are_ranked_at_the_newest_noise_scale_not_at_their_windows_own():
    """A big batch measured while the noise scale was small kept little of each sample's worth;
    once the noise scale has grown, its steps/J rates it above the small batch again."""
    from autotune.tuning.job import History

    for rerate, best in ((False, "small"), (True, "big")):
        h = History(rerate=rerate, noise_scale=512.0)
        h.add("big", 160 * efficiency(512.0, 16384), 160.0, 16384)
        h.add("small", 100 * efficiency(512.0, 1024), 100.0, 1024)
        assert h.best()[0] == "small"  # at the noise scale both windows saw
        h.noise_scale = 1e6
        assert h.best()[0] == best
    h.add("big", 150.0, None, None)  # a window without its steps/J: the stored values rank it
    assert h.score("big") == pytest.approx(statistics.median([160 * efficiency(512.0, 16384), 150]))


def test_the_model_sampler_rates_its_incumbent_at_the_newest_noise_scale():
    import optuna

    from autotune.tuning.model_sampler import ModelSampler
    from bench import tuner_sim

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = tuner_sim.build_space(tuner_sim.Machine(16, 1), tuner_sim.SPACE)
    online = {k.name: k for k in space.values() if k.online}
    defaults = {k.name: k.choices[0] for k in space.values()}
    defaults.update(actors=15, envs_per_actor=16, trainer_device="cuda")
    choices = {k.name: k.choices for k in online.values()}
    applies = {k.name: k.apply for k in online.values()}
    dist = {"batch_size": optuna.distributions.CategoricalDistribution(choices["batch_size"])}

    def window(batch: int, spj: float, noise: float) -> optuna.trial.FrozenTrial:
        attrs = {"steps_per_s": 30_000.0, "window_s": 10.0, "gpu_j": 1500.0, "cpu_j": 1500.0}
        attrs.update(steps_per_joule=spj, noise_scale=noise, policy_lag=1.0)
        value = spj * efficiency(noise, batch)
        return optuna.trial.create_trial(
            params={"batch_size": batch}, distributions=dist, value=value, user_attrs=attrs
        )

    for newest, best in ((512.0, 1024), (1e6, 16384)):
        s = ModelSampler(tuner_sim.PROBED, choices, defaults, applies, "goodput_per_joule", seed=0)
        study = optuna.create_study(direction="maximize", sampler=s)
        study.add_trial(window(16384, 160.0, 512.0))
        study.add_trial(window(1024, 100.0, 512.0))
        study.add_trial(window(1024, 100.0, newest))
        s.plan(study)
        assert s.last["incumbent"]["batch_size"] == best


class GrowingNoise(BatchWorld):
    """``BatchWorld`` whose learner's noise scale grows 1000-fold at ``grow_at`` seconds."""

    grow_at = 60.0

    def counters(self):
        c = super().counters()
        noise = NOISE if self.t < self.grow_at else 1000 * NOISE
        return dataclasses.replace(c, noise_scale=noise)


def test_an_online_goodput_tuner_moves_to_a_bigger_batch_once_the_noise_scale_grew(tmp_path):
    space = build_space(
        Machine(cores=4, gpus=0),
        [
            *("actors=2", "batch_size=1024,16384", "envs_per_actor=8"),
            *("chunk_bytes=262144", "trainers=1", "trainer_threads=1"),
        ],
    )
    world = GrowingNoise(0)
    study = open_study(f"sqlite:///{tmp_path}/grow.db", "s", seed=0)
    settings = TunerSettings(
        objective="goodput_per_joule",
        trials=4,
        warmup_s=1.0,
        window_s=1.0,
        window_max_s=5.0,
        recheck_s=5.0,
    )
    tuner = OnlineTuner(
        study, space, world, settings, {"actors": 2, "batch_size": 1024}, clock=lambda: world.t
    )
    while world.t < world.grow_at:
        world.t += 0.5
        tuner.tick()
    assert tuner.best()["values"]["batch_size"] == 1024  # 16,384 measured at the small scale
    assert any(w["values"]["batch_size"] == 16384 for w in tuner.log)
    while world.t < world.grow_at + 30:
        world.t += 0.5
        tuner.tick()
    assert tuner.best()["values"]["batch_size"] == 16384
    assert world.values["batch_size"] == 16384  # the job was moved there


def _counters(t: float, steps: int, noise: float | None) -> Counters:
    return Counters(t, steps, 0.0, 0.0, 100.0 * t, noise_scale=noise, step_samples=4096.0)


def test_a_window_has_moved_once_its_batchs_efficiency_moved_by_the_factor():
    from autotune.tuning.windows import EFFICIENCY_MOVED, MIN_BLOCKS, efficiency_moved

    def window(noises, batch_steps=4096):
        return [_counters(float(i), i * 2 * batch_steps, n) for i, n in enumerate(noises)]

    assert EFFICIENCY_MOVED == 1.5
    # the noise scale doubled while far below the batch: the efficiency doubled
    assert efficiency_moved(window([None, 200, 300, 400]), 4096)
    assert efficiency_moved(window([800, 600, 500, 400]), 4096)  # and falling, too
    assert not efficiency_moved(window([200, 210, 220, 230]), 4096)  # 1.15x: not moved
    # far above the batch every efficiency is near 1: a doubled noise scale moves nothing
    assert not efficiency_moved(window([1e6, 1.5e6, 1.8e6, 2e6]), 4096)
    # too soon: fewer than MIN_BLOCKS readings after the first, or fewer batches trained
    assert not efficiency_moved(window([200, 300, 400]), 4096)
    assert MIN_BLOCKS == 3
    short = [_counters(float(i), i * 1000, n) for i, n in enumerate([200, 300, 400, 500])]
    assert not efficiency_moved(short, 4096)
    assert not efficiency_moved(window([None, None, None, 400]), 4096)  # one estimate only
    assert not efficiency_moved(window([200, 300, 400, 500]), None)  # no batch known


def test_a_window_ends_early_only_once_its_estimate_is_near_precise():
    from autotune.tuning.windows import EARLY_TARGET, WindowRule, ends_early, half_width

    rule = WindowRule(floor_s=10.0, target=0.03)
    noise = [200, 300, 400, 500, 600, 700, 800, 900]
    readings = [_counters(float(i), i * 8192, n) for i, n in enumerate(noise)]
    # six batches' lumps alone leave the interval at about 13 % (over 3 x 3 %): not yet
    assert half_width(readings[:4], 4096) > EARLY_TARGET * rule.target
    assert not ends_early(rule, readings[:4], 4096)
    # fourteen batches in: about 6 %, within 9 %, and the efficiency has moved: it may end
    assert half_width(readings, 4096) <= EARLY_TARGET * rule.target
    assert ends_early(rule, readings, 4096)
    flat = [_counters(float(i), i * 8192, 200.0) for i in range(8)]
    assert not ends_early(rule, flat, 4096)  # precise, but nothing moved


class RisingNoise(BatchWorld):
    """``BatchWorld`` whose noise scale doubles every 4 s from 128 samples, as a run's does in
    its first seconds."""

    def counters(self):
        return dataclasses.replace(super().counters(), noise_scale=128.0 * 2 ** (self.t / 4))


def _windows(tmp_path, objective: str, batches: str) -> list[dict]:
    fixed = "," not in batches  # the batch held; the tuner varies envs per actor instead
    space = build_space(
        Machine(cores=4, gpus=0),
        [
            *("actors=2", f"batch_size={batches}", f"envs_per_actor={'4,8' if fixed else 8}"),
            *("chunk_bytes=262144", "trainers=1", "trainer_threads=1"),
        ],
    )
    world = RisingNoise(0)
    study = open_study(f"sqlite:///{tmp_path}/{objective}-{batches}.db", "s", seed=0)
    settings = TunerSettings(objective=objective, trials=30, warmup_s=1.0, window_s=10.0)
    base = {"actors": 2, "envs_per_actor": 8} if fixed else {"actors": 2, "batch_size": 1024}
    tuner = OnlineTuner(
        study, space, world, settings, base, clock=lambda: world.t, defaults={"batch_size": 1024}
    )
    while world.t < 60:
        world.t += 0.5
        tuner.tick()
    return tuner.log


def test_goodput_windows_end_before_their_floor_while_the_noise_scale_grows(tmp_path):
    goodput = _windows(tmp_path, "goodput_per_joule", "1024,4096,16384")
    assert goodput and all(w["window_s"] < 10.0 for w in goodput[:3])
    # once the noise scale is far above every batch, every efficiency is near 1 and stays
    # there: the windows keep their floor again
    late = [w for w in goodput if w["noise_scale"] >= 40_000]
    assert late and all(w["window_s"] >= 10.0 for w in late)
    # steps per joule know nothing of the noise scale: their windows keep the floor
    per_joule = _windows(tmp_path, "steps_per_joule", "1024,4096,16384")
    assert per_joule and all(w["window_s"] >= 10.0 for w in per_joule)
    # a batch the tuner cannot change: nothing to re-pick, the windows keep the floor
    fixed = _windows(tmp_path, "goodput_per_joule", "1024")
    assert fixed and all(w["window_s"] >= 10.0 for w in fixed)


def test_a_resumed_goodput_study_rerates_windows_with_the_jobs_batch_when_it_is_not_tuned():
    """The batch size a window is re-rated by comes from the job where it is not a knob: after a
    resume, configs measured before keep their (steps/J, batch) pairs, so every config is
    ranked at the newest noise scale, as live."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    from autotune.tuning.job import restore_history
    from autotune.tuning.model_inputs import update_samples

    study = optuna.create_study(direction="maximize")
    for actors, spj in ((2, 20.0), (4, 24.0)):
        study.add_trial(
            optuna.trial.create_trial(
                params={"actors": actors},
                distributions={"actors": CategoricalDistribution([2, 4])},
                value=spj,
                user_attrs={"steps_per_joule": spj, "noise_scale": 500.0, "steps_per_s": 1.0},
            )
        )
    history, done, _ = restore_history(study, lambda v: update_samples({"batch_size": 4096, **v}))
    assert done == 2
    assert sorted(history.per_joule.values()) == [[(20.0, 4096)], [(24.0, 4096)]]
