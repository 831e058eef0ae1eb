"""Shared test set-up: the ``gpu`` marker skips where NVML or CUDA is absent."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def _gpu_missing_reason() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # NVML raises its own types; any failure means no usable GPU
        return f"no usable NVML here ({exc})"
    if count == 0:
        return "NVML reports no GPUs"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or _gpu_missing_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
