"""``autotune study``: trials as fresh runs; unrunnable configs failed once and never retried;
a resumed study; and one real short run through the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.tuning.knobs import Machine, build_space
from autotune.tuning.offline_study import OfflineStudy, TrainTrials
from autotune.tuning.storage import open_study
from runtime.config import ConfigError, TrainConfig

KNOBS = [
    "actors=1..4",
    "batch_size=512,1024,2048",
    "envs_per_actor=8",
    "chunk_bytes=262144",
    "trainers=1",
    "trainer_threads=1",
    "rollout_len=32",
    "inference=actor",
]


class FakeRuns:
    """Steps/J peak at 3 actors and batch 1024; actors=4 cannot run."""

    def __init__(self):
        self.ran: list[TrainConfig] = []

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        if cfg.actors == 4:
            raise ConfigError(["actors=4: not enough cores (test)"])
        self.ran.append(cfg)
        spj = 100 - 10 * (cfg.actors - 3) ** 2 - 20 * abs(cfg.batch_size - 1024) / 1024
        rate = {"steps_per_s": spj * 10, "steps_per_joule": spj, "gpu_w": 0.0, "cpu_w": 10.0}
        return {"lost_steps": 0, "energy": {"cpu_source": "model"}}, rate


def _study(tmp_path, runs):
    space = build_space(Machine(cores=4, gpus=0), KNOBS)
    study = open_study(f"sqlite:///{tmp_path}/o.db", "o", seed=0)
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=10)
    return OfflineStudy(study, TrainTrials(space, base, warmup_s=1.0, run=runs))


def test_offline_trials_find_the_best_and_never_rerun_an_unrunnable_config(tmp_path):
    runs = FakeRuns()
    offline = _study(tmp_path, runs)
    rows = [offline.step() for _ in range(24)]
    best = offline.study.best_trial
    assert best.params == {"actors": 3, "batch_size": 1024}
    unrunnable = [r for r in rows if r.error and r.error.startswith("not runnable")]
    assert unrunnable and all(r.values["actors"] == 4 for r in unrunnable)
    # each refused config was tried once; later suggestions of it were skipped, not run
    keys = [json.dumps(r.values, sort_keys=True) for r in unrunnable]
    assert len(keys) == len(set(keys))
    assert all(cfg.actors != 4 for cfg in runs.ran)
    assert all(cfg.max_wall_s == 10 and cfg.envs_per_actor == 8 for cfg in runs.ran)


def test_a_resumed_offline_study_keeps_its_trials_and_fails_orphans(tmp_path):
    offline = _study(tmp_path, FakeRuns())
    for _ in range(3):
        offline.step()
    left = offline.study.ask()  # a trial left RUNNING by a killed study: its owner is gone
    left.set_user_attr("owner", f"{socket.gethostname()}:{os.getpid()}:0.00")
    again = _study(tmp_path, FakeRuns())
    states = [t.state for t in again.study.get_trials()]
    assert (
        states.count(optuna.trial.TrialState.COMPLETE) + states.count(optuna.trial.TrialState.FAIL)
        == 4
    )
    again.step()
    assert len(again.study.get_trials()) == 5


def test_study_cli_runs_a_real_trial_and_refuses_bad_input(tmp_path, capsys):
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli.main",
        "study",
        "--env",
        "CartPole-v1",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "--knob",
        "actors=2",
        "--knob",
        "envs_per_actor=8",
        "--knob",
        "trainers=1",
        "--knob",
        "trainer_threads=1",
        "--knob",
        "batch_size=1024",
    ]
    out = subprocess.run(
        [
            *cmd,
            "--trials",
            "1",
            "--trial-s",
            "240",  # the longest it may run: it ends once its window is measured
            "--warmup-s",
            "1",
            "--json",
            str(tmp_path / "s.json"),
        ],
        capture_output=True,
        text=True,
        timeout=290,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    row = doc["trials"][0]
    assert row["error"] is None and row["steps_per_s"] > 0 and row["steps_per_joule"] > 0
    assert row["attrs"]["lost_steps"] == 0 and doc["best"]["cpu_source"] == "model"
    assert 10 <= row["attrs"]["window_s"] < 230  # ended once measured, not at --trial-s
    assert row["role"] == "default" and doc["best"]["role"] == "default"
    # export round-trips into train --config, which runs it as is (flags given override it)
    export = [
        sys.executable,
        "-m",
        "autotune.cli.main",
        "export",
        "--study",
        "study-CartPole-v1",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
    ]
    out = subprocess.run(
        [*export, "--out", str(tmp_path / "e.yaml"), "--plots", str(tmp_path / "plots")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {
        "pareto.png",
        "steps_per_joule_vs_actors.png",
    }
    exported = yaml.safe_load((tmp_path / "e.yaml").read_text())
    assert exported["evidence"]["steps_per_joule_vs_default"] == 1.0  # one trial: the default
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli.main",
            "train",
            "--config",
            str(tmp_path / "e.yaml"),
            "--steps",
            "2048",
            "--quiet",
            "--json",
            str(tmp_path / "r.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    ran = json.loads((tmp_path / "r.json").read_text())["config"]
    from runtime.env_backends import resolve_backend

    rec = exported["recommended"]["config"]  # the run resolves the env backend it was given
    backend = resolve_backend(rec["env"], rec["env_backend"])
    assert ran == {**rec, "steps": 2048, "env_backend": backend}
    from autotune.cli.main import main  # the refusal, in this process (no run starts)

    assert main([*cmd[3:], "--trial-s", "5", "--warmup-s", "9"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at the console's width
    assert "need trials >= 1, trial-s > warmup-s >= 0" in err


class Saturating:
    """Steps/s grow with envs until a cap: 8 envs for 1 GMI, 16 for 2; 2 GMIs x 4 envs cannot
    run. Steps/J fall as actors grow, steps/s rise (a trade-off for the Pareto test)."""

    def __init__(self):
        self.ran: list[tuple[int, int, int]] = []

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        if cfg.trainers == 2 and cfg.envs_per_actor == 4:
            raise ConfigError(["trainers=2 x envs=4: not runnable (test)"])
        self.ran.append((cfg.trainers, cfg.envs_per_actor, cfg.actors))
        cap = 8 if cfg.trainers == 1 else 16
        sps = 100.0 * min(cfg.envs_per_actor, cap) * cfg.actors
        spj = 1000.0 / cfg.actors + cfg.envs_per_actor
        rate = {"steps_per_s": sps, "steps_per_joule": spj, "gpu_w": 0.0, "cpu_w": 10.0}
        return {"lost_steps": 0, "energy": {"cpu_source": "model"}}, rate


def _profiled(storage, runs, objective="steps_per_s", name="p"):
    from autotune.tuning.offline_study import OBJECTIVES

    space = build_space(
        Machine(cores=4, gpus=0),
        [
            "actors=2..4",
            "trainers=1,2",
            "batch_size=1024",
            "chunk_bytes=262144",
            "trainer_threads=1",
            "rollout_len=32",
            "inference=actor",
        ],
    )
    study = open_study(storage, name, seed=0, metrics=OBJECTIVES[objective])
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=10)
    return OfflineStudy(study, TrainTrials(space, base, warmup_s=1.0, run=runs), objective)


def test_profiling_seeds_gmis_by_envs_stops_rows_at_saturation_and_resumes(tmp_path):
    runs = Saturating()
    storage = f"sqlite:///{tmp_path}/p.db"
    offline = _profiled(storage, runs)
    rows = [offline.step() for _ in range(6)]
    assert rows[0].role == "default" and rows[0].values["actors"] == 2
    assert [r.role for r in rows[1:]] == ["profile"] * 5
    # row 1 GMI: envs 1, 2, 4, 8, then 16 gains nothing over 8 -> saturated
    assert [(t, e) for t, e, a in runs.ran[1:]] == [(1, 1), (1, 2), (1, 4), (1, 8), (1, 16)]
    assert all(a == 4 for _, _, a in runs.ran[1:])  # every actor slot filled
    again = _profiled(storage, runs)  # a new session resumes the plan where it stopped
    rows = [again.step() for _ in range(7)]
    assert [(r.values["trainers"], r.values["envs_per_actor"]) for r in rows[:5]] == [
        (2, 1),
        (2, 2),
        (2, 4),
        (2, 8),
        (2, 16),
    ]
    assert rows[2].error.startswith("not runnable")  # skipped, the row goes on
    assert rows[5].values == {**rows[5].values, "trainers": 2, "envs_per_actor": 32}
    assert rows[6].role == "sampler"  # 32 saturated the second row; the sampler's turn
    assert len(runs.ran) == 6 + 6  # nothing ran twice, the unrunnable config not at all


@pytest.mark.parametrize("where", ["sqlite", "postgresql"])
def test_a_multi_objective_study_keeps_a_pareto_front(tmp_path, request, where):
    from autotune.tuning.storage import StudyError
    from autotune.tuning.study_best import pareto_front
    from autotune.workflows.study import summary

    storage = (
        f"sqlite:///{tmp_path}/m.db"
        if where == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    name = f"pareto-{tmp_path.name}"
    offline = _profiled(storage, Saturating(), objective="both", name=name)
    for _ in range(8):
        offline.step()
    study = offline.study
    assert study.metric_names == ["steps_per_s", "steps_per_joule"]
    front = pareto_front(study)
    assert len(front) >= 2  # more actors: more steps/s, fewer steps/J
    for t in front:
        for other in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
            assert not (other.values[0] > t.values[0] and other.values[1] > t.values[1])
    doc = summary(study, "both")
    assert doc["best"]["steps_per_joule"] == max(t.values[1] for t in front)
    with pytest.raises(StudyError, match="objectives"):
        open_study(storage, name, metrics=("steps_per_joule",))
    if where == "postgresql":  # another worker (a second client) sees the same trials
        optuna.delete_study(study_name=name, storage=storage)


SCRIPT = Path(__file__).parents[2] / "fixtures" / "scripts" / "reporting.py"
"""A wrapped script that reports three steps (``tests/fixtures/scripts``)."""


def test_study_drives_a_wrapped_script_with_two_workers(tmp_path):
    script = SCRIPT
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli.main",
            "study",
            "--knob",
            "num_envs=1,2,4",
            "--trials",
            "4",
            "--workers",
            "2",
            "--trial-s",
            "30",
            "--warmup-s",
            "0",
            "--objective",
            "both",
            "--storage",
            f"sqlite:///{tmp_path}/w.db",
            "--json",
            str(tmp_path / "w.json"),
            "--",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["study"] == "study-reporting" and len(doc["trials"]) == 4
    assert {r["worker"] for r in doc["trials"]} == {0, 1}
    assert doc["trials"][0]["role"] == "default" or doc["trials"][1]["role"] == "default"
    done = [r for r in doc["trials"] if not r["error"]]
    assert done and all(r["attrs"]["unit"] == "steps" for r in done)
    assert doc["pareto_front"] and doc["best"]["objective"][1] > 0
    study = optuna.load_study(study_name="study-reporting", storage=f"sqlite:///{tmp_path}/w.db")
    assert study.user_attrs["autotune"]["kind"] == "script"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli.main",
            "study",
            "--trials",
            "2",
            "--workers",
            "3",
            "--storage",
            f"sqlite:///{tmp_path}/w.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--workers 3: allowed 1..--trials (2)" in bad.stderr


class LuckyRuns(FakeRuns):
    """As FakeRuns, but 2 actors with batch 512 is lucky once: 150 steps/J, then 60."""

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        doc, rate = super().__call__(cfg, warmup_s, meter)
        if (cfg.actors, cfg.batch_size) == (2, 512):
            lucky = not any((c.actors, c.batch_size) == (2, 512) for c in self.ran[:-1])
            rate = {**rate, "steps_per_joule": 150.0 if lucky else 60.0}
        return doc, rate


def test_confirmation_trials_measure_a_lucky_leader_again(tmp_path):
    runs = LuckyRuns()
    offline = _study(tmp_path, runs)
    assert offline.step().values == {"actors": 2, "batch_size": 1024}  # the default: 90
    for actors, batch in ((2, 512), (3, 1024), (1, 2048)):
        offline.study.enqueue_trial({"actors": actors, "batch_size": batch})
        assert offline.step().error is None
    assert offline.confirm_pick() == {"actors": 2, "batch_size": 512}  # best, measured once
    picks = []
    for _ in range(4):
        row = offline.step(confirm=True)
        assert row.role == "confirm" and row.error is None
        picks.append(((row.values["actors"], row.values["batch_size"]), row.steps_per_joule))
    # the lucky leader (150, then 60: median 105), then the other two of the top 3, measured
    # once each (better first), then the best median among them, all measured twice
    assert picks == [((2, 512), 60.0), ((3, 1024), 100.0), ((2, 1024), 90.0), ((2, 512), 60.0)]
    trials = offline.study.get_trials(deepcopy=False)
    assert [t.user_attrs["role"] for t in trials[-4:]] == ["confirm"] * 4
    lucky = [
        t.user_attrs["steps_per_joule"]
        for t in trials
        if t.params["actors"] == 2 and t.params["batch_size"] == 512
    ]
    assert sorted(lucky) == [60.0, 60.0, 150.0]  # median 60: no longer the leader
    assert offline.confirm_pick() == {"actors": 3, "batch_size": 1024}


def test_confirmation_without_a_completed_trial_is_an_ordinary_trial(tmp_path):
    offline = _study(tmp_path, FakeRuns())
    assert offline.confirm_pick() is None
    row = offline.step(confirm=True)
    assert row.role == "default" and row.error is None
