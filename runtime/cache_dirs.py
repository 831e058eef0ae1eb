"""Where the tool keeps what it measured or built for this machine: ``$AUTOTUNE_CACHE_DIR``,
else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``. The probe results live in its
``probes`` folder (``runtime.probe_cache``), the learner's compiled loss kernels in its
``inductor`` folder (``policies.compiled_loss``), the installed EnvPool's ids in
``envpool-ids.json`` (``runtime.envpool_index``), version-0 weights in ``initial-weights``
(``runtime.initial_weights``)."""

from __future__ import annotations

import os
from pathlib import Path

KERNEL_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_root() -> Path:
    """The tool's cache folder (see the module docstring)."""
    if os.environ.get("AUTOTUNE_CACHE_DIR"):
        return Path(os.environ["AUTOTUNE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autotune"


def use_kernel_cache() -> Path | None:
    """Points TorchInductor's cache at the tool's ``inductor`` folder unless
    ``TORCHINDUCTOR_CACHE_DIR`` is set already, and returns the folder in use (None: no home
    folder to put it in, TorchInductor's default stands). Call before a
    learner compiles: its loss is then compiled once per machine and cache, and a benchmark that
    gives each run a cache folder of its own compiles afresh in each."""
    if KERNEL_CACHE_ENV not in os.environ:
        try:
            os.environ[KERNEL_CACHE_ENV] = str(cache_root() / "inductor")
        except RuntimeError:  # no home folder to keep it in: TorchInductor's own default
            return None
    return Path(os.environ[KERNEL_CACHE_ENV])


def cpu_model() -> str:
    """This machine's CPU model (``/proc/cpuinfo``'s model name), for keys of what is kept per
    machine (the probes, the version-0 weights)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
