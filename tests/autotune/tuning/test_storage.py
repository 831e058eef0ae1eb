"""Storage URLs in messages and reads that create nothing: a password never shows, and a study
read from a SQLite file that does not exist leaves no file behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.control.status import stored_status
from autotune.tuning.storage import StudyError, load_study, open_study, redact


def test_passwords_in_urls_are_masked():
    url = "postgresql+psycopg://tuner:s3cr%40t!@db.example:5432/studies"
    assert redact(url) == "postgresql+psycopg://tuner:***@db.example:5432/studies"
    assert redact(f"cannot open {url!r}: refused") == (
        "cannot open 'postgresql+psycopg://tuner:***@db.example:5432/studies': refused"
    )
    assert redact("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"
    assert redact("postgresql://tuner@db/x") == "postgresql://tuner@db/x"  # no password
    # a password given as a query parameter, as libpq and SQLAlchemy take one
    query = "postgresql://tuner@db/x?sslmode=require&password=s3cret&application_name=a"
    assert (
        redact(query) == "postgresql://tuner@db/x?sslmode=require&password=***&application_name=a"
    )
    assert "s3cret" not in redact("postgresql://db/x?PASSWORD=s3cret")


def test_an_unreachable_database_is_reported_without_its_password(tmp_path):
    url = "postgresql://tuner:hunter2@127.0.0.1:9/studies"  # nothing listens on port 9
    for call in (lambda: load_study(url, "s"), lambda: open_study(url, "s")):
        with pytest.raises(StudyError) as err:
            call()
        assert "hunter2" not in str(err.value) and "tuner:***@" in str(err.value)
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "export", "--storage", url, "--study", "s"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "hunter2" not in proc.stdout + proc.stderr


def test_reading_a_missing_sqlite_file_creates_nothing(tmp_path):
    db = tmp_path / "none.db"
    url = f"sqlite:///{db}"
    for any_driver in (url, f"sqlite+pysqlite:///{db}"):
        with pytest.raises(StudyError, match=r"no SQLite file .*nothing was created"):
            load_study(any_driver, "s")
    with pytest.raises(StudyError, match="no SQLite file"):
        stored_status(url, "s")
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "export", "--storage", url, "--study", "s"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "no SQLite file" in proc.stdout + proc.stderr
    assert not db.exists()


_TAKER = """
import json, sys
import optuna
from autotune.tuning.storage import ask
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="queue", storage=sys.argv[1])
taken = []
while True:
    trial = ask(study)
    fixed = study._storage.get_trial_system_attrs(trial._trial_id).get("fixed_params")
    if not fixed:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        break
    taken.append(trial.suggest_int("slot", 0, 39))
    study.tell(trial, 1.0)
print(json.dumps(taken))
"""


def test_two_processes_never_take_the_same_enqueued_trial(tmp_path):
    """Optuna pops an enqueued trial with a read and then a write, which SQLite does not lock
    as one step; ``ask`` serialises them, so two workers draining one queue take each trial
    exactly once."""
    import json

    import optuna

    url = f"sqlite:///{tmp_path / 'q.db'}"
    study = optuna.create_study(study_name="queue", storage=url)
    for slot in range(40):
        study.enqueue_trial({"slot": slot})
    procs = [
        subprocess.Popen([sys.executable, "-c", _TAKER, url], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    taken = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        taken += json.loads(out)
    assert sorted(taken) == list(range(40))


def test_a_study_resumed_with_other_values_for_a_knob_or_objective_is_refused(tmp_path):
    """A knob's values, the objective and the kind of study stay what the study was made with:
    refused up front with what differs (a sampler cannot change a parameter's choices; a value
    in other units would be ranked beside the others), and so is a study 'autotune study' did
    not make (a tuned run's)."""
    import optuna

    from autotune.tuning.storage import check_choices
    from autotune.workflows.study import _check_same_kind

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/k.db", study_name="k")
    trial = study.ask()
    trial.suggest_categorical("envs_per_actor", [4, 8])
    study.tell(trial, 1.0)
    check_choices(study, {"envs_per_actor": (4, 8), "actors": (2,)})  # the same; a fixed one
    with pytest.raises(StudyError, match=r"knob envs_per_actor: .* drew from \[4, 8\], not \[4"):
        check_choices(study, {"envs_per_actor": (4, 8, 16)})
    with pytest.raises(
        StudyError, match=r"holds a tuned run's windows \('autotune train --tune'\)"
    ):
        _check_same_kind(study, "steps_per_joule")  # trials, not made by 'autotune study'
    study.set_user_attr("autotune", {"objective": "steps_per_joule"})
    _check_same_kind(study, "steps_per_joule")
    with pytest.raises(StudyError, match="made for --objective steps_per_joule, not steps_per_s"):
        _check_same_kind(study, "steps_per_s")
    study.set_user_attr("wrap", {"cmd": ["python", "x.py"]})
    with pytest.raises(StudyError, match="holds a wrapped script's runs"):
        _check_same_kind(study, "steps_per_joule")


def test_a_storage_another_process_is_setting_up_is_opened_once_it_is_done(tmp_path, monkeypatch):
    """Two processes opening a new SQLite storage at once both create its tables: the one that
    loses hears that a table already exists, or that the database is locked, and opens it
    again; any other failure is the storage's and says so at once."""
    import optuna

    from autotune.tuning import storage_retry
    from autotune.tuning.storage import open_study

    monkeypatch.setattr(storage_retry, "FIRST_WAIT_S", 0.0)
    real, failures = (
        optuna.storages.RDBStorage,
        ["database is locked", "table studies already exists"],
    )

    class Racing(real):  # what the other process's tables do to this one's first opens
        def __init__(self, url, *args, **kwargs):
            if failures:
                raise RuntimeError(failures.pop(0))
            super().__init__(url, *args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Racing)
    assert open_study(f"sqlite:///{tmp_path}/a.db", "s").study_name == "s" and not failures
    failures.append("no such driver")
    with pytest.raises(StudyError, match="no such driver"):
        open_study(f"sqlite:///{tmp_path}/b.db", "s")
    assert failures == []  # tried once


def test_a_missing_sqlite_files_error_never_shows_the_storages_password(tmp_path):
    from autotune.tuning.storage import StudyError, check_readable

    url = f"sqlite+pysqlcipher://:secretpw@/{tmp_path}/none.db"
    with pytest.raises(StudyError) as caught:
        check_readable(url)
    assert "secretpw" not in str(caught.value) and ":***@" in str(caught.value)
