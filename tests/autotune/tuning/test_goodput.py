"""The goodput objective (``--objective goodput_per_joule``): steps per joule times the
statistical efficiency of the window's batch (a learner update) at the learner's noise scale.
On a job whose steps per joule grow with the batch but whose noise scale is small, it picks a
smaller batch than steps per joule does."""

from __future__ import annotations

import math
import random

import pytest

from autotune.tuning.counters import Counters, measure
from autotune.tuning.knobs import Machine, build_space
from autotune.tuning.online_tuner import OnlineTuner, TunerSettings
from autotune.tuning.settings import objective_value
from autotune.tuning.storage import open_study

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

    from autotune.tuning.model_sampler import goodput_factor

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
