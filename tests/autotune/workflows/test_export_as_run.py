"""``autotune export`` recommends the config its trials ran: the actor count of a worker on a
share of the cores (where that fixes the actors), and, for a trainer on the CPU, no GPU
figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import record_train_study

from autotune.tuning.knobs import KnobError, Machine, build_space
from autotune.tuning.offline_study import OfflineStudy
from autotune.tuning.storage import open_study
from autotune.tuning.trials import TrainTrials
from autotune.workflows import study as study_flow
from autotune.workflows.export import export_doc
from autotune.workflows.study import StudyOptions, make_study, resolve_options
from runtime.config import TrainConfig

KNOBS = (
    "envs_per_actor=8,16",
    "batch_size=1024",
    "trainers=1",
    "trainer_threads=1",
    "rollout_len=32",
    "inference=actor",
    "chunk_bytes=262144",
)
GPU_FIGURES = ("actors_per_gpu", "sm_count", "sms_granted_per_gpu", "cpu_threads_per_sm")


class Runs:
    """Steps/J fall with the actors; keeps the config of every run."""

    def __init__(self) -> None:
        self.ran: list[TrainConfig] = []

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        self.ran.append(cfg)
        spj = 100.0 / cfg.actors + cfg.envs_per_actor
        rate = {"steps_per_s": spj * 100, "steps_per_joule": spj, "gpu_w": 0.0, "cpu_w": 20.0}
        return {"lost_steps": 0, "energy": {"cpu_source": "model"}}, rate


@pytest.fixture
def runs(monkeypatch) -> Runs:
    """Every study ``make_study`` opens runs its trials with ``Runs``."""
    runs = Runs()

    class Trials(TrainTrials):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, run=runs, **kwargs)

    monkeypatch.setattr(study_flow, "TrainTrials", Trials)
    return runs


def test_a_worker_on_fewer_cores_is_exported_with_the_actors_it_ran(tmp_path, runs):
    options = resolve_options(
        StudyOptions(storage=f"sqlite:///{tmp_path}/s.db", knobs=KNOBS, profile=False)
    )
    first = make_study(options, cores=2)  # the study's first session: actors 1..2
    assert [k.name for k in first.knobs] == ["actors", "envs_per_actor"]
    assert first.step().values == {"actors": 2, "envs_per_actor": 8}  # the default config
    worker = make_study(options, cores=1)  # a worker on one core: the actors fixed at 1
    assert worker.trials.fixed["actors"] == 1
    rows = [worker.step() for _ in range(3)]
    assert all(r.error is None for r in rows)
    assert [c.actors for c in runs.ran] == [2, 1, 1, 1]
    doc = export_doc(first.study)
    rec = doc["recommended"]
    assert set(doc["evidence"]["recommended"]["trials"]) <= {r.number for r in rows}
    assert rec["values"]["actors"] == 1 and rec["config"]["actors"] == 1
    assert rec["runtime"]["actors"] == 1
    assert doc["evidence"]["default"]["trials"] == [0]
    assert doc["evidence"]["default"]["values"] == {"actors": 2, "envs_per_actor": 8}
    for t in first.study.get_trials():  # every trial keeps every knob's value it ran with
        assert t.user_attrs["values"]["actors"] == runs.ran[t.number].actors


def _study(tmp_path, knobs: list[str]):
    space = build_space(Machine(cores=6, gpus=1), knobs)
    study = open_study(f"sqlite:///{tmp_path}/c.db", "c", seed=0, metrics=("steps_per_joule",))
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=20)
    trials = TrainTrials(space, base, 1.0, run=Runs())
    record_train_study(study, trials, base, 20, {"cores": 6, "gpus": 1, "sm_count": 132})
    offline = OfflineStudy(study, trials, profile=False)
    for _ in range(6):
        offline.step()
    return study


def test_a_cpu_trainer_on_a_gpu_machine_is_exported_without_gpu_figures(tmp_path):
    knobs = ["actors=2,4", "envs_per_actor=8,16", "trainer_device=cpu", "trainers=2"]
    knobs += ["trainer_threads=2", "mps_pct=50", "batch_size=1024", "inference=actor"]
    study = _study(tmp_path, knobs)
    doc = export_doc(study, target_gpus=8, target_cores=40)
    runtime = doc["recommended"]["runtime"]
    assert runtime["trainer_device"] == "cpu" and runtime["gpus"] == []
    assert runtime["gmis_per_gpu"] is None and runtime["mps_pct_per_gmi"] is None
    assert doc["recommended"]["config"]["mps_pct"] is None
    sizing = doc["sizing"]
    assert all(sizing[k] is None for k in (*GPU_FIGURES, "cpu_processes_per_gpu"))
    assert runtime["trainers"] == 2
    assert sizing["cores_needed"] == 2 + 2 * 2  # an actor each, 2 trainers of 2 threads
    assert sizing["cpu_processes"] == 2 + 2 + 2
    assert sizing["note"].startswith("the trainer runs on the CPU (trainer_device cpu)")
    target = sizing["target"]  # the measured config: it does not scale with GPUs
    assert target["gpus"] is None and target["actors"] == 2 and target["cores_needed"] == 6
    assert target["fits"] is True and "gpus_the_cores_can_feed" not in target
    assert "target_gpus 8 not used" in target["note"]
    small = export_doc(study, target_cores=4)["sizing"]["target"]
    assert small["fits"] is False and small["note"].startswith("4 cores are fewer than the 6")
    assert export_doc(study)["sizing"].get("target") is None


def test_a_cuda_recommendation_keeps_its_gpu_figures(tmp_path):
    knobs = ["actors=2,4", "envs_per_actor=8", "trainer_device=cuda", "trainers=2"]
    knobs += ["mps_pct=50", "batch_size=1024", "inference=actor", "trainer_threads=1"]
    doc = export_doc(_study(tmp_path, knobs), target_gpus=2)
    assert doc["recommended"]["runtime"]["mps_pct_per_gmi"] == [50, 50]
    assert doc["recommended"]["runtime"]["gmis_per_gpu"] == 2
    assert doc["sizing"]["sm_count"] == 132 and doc["sizing"]["sms_granted_per_gpu"] == 132
    assert doc["sizing"]["target"]["gpus"] == 2 and doc["sizing"]["target"]["actors"] == 4


@pytest.mark.slow
@pytest.mark.timeout(300)  # two runs of at most 25 s at once, with start-up and export
def test_workers_resuming_a_study_export_the_actors_their_trials_ran(tmp_path):
    """A study made on two cores (actors 1..2) and run on by two workers of one core each
    (their actors fixed at 1): a real CPU export recommends one actor, and no GPU figures."""
    if len(os.sched_getaffinity(0)) != 2:
        pytest.skip("needs exactly two cores, one per worker, so the workers fix the actors")
    storage = f"sqlite:///{tmp_path}/w.db"
    options = resolve_options(StudyOptions(storage=storage, knobs=KNOBS, trial_s=25))
    make_study(options, cores=2)  # made, as by a first session on both cores
    flags = [f"--knob={k}" for k in KNOBS] + ["--storage", storage, "--no-profile"]
    env = {**os.environ, "COLUMNS": "200"}
    cli = [sys.executable, "-m", "autotune.cli.main"]
    # each trial ends once measured, and at 25 s however loaded the machine (enough to measure)
    run = ["--workers", "2", "--trials", "2", "--trial-s", "25", "--warmup-s", "1"]
    out = subprocess.run(
        [*cli, "study", *flags, *run, "--json", str(tmp_path / "w.json")],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((tmp_path / "w.json").read_text())["trials"]
    assert {r["worker"] for r in rows} == {0, 1} and any(r["error"] is None for r in rows)
    sized = ["--target-cores", "4", "--out", str(tmp_path / "e.json")]
    out = subprocess.run(
        [*cli, "export", "--study", "study-CartPole-v1", "--storage", storage, *sized],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "e.json").read_text())
    assert doc["recommended"]["config"]["actors"] == 1  # what every trial ran with
    assert doc["recommended"]["values"]["actors"] == 1
    assert doc["recommended"]["runtime"]["trainer_device"] == "cpu"
    assert all(doc["sizing"][k] is None for k in GPU_FIGURES)
    assert doc["recommended"]["runtime"]["mps_pct_per_gmi"] is None
    assert doc["sizing"]["target"]["cores_needed"] == 2  # one actor, one trainer thread


def test_a_scripts_knobs_differing_only_in_case_are_refused():
    """Both would be passed as one ``AUTOTUNE_<NAME>`` variable: the script would get one
    knob's value under the other's name, and the trial record a config it did not run."""
    from autotune.workflows.study import StudyOptions, make_study

    options = StudyOptions(storage="sqlite:///:memory:", knobs=("n=1,2", "N=3,4"), cmd=("true",))
    with pytest.raises(KnobError, match="differing only in case"):
        make_study(options)


def test_a_multi_gpu_configs_sms_granted_do_not_depend_on_how_its_percentages_are_spelled():
    from autotune.workflows.export import runtime_view, sizing
    from runtime.config import TrainConfig

    one = TrainConfig(trainer_device="cuda", gpus=(0, 1), trainers=2, mps_pct=(30,))
    each = TrainConfig(trainer_device="cuda", gpus=(0, 1), trainers=2, mps_pct=(30,) * 4)
    views = [runtime_view(c) for c in (one, each)]
    assert views[0]["mps_pct_per_gmi"] == views[1]["mps_pct_per_gmi"] == [30] * 4
    sized = [sizing(v, 132, None, None) for v in views]
    assert (
        sized[0]["sms_granted_per_gpu"]
        == sized[1]["sms_granted_per_gpu"]
        == pytest.approx(132 * 0.6)
    )
    assert sized[0]["cpu_threads_per_sm"] == sized[1]["cpu_threads_per_sm"]
