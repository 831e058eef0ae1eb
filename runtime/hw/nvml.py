"""The one module that imports ``pynvml``; NVML errors are translated here, at the edge.

``pynvml`` is None where the package is missing. ``nvml_call`` turns ``pynvml.NVMLError`` into
``NVMLUnavailable`` with a message naming what was attempted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    import pynvml
except ImportError:  # pragma: no cover - depends on the environment
    pynvml = None


class NVMLUnavailable(RuntimeError):
    """NVML is missing, failed to initialise, or a call failed."""


def nvml_call(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Calls ``fn(*args)``; an NVML error becomes ``NVMLUnavailable`` about ``what``."""
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise NVMLUnavailable(f"NVML failed to {what}: {exc} ({type(exc).__name__})") from exc


def init() -> None:
    """Initialises NVML (idempotent in NVML itself).

    Raises:
        NVMLUnavailable: No pynvml, or no usable driver.
    """
    if pynvml is None:
        raise NVMLUnavailable("pynvml is not installed (pip install nvidia-ml-py)")
    nvml_call("initialise (is an NVIDIA driver present?)", pynvml.nvmlInit)
