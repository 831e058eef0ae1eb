"""The one module that imports ``pynvml``; NVML errors are translated here, at the edge.

``pynvml`` is None where the package is missing. Every NVML call in the project goes through
``nvml_call`` (which turns ``pynvml.NVMLError`` into ``NVMLUnavailable`` with a message naming
what was attempted) or ``nvml_optional`` (None where NVML cannot answer); nothing else catches
``pynvml.NVMLError``.
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


def nvml_optional(fn: Callable[..., Any], *args: Any) -> Any:
    """Calls ``fn(*args)``; None where NVML fails (a reading this GPU or driver may lack)."""
    try:
        return nvml_call("read an optional value", fn, *args)
    except NVMLUnavailable:
        return None


def init() -> None:
    """Initialises NVML (idempotent in NVML itself).

    Raises:
        NVMLUnavailable: No pynvml, or no usable driver.
    """
    if pynvml is None:
        raise NVMLUnavailable("pynvml is not installed (pip install nvidia-ml-py)")
    nvml_call("initialise (is an NVIDIA driver present?)", pynvml.nvmlInit)
