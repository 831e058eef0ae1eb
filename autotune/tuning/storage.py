"""The Optuna side of tuning, shared by the online tuner, ``wrap`` and ``study``: opening a
study in an RDB storage, the key a config is remembered by, and the rules every tuner keeps on
a resumed study.

A study is created or loaded by name (``load_if_exists``), so a rerun, a restarted daemon or
``autotune status`` see the same trials. Storage is any SQLAlchemy URL (SQLite by default; a
relative SQLite path is made absolute, so a daemon elsewhere opens the same file).

Rules: trials left RUNNING by a tuner that died are failed (``fail_orphans``); a config that
failed (a FAIL trial with an ``error``) more than a tuner's ``retries`` times (none for the
runtime's tuners; once for ``wrap``, whose failures may be a busy machine) is never tried
again (``failed_configs``, ``skip_if_failed``, ``fail_config``); a trial's knob values are its
params, or its ``values`` user attribute where fixed knobs were not suggested.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
from optuna.trial import TrialState

from autotune.tuning.storage_retry import opened
from autotune.tuning.url_secrets import failure_text, redact
from runtime.child_start import without_ctrl_c  # a run's Ctrl-C is its main thread's

__all__ = [
    "StudyError",
    "ask",
    "config_errors",
    "config_key",
    "fail_config",
    "fail_interrupted",
    "fail_orphans",
    "failed_configs",
    "killed_before",
    "load_study",
    "open_study",
    "redact",
    "skip_if_failed",
    "storage_url",
    "trial_values",
]

logger = logging.getLogger(__name__)


class StudyError(ValueError):
    """A storage that cannot be opened, or a study that cannot be created or loaded."""


def check_choices(study: optuna.Study, choices: dict[str, Any]) -> None:
    """Refuses ``study`` where a knob tuned now (two values or more) was drawn from other values
    in its trials: a study's sampler cannot change a parameter's choices.

    Raises:
        StudyError: naming the knob, the values its trials drew from, and what to do."""
    for name, values in choices.items():
        if len(values) < 2:  # a fixed value is not drawn
            continue
        for trial in study.get_trials(deepcopy=False):
            dist = trial.distributions.get(name)
            if dist is not None and tuple(getattr(dist, "choices", ())) != tuple(values):
                raise StudyError(
                    f"knob {name}: its trials in study {study.study_name!r} drew from "
                    f"{list(dist.choices)}, not {list(values)}; a study keeps a knob's values "
                    "(even resumed): give the old values, or a new --study name"
                )


class _AskTellGrid(optuna.samplers.GridSampler):
    """A grid sampler for ask/tell: Optuna's calls ``Study.stop`` once the grid is done, which
    only works inside ``Study.optimize``; the tuner counts the grid's trials itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def open_study(
    storage: str,
    name: str,
    seed: int | None = None,
    grid: dict[str, list[Any]] | None = None,
    metrics: tuple[str, ...] = (),
    sampler: optuna.samplers.BaseSampler | None = None,
) -> optuna.Study:
    """Creates or loads the study ``name`` in the RDB storage URL ``storage``, every objective
    maximised, with ``sampler``, else a TPE sampler (which honours constraints set on trials),
    or a grid sampler over ``grid``. ``metrics`` names the objectives (two or more make a
    multi-objective study; the names show in optuna-dashboard); an existing study must have the
    same number.

    Raises:
        StudyError: saying which URL or study failed and why.
    """
    if sampler is None:
        sampler = (
            optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
            if grid is None
            else _AskTellGrid(grid, seed=seed)
        )
    storage = storage_url(storage)
    try:  # tried again where another process is making the same tables (``storage_retry``)
        study = opened(
            lambda: optuna.create_study(
                storage=optuna.storages.RDBStorage(storage),
                study_name=name,
                directions=["maximize"] * max(1, len(metrics)),
                sampler=sampler,
                load_if_exists=True,
            )
        )
    except Exception as exc:  # SQLAlchemy and Optuna raise many kinds; all mean "cannot open"
        raise StudyError(
            f"cannot open study {name!r} in storage {redact(storage)!r}: "
            f"{failure_text(exc, storage)}"
        ) from None
    if len(study.directions) != max(1, len(metrics)):
        had = study.metric_names or [f"{len(study.directions)} objectives"]
        raise StudyError(
            f"study {name!r} in {redact(storage)!r} has objectives {had}, not "
            f"{list(metrics)}; use its objective or a new --study name"
        )
    if metrics and study.metric_names is None:
        with warnings.catch_warnings():  # experimental in Optuna 3.2+, and what the dashboard reads
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(metrics))
    return study


def load_study(storage: str, name: str) -> optuna.Study:
    """An existing study, to read (a SQLite file that does not exist is not created).

    Raises:
        StudyError: the storage cannot be opened or has no such study (the ones it has named).
    """
    check_readable(storage)
    storage = storage_url(storage)
    try:
        names = opened(lambda: optuna.get_all_study_names(storage=storage))
    except Exception as exc:  # SQLAlchemy and Optuna raise many kinds; all mean "cannot open"
        raise StudyError(
            f"cannot open storage {redact(storage)!r}: {failure_text(exc, storage)}"
        ) from None
    if name not in names:
        raise StudyError(
            f"no study {name!r} in {redact(storage)!r}; studies there: {', '.join(names) or 'none'}"
        )
    return optuna.load_study(study_name=name, storage=storage)


def check_readable(storage: str) -> None:
    """Refuses a SQLite URL whose file does not exist (opening it would create an empty one).

    Raises:
        StudyError: naming the file.
    """
    path = sqlite_file(storage)
    if path is not None and not path.is_file():
        raise StudyError(
            f"no SQLite file {str(path)!r} (from {redact(storage)!r}); nothing was created: "
            "give the --storage a study was run with"
        )


def config_key(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True)


CONNECT_TIMEOUT_S = 10
"""A database server's connection attempt gives up after this long (``connect_timeout``, where
the URL names none): a server that takes the connection and never answers must not hang the
daemon or a run."""


def storage_url(url: str) -> str:
    """The URL Optuna opens: ``sqlite:///relative.db`` made absolute against this directory,
    ``postgresql://`` given the psycopg (3) driver of the ``postgres`` extra; a PostgreSQL or
    MySQL URL gets ``connect_timeout`` where it names none; others unchanged."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and url != prefix + ":memory:":
        return prefix + str(Path(url[len(prefix) :]).resolve())
    if url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith(("postgresql", "mysql")) and "connect_timeout=" not in url:
        url += ("&" if "?" in url else "?") + f"connect_timeout={CONNECT_TIMEOUT_S}"
    return url


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL of any driver (``sqlite:///``, ``sqlite+pysqlite:///``; made
    absolute), or None for another database, memory, or what is not a URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(storage_url(url))
    except (ArgumentError, ValueError):
        return None
    name = parsed.database
    if parsed.get_backend_name().lower() != "sqlite" or not name or name == ":memory:":
        return None
    return Path(name).absolute()


def trial_values(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    return dict(t.user_attrs.get("values", t.params))


def owner_id() -> str:
    """This process, as trials record it in ``owner``: host, pid and process start time."""
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


BEAT_S = 30.0
"""How often a process marks the trials it runs as alive (``beat`` user attribute)."""
STALE_S = 150.0
"""A running trial of another host whose ``beat`` is older than this is orphaned."""
ASK_GRACE_S = 60.0
"""A running trial with no ``owner`` yet may be inside another process's ``ask`` (between
``study.ask()`` and its first attribute): orphaned only this long after it started."""


def ask(study: optuna.Study) -> optuna.trial.Trial:
    """``study.ask()``, the trial marked as this process's (``owner``: host, pid and start
    time) and kept alive (``beat``, every ``BEAT_S`` by a thread, until it is finished): so
    ``fail_orphans`` in other processes and on other hosts leaves it alone while this lives."""
    with _ask_lock(study):
        trial = study.ask()
    trial.set_user_attr("owner", owner_id())
    trial.set_user_attr("beat", time.time())
    storage, trial_id = study._storage, trial._trial_id

    def beat() -> None:
        while True:
            time.sleep(BEAT_S)
            try:
                if storage.get_trial(trial_id).state != TrialState.RUNNING:
                    return
                storage.set_trial_user_attr(trial_id, "beat", time.time())
            except Exception:  # finished meanwhile, or the storage is gone: stop beating
                return

    without_ctrl_c(threading.Thread(target=beat, name=f"trial-{trial.number}-beat", daemon=True))
    return trial


@contextlib.contextmanager
def _ask_lock(study: optuna.Study) -> Iterator[None]:
    """Serialises ``study.ask()`` among the processes of this host that share a SQLite file.
    Optuna pops a waiting (enqueued) trial by reading it WAITING and then setting it RUNNING;
    on SQLite, which has no row locks, two processes can both read it WAITING and both run it.
    An ``flock`` on ``<file>.ask-lock`` makes the read and the write one step. Server
    databases lock the row themselves, and memory storages live in one process."""
    backend = getattr(study._storage, "_backend", study._storage)
    url = getattr(backend, "url", None)
    path = sqlite_file(url) if isinstance(url, str) else None
    if path is None:
        yield
        return
    fd = os.open(f"{path}.ask-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _orphaned(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a RUNNING trial's process is gone: on this host, a process that no longer runs;
    on another, one whose ``beat`` is older than ``STALE_S``; with no owner recorded, one that
    started more than ``ASK_GRACE_S`` ago."""
    attrs = trial.user_attrs
    owner = attrs.get("owner")
    if owner is None:
        started = trial.datetime_start  # optuna's: naive local time
        age_s = (datetime.datetime.now() - started).total_seconds() if started else float("inf")
        return age_s > ASK_GRACE_S
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname():
        return time.time() - float(attrs.get("beat", 0.0)) > STALE_S
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" != started
    except (psutil.NoSuchProcess, ValueError):
        return True


def fail_orphans(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials left RUNNING by a tuner that died are failed as interrupted (resume after a
    crash: their configs are not marked bad) and returned, for the caller to run again in
    their roles; trials other live processes are running (workers, a daemon) are left alone."""
    orphans = [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if _orphaned(t)
    ]
    for t in orphans:
        study._storage.set_trial_user_attr(t._trial_id, "interrupted", "its tuner's process died")
        study.tell(t.number, state=TrialState.FAIL)
        logger.warning("trial %d was left running (its tuner ended); marked failed", t.number)
    return orphans


def failed_configs(study: optuna.Study, retries: int = 0) -> set[str]:
    """Keys of the configs that failed more than ``retries`` times (FAIL trials with an
    ``error``; not interrupted ones): those not to be tried again."""
    return {key for key, errors in config_errors(study).items() if len(errors) > retries}


def config_errors(study: optuna.Study) -> dict[str, list[str]]:
    """Each config's errors, oldest first (its FAIL trials with an ``error``)."""
    out: dict[str, list[str]] = {}
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.FAIL and "error" in t.user_attrs:
            out.setdefault(config_key(trial_values(t)), []).append(str(t.user_attrs["error"]))
    return out


def skip_if_failed(
    study: optuna.Study, trial: optuna.trial.Trial, values: dict[str, Any], failed: set[str]
) -> bool:
    """Tells ``trial`` failed without trying it if ``values`` failed before; True if so."""
    if config_key(values) not in failed:
        return False
    trial.set_user_attr("skipped", "this config failed before; not tried again")
    study.tell(trial, state=TrialState.FAIL)
    return True


def fail_config(
    study: optuna.Study,
    trial: optuna.trial.Trial | None,
    values: dict[str, Any],
    error: str,
    failed: set[str],
    retries: int = 0,
    unmetered: bool = False,
) -> bool:
    """Tells ``trial`` (if any) failed with ``error``; marks ``values`` failed for good once
    they have failed more than ``retries`` times. True if they may be tried again.
    ``unmetered`` (the meters read nothing): the first time, maybe the meter's gap, the trial
    fails as ``unmetered`` and is enqueued to run once more, next; the second time the config
    is marked bad. A window with no trial (a recheck of the best, metered before): nothing."""
    key = config_key(values)
    if unmetered and trial is None:
        return True
    if unmetered and not _unmetered_before(study, key):
        trial.set_user_attr("unmetered", error)
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial({k: v for k, v in values.items() if k in trial.params})
        return True
    if trial is not None:
        trial.set_user_attr("error", error)
        study.tell(trial, state=TrialState.FAIL)
    if len(config_errors(study).get(key, [])) > retries or trial is None:
        failed.add(key)
        return False
    return True


def _unmetered_before(study: optuna.Study, key: str) -> bool:
    return any(
        "unmetered" in t.user_attrs and config_key(trial_values(t)) == key
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    )


def killed_before(study: optuna.Study, values: dict[str, Any]) -> bool:
    """Whether a trial of ``values`` was killed from outside before (``killed`` attribute)."""
    key = config_key(values)
    return any(
        "killed" in t.user_attrs and config_key(trial_values(t)) == key
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    )


def fail_interrupted(study: optuna.Study, trial: optuna.trial.Trial, reason: str) -> None:
    """Tells ``trial`` failed because its run was cut (Ctrl-C, the job ended); its config is
    not marked bad."""
    trial.set_user_attr("interrupted", reason)
    study.tell(trial, state=TrialState.FAIL)


def prune(study: optuna.Study, trial: optuna.trial.Trial, reason: str) -> None:
    """Tells ``trial`` pruned: not measured, for ``reason`` (kept as its ``pruned`` attribute);
    its config is not marked bad."""
    trial.set_user_attr("pruned", reason)
    study.tell(trial, state=TrialState.PRUNED)
