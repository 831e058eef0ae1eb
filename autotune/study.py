"""The Optuna side of tuning: opening a study in an RDB storage, and the key a config is
remembered by.

A study is created or loaded by name (``load_if_exists``), so a rerun, a restarted daemon or
``autotune status`` see the same trials. Storage is any SQLAlchemy URL (SQLite by default).
"""

from __future__ import annotations

import json
from typing import Any

import optuna

__all__ = ["StudyError", "config_key", "open_study"]


class StudyError(ValueError):
    """A storage that cannot be opened, or a study that cannot be created or loaded."""


class _AskTellGrid(optuna.samplers.GridSampler):
    """A grid sampler for ask/tell: Optuna's calls ``Study.stop`` once the grid is done, which
    only works inside ``Study.optimize``; the tuner counts the grid's trials itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def open_study(storage: str, name: str, seed: int | None = None,
               grid: dict[str, list[Any]] | None = None) -> optuna.Study:  # fmt: skip
    """Creates or loads the study ``name`` (maximize) in the RDB storage URL ``storage``, with
    a TPE sampler (which honours constraints set on trials), or a grid sampler over ``grid``.

    Raises:
        StudyError: saying which URL or study failed and why.
    """
    sampler: optuna.samplers.BaseSampler = (
        optuna.samplers.TPESampler(seed=seed, n_startup_trials=5) if grid is None
        else _AskTellGrid(grid, seed=seed))  # fmt: skip
    try:
        rdb = optuna.storages.RDBStorage(storage)
        return optuna.create_study(storage=rdb, study_name=name, direction="maximize",
                                   sampler=sampler, load_if_exists=True)  # fmt: skip
    except Exception as exc:  # SQLAlchemy and Optuna raise many kinds; all mean "cannot open"
        raise StudyError(f"cannot open study {name!r} in storage {storage!r}: "
                         f"{type(exc).__name__}: {exc}") from None  # fmt: skip


def config_key(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True)
