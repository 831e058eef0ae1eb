"""autotune: tunes the CPU actors and GPU trainer slices of RL training for env steps per joule.

The Python API (``autotune.api``): ``train``, ``tune``, ``study`` and ``export``, with their
options ``TrainConfig``, ``TuneOptions`` and ``StudyOptions``. They load on first use, so a
wrapped script's ``from autotune import client`` stays light.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = {
    "train": "autotune.api",
    "tune": "autotune.api",
    "study": "autotune.api",
    "export": "autotune.api",
    "MainGuardError": "autotune.api",
    "TrainConfig": "runtime.config",
    "TuneOptions": "autotune.workflows.tune",
    "StudyOptions": "autotune.workflows.study",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
