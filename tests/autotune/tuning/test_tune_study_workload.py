"""``train --tune --study NAME``: a study keeps one workload's measurements. A study made for
another env or policy is refused, saying whose trials it holds and what to do; one made before
studies recorded their env and policy is taken, with a warning, and recorded."""

from __future__ import annotations

import logging
import subprocess
import sys

import optuna
import pytest

from autotune.tuning.storage import StudyError, open_study
from autotune.workflows.study_workload import WORKLOAD_ATTR
from autotune.workflows.tune import TuneOptions, start_tuning
from runtime.config import TrainConfig

KNOBS = ("actors=1..2", "trainers=1", "trainer_threads=1", "batch_size=512,1024")


def _tune(db: str, env: str = "CartPole-v1", policy: str = "auto"):
    """Opens the online tuning of a run of ``env`` on study ``shared`` (nothing runs)."""
    options = TuneOptions(knobs=KNOBS, storage=db, study="shared", sampler="tpe", in_process=True)
    return start_tuning(options, TrainConfig(env=env, policy=policy), runner=object())


def _measured(db: str) -> None:
    """A window measured in study ``shared``."""
    study = optuna.load_study(study_name="shared", storage=db)
    trial = optuna.trial.create_trial(params={}, distributions={}, value=1.0)
    study.add_trial(trial)


def test_a_study_of_another_env_or_policy_is_refused_saying_whose_it_is(tmp_path):
    db = f"sqlite:///{tmp_path}/t.db"
    _tune(db)
    study = optuna.load_study(study_name="shared", storage=db)
    assert study.user_attrs[WORKLOAD_ATTR] == {"env": "CartPole-v1", "policy": "auto"}
    _measured(db)
    with pytest.raises(StudyError) as refused:
        _tune(db, env="Acrobot-v1")
    said = str(refused.value)
    assert "study 'shared' holds trials of --env CartPole-v1 --policy auto" in said
    assert "not of this run's --env Acrobot-v1 --policy auto" in said
    assert "give another --study name" in said and "or run --env CartPole-v1" in said
    with pytest.raises(StudyError, match="not of this run's --env CartPole-v1 --policy 4:32:2"):
        _tune(db, policy="4:32:2")
    _tune(db)  # the same workload goes on with it
    _tune(db, policy="4:64:64:2")  # CartPole-v1's default network spelled out is the same
    _tune(db, policy="auto:64:64:auto")
    # a study ``autotune study`` made records its env and policy too
    made = open_study(db, "offline")
    made.set_user_attr("autotune", {"env": "Acrobot-v1", "policy": "auto", "objective": "x"})
    options = TuneOptions(knobs=KNOBS, storage=db, study="offline", sampler="tpe")
    with pytest.raises(StudyError, match="'offline' holds trials of --env Acrobot-v1"):
        start_tuning(options, TrainConfig(), runner=object())
    # and a wrapped script's study, made by 'autotune wrap' or 'autotune study -- CMD'
    for name, attr in (("w", "wrap"), ("s", "autotune")):
        open_study(db, name).set_user_attr(attr, {"kind": "script", "cmd": ["python", "x.py"]})
        options = TuneOptions(knobs=KNOBS, storage=db, study=name, sampler="tpe")
        with pytest.raises(StudyError, match=f"'{name}' holds a wrapped script's runs"):
            start_tuning(options, TrainConfig(), runner=object())


def test_a_study_made_before_workloads_were_recorded_is_taken_with_a_warning(tmp_path, caplog):
    db = f"sqlite:///{tmp_path}/t.db"
    open_study(db, "shared")
    _measured(db)
    with caplog.at_level(logging.WARNING, logger="autotune.workflows.tune"):
        _tune(db, env="Acrobot-v1")
    assert "study 'shared' records no env or policy" in caplog.text
    assert "its 1 trials are taken as --env Acrobot-v1 --policy auto's" in caplog.text
    study = optuna.load_study(study_name="shared", storage=db)
    assert study.user_attrs[WORKLOAD_ATTR] == {"env": "Acrobot-v1", "policy": "auto"}
    with pytest.raises(StudyError, match="holds trials of --env Acrobot-v1"):
        _tune(db)  # recorded now: another env is refused from here on


def test_train_tune_refuses_a_study_of_another_env_before_it_probes(tmp_path):
    """The CLI says so before it sizes the run: no probe is paid for a run that cannot tune."""
    db = f"sqlite:///{tmp_path}/t.db"
    _tune(db)
    cmd = [sys.executable, "-m", "autotune.cli", "train", "--tune", "--in-process", "--quiet"]
    cmd += ["--env", "Acrobot-v1", "--storage", db, "--study", "shared", "--steps", "1000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    said = " ".join(out.stderr.split())
    assert "study 'shared' holds trials of --env CartPole-v1 --policy auto" in said, said
    assert "sizing" not in said and "probe" not in said
