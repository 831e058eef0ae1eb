"""Where the tool keeps what it measured or built for this machine: ``$AUTOTUNE_CACHE_DIR``,
else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``. The probe results live in its
``probes`` folder (``runtime.probe_cache``), the learner's compiled loss kernels in its
``inductor`` folder (``policies.compiled_loss``), the installed EnvPool's ids in
``envpool-ids.json`` (``runtime.envpool_index``), version-0 weights in ``initial-weights``
(``runtime.initial_weights``), and, where the installed torch has no bytecode and Python cannot
write it beside the sources, the bytecode of the run's processes' imports in ``bytecode``
(``use_bytecode_cache``)."""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import sys
from pathlib import Path

KERNEL_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
BYTECODE_ENV = "PYTHONPYCACHEPREFIX"

logger = logging.getLogger(__name__)


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


def use_bytecode_cache(module: str = "torch") -> Path | None:
    """Points the bytecode cache of the processes this one starts afterwards at the tool's
    ``bytecode`` folder (``PYTHONPYCACHEPREFIX``, in this process's environment from then on)
    where ``module``, as installed, has no bytecode and Python could not write it beside the
    sources (a read-only site-packages, as container images and shared installs often have);
    returns the folder in use, or None where nothing was changed.

    Without bytecode every process compiles each module it imports from source again: on an
    H200 16-core host whose torch had none, a later run's trainer started in 11.2-12.6 s, and
    in 5.2-7.8 s once the site-packages were byte-compiled (docs/BENCHMARKS.md, "Where a run's
    start-up goes"). With the folder, the first run writes the bytecode and later runs read it.
    A prefix makes Python read bytecode only there, so the first run compiles every module its
    processes import, those that had bytecode beside them too; an install whose ``module`` has
    its bytecode (what ``pip install`` leaves) is left as it is. So is a prefix already set (one
    given with ``-X pycache_prefix`` is passed on to the processes started afterwards, which
    would not get it otherwise), and a user's ``PYTHONDONTWRITEBYTECODE`` or ``-B``, which ask
    for no bytecode to be written (``bytecode_note`` then says what to do)."""
    if os.environ.get(BYTECODE_ENV):
        return Path(os.environ[BYTECODE_ENV])
    if sys.pycache_prefix is not None:
        os.environ[BYTECODE_ENV] = sys.pycache_prefix
        return Path(sys.pycache_prefix)
    if sys.flags.dont_write_bytecode:
        return None
    cached = _missing_bytecode(module)
    if cached is None or _writable(cached.parent):
        return None
    try:
        folder = bytecode_folder()
        folder.mkdir(parents=True, exist_ok=True)
    except (RuntimeError, OSError):  # no folder to keep it in: the imports compile as before
        return None
    os.environ[BYTECODE_ENV] = str(folder)
    logger.info(
        "%s is installed without bytecode: the run's imports keep theirs in %s", module, folder
    )
    return folder


def bytecode_note(module: str = "torch") -> str | None:
    """What to tell the user where ``module`` is installed without bytecode and Python is told
    to write none (``PYTHONDONTWRITEBYTECODE`` or ``-B``): the run's processes then compile the
    modules they import from source, and the tool keeps to what it was told. None where the
    bytecode is there, or can be kept (``use_bytecode_cache``)."""
    if os.environ.get(BYTECODE_ENV) or sys.pycache_prefix is not None:
        return None
    if not sys.flags.dont_write_bytecode:
        return None
    cached = _missing_bytecode(module)
    if cached is None:
        return None
    said = (
        f"{module} is installed without bytecode, and PYTHONDONTWRITEBYTECODE (or -B) keeps "
        f"Python from writing it: every process of this run compiles {module}'s modules from "
        "source again (about 6 s of a GPU trainer's start on an H200 host). "
    )
    site = site_of(module)
    if site is not None and _writable(cached.parent):
        return (
            said
            + "Compile them once, as pip install does: "
            + shlex.join([sys.executable, "-m", "compileall", "-q", "-j", "0", str(site)])
        )
    return said + (
        "Without PYTHONDONTWRITEBYTECODE, the run's processes keep their bytecode in "
        f"{_folder_said()} (its folder cannot be written)"
    )


def site_of(module: str) -> Path | None:
    """The folder ``module`` is installed in (site-packages, for an installed package), or
    None where it is not found."""
    spec = _spec(module)
    if spec is None or not spec.origin:
        return None
    origin = Path(spec.origin)
    return origin.parent.parent if spec.submodule_search_locations else origin.parent


def bytecode_folder() -> Path:
    """The tool's folder for the bytecode of an install that has none (``use_bytecode_cache``).

    Raises:
        RuntimeError: no home folder to put it in.
    """
    return cache_root() / "bytecode"


def _folder_said() -> str:
    try:
        return str(bytecode_folder())
    except RuntimeError:
        return "the tool's cache folder"


def _spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a broken or half-imported module: nothing to say of it
        return None


def _missing_bytecode(module: str) -> Path | None:
    """Where the bytecode of ``module``'s first source file would be, where it is missing;
    None where it is there, or ``module`` is not installed from source."""
    spec = _spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    cached = Path(importlib.util.cache_from_source(spec.origin))
    return None if cached.exists() else cached


def _writable(folder: Path) -> bool:
    """Whether Python could write bytecode in ``folder`` (made if missing, as it would)."""
    probe = folder if folder.exists() else folder.parent
    return os.access(probe, os.W_OK | os.X_OK)


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
