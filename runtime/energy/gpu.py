"""GPU energy sources behind one small interface, chosen once by a cached probe.

Every NVML call goes through ``runtime.hw.nvml`` (the project's only ``pynvml`` import, where
NVML errors become ``NVMLUnavailable``); a failed reading reaches this module's callers as
:class:`GPUEnergyError`, with the same message, so no caller needs to know about NVML.

Three implementations, in order of preference (the Zeus pattern):

* :class:`NVMLEnergy` (source ``"nvml"``): the driver's cumulative energy counter,
  ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules, Volta and newer).
* :class:`NVMLPowerPollingEnergy` (source ``"nvml-power-polling"``): for GPUs without
  the counter, a daemon thread samples ``nvmlDeviceGetPowerUsage`` (milliwatts)
  every 50 ms and integrates with the trapezoidal rule.
* :class:`NullGPUEnergy` (source ``"none"``): no NVML or no GPUs; reports nothing.

GPU indices are NVML indices, which need not match CUDA's ordering under
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from runtime.child_start import without_ctrl_c
from runtime.hw import nvml

logger = logging.getLogger(__name__)

POWER_POLL_INTERVAL_S = 0.05
"""Sampling period of :class:`NVMLPowerPollingEnergy`."""


class GPUEnergyError(RuntimeError):
    """A GPU energy reading could not be taken (NVML failed or is unsupported)."""


def _nvml(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``nvml.nvml_call``, its ``NVMLUnavailable`` raised as :class:`GPUEnergyError` (same
    message, and the NVML error as the cause)."""
    try:
        return nvml.nvml_call(what, fn, *args)
    except nvml.NVMLUnavailable as exc:
        raise GPUEnergyError(str(exc)) from exc.__cause__


class GPUEnergySource:
    """Base interface of a GPU energy source.

    Attributes:
        source: ``"nvml"``, ``"nvml-power-polling"`` or ``"none"``.
        gpu_indices: NVML indices of the GPUs this source reports.
    """

    source: str = "none"

    def __init__(self, gpu_indices: Iterable[int] = ()) -> None:
        self.gpu_indices: list[int] = list(gpu_indices)

    @property
    def sources(self) -> dict[int, str]:
        """The measuring method per GPU index."""
        return dict.fromkeys(self.gpu_indices, self.source)

    def read_energy_j(self) -> dict[int, float]:
        """Returns cumulative joules per GPU since an arbitrary, fixed origin."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases resources (threads). Readings after close are undefined."""


class NullGPUEnergy(GPUEnergySource):
    """Source used when NVML or GPUs are absent: reports no GPUs."""

    source = "none"

    def read_energy_j(self) -> dict[int, float]:
        """Returns an empty dict."""
        return {}


class NVMLEnergy(GPUEnergySource):
    """Reads the NVML cumulative energy counter of every GPU that supports it.

    Support is asked once per GPU, at construction, by trying a read. GPUs whose
    read fails are left out of ``gpu_indices`` and listed in ``unsupported_indices``
    so the caller can cover them another way. ``nvmlInit`` must have been called.

    Args:
        gpu_indices: NVML indices of the GPUs to read.
    """

    source = "nvml"

    def __init__(self, gpu_indices: Iterable[int]) -> None:
        super().__init__()
        self.unsupported_indices: list[int] = []
        self._handles: dict[int, Any] = {}
        for index in gpu_indices:
            handle = _nvml(
                f"get handle of GPU {index}", nvml.pynvml.nvmlDeviceGetHandleByIndex, index
            )
            try:
                self._read_mj(index, handle)
            except GPUEnergyError as exc:
                logger.info("GPU %d has no usable energy counter: %s", index, exc)
                self.unsupported_indices.append(index)
                continue
            self._handles[index] = handle
            self.gpu_indices.append(index)

    def read_energy_j(self) -> dict[int, float]:
        """Returns the driver's cumulative energy per GPU in joules.

        Raises:
            GPUEnergyError: If a read fails.
        """
        return {i: self._read_mj(i, h) / 1000.0 for i, h in self._handles.items()}

    @staticmethod
    def _read_mj(index: int, handle: Any) -> float:
        what = f"read total energy of GPU {index}"
        return _nvml(what, nvml.pynvml.nvmlDeviceGetTotalEnergyConsumption, handle)


class NVMLPowerPollingEnergy(GPUEnergySource):
    """Integrates polled NVML power draw for GPUs without an energy counter.

    A daemon thread samples every ``interval_s``; each sampled power is held until the next
    sample, and a read adds the time since the last sample at that power, by the same rule,
    so the cumulative value never goes backwards and a read between samples is what the next
    sample will have counted to that moment. Failed samples are skipped (logged once); the
    next good sample integrates over the gap at the last power. ``nvmlInit`` must have been
    called.

    Args:
        gpu_indices: NVML indices of the GPUs to poll.
        interval_s: Sampling period in seconds.

    Raises:
        GPUEnergyError: If a handle or the first power sample cannot be read.
    """

    source = "nvml-power-polling"

    def __init__(self, gpu_indices: Iterable[int], interval_s: float = POWER_POLL_INTERVAL_S):
        super().__init__(gpu_indices)
        self._interval_s = interval_s
        self._handles = {
            i: _nvml(f"get handle of GPU {i}", nvml.pynvml.nvmlDeviceGetHandleByIndex, i)
            for i in self.gpu_indices
        }
        self._lock = threading.Lock()
        self._energy_j = dict.fromkeys(self.gpu_indices, 0.0)
        self._last_power_w = {i: self._read_power_w(i) for i in self.gpu_indices}
        self._last_t = dict.fromkeys(self.gpu_indices, time.monotonic())
        self._warned = False
        self._stop = threading.Event()
        poll = threading.Thread(target=self._run, name="nvml-power-poll", daemon=True)
        self._thread = without_ctrl_c(poll)

    def _read_power_w(self, index: int) -> float:
        power_mw = _nvml(
            f"read power of GPU {index}", nvml.pynvml.nvmlDeviceGetPowerUsage, self._handles[index]
        )
        return power_mw / 1000.0

    def _sample(self) -> None:
        for index in self.gpu_indices:
            try:
                power_w = self._read_power_w(index)
            except GPUEnergyError as exc:
                if not self._warned:
                    logger.warning("Skipping failed power sample(s): %s", exc)
                    self._warned = True
                continue
            now = time.monotonic()
            with self._lock:
                elapsed_s = now - self._last_t[index]
                self._energy_j[index] += self._last_power_w[index] * elapsed_s  # as reads do
                self._last_power_w[index] = power_w
                self._last_t[index] = now

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def read_energy_j(self) -> dict[int, float]:
        """Returns integrated energy per GPU in joules since construction."""
        now = time.monotonic()
        with self._lock:
            return {
                i: self._energy_j[i] + self._last_power_w[i] * max(0.0, now - self._last_t[i])
                for i in self.gpu_indices
            }

    def close(self) -> None:
        """Stops the polling thread."""
        self._stop.set()
        self._thread.join(timeout=1.0)


class _CombinedGPUEnergy(GPUEnergySource):
    """Counter GPUs and polled GPUs reported as one source.

    ``source`` is ``"nvml-power-polling"``: the label names the weakest method used.
    ``sources`` gives the method per GPU.
    """

    source = "nvml-power-polling"

    def __init__(self, parts: list[GPUEnergySource]) -> None:
        super().__init__(sorted(i for part in parts for i in part.gpu_indices))
        self._parts = parts

    @property
    def sources(self) -> dict[int, str]:
        """The measuring method per GPU index."""
        return {i: part.source for part in self._parts for i in part.gpu_indices}

    def read_energy_j(self) -> dict[int, float]:
        """Returns the merged readings of all parts."""
        merged: dict[int, float] = {}
        for part in self._parts:
            merged.update(part.read_energy_j())
        return merged

    def close(self) -> None:
        """Closes all parts."""
        for part in self._parts:
            part.close()


@functools.cache
def probe_gpu_energy(gpu_indices: tuple[int, ...] | None = None) -> GPUEnergySource:
    """Chooses the best GPU energy source once per argument and caches it.

    The result is shared by every caller: do not ``close()`` it before process
    exit. NVML stays initialised for the life of the process.

    Args:
        gpu_indices: NVML indices to measure; ``None`` means every GPU.

    Returns:
        An :class:`NVMLEnergy` if every GPU has the energy counter, an
        :class:`NVMLPowerPollingEnergy` if none has, a combination of both if some
        have, or :class:`NullGPUEnergy` when pynvml, NVML or GPUs are missing.

    Raises:
        GPUEnergyError: If an index does not exist or NVML fails after init.
    """
    if nvml.pynvml is None:
        logger.info("GPU energy: pynvml is not importable; GPU energy is not measured")
        return NullGPUEnergy()
    try:
        nvml.init()
        count = nvml.nvml_call("count GPUs", nvml.pynvml.nvmlDeviceGetCount)
    except nvml.NVMLUnavailable as exc:
        logger.info("GPU energy: NVML unavailable (%s); GPU energy is not measured", exc)
        return NullGPUEnergy()
    if count == 0:
        logger.info("GPU energy: NVML sees no GPUs; GPU energy is not measured")
        return NullGPUEnergy()
    indices = list(range(count)) if gpu_indices is None else list(gpu_indices)
    missing = [i for i in indices if not 0 <= i < count]
    if missing:
        raise GPUEnergyError(f"GPU indices {missing} do not exist; NVML sees {count} GPU(s)")
    counter = NVMLEnergy(indices)
    if not counter.unsupported_indices:
        logger.info("GPU energy: NVML energy counter on GPUs %s", counter.gpu_indices)
        return counter
    polling = NVMLPowerPollingEnergy(counter.unsupported_indices)
    logger.info(
        "GPU energy: falling back to power polling every %.0f ms on GPUs %s",
        POWER_POLL_INTERVAL_S * 1000,
        polling.gpu_indices,
    )
    if not counter.gpu_indices:
        return polling
    return _CombinedGPUEnergy([counter, polling])
