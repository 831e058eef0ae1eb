"""Probes kept between runs: a workload probed on this machine is not probed again for a week.

A run's probes (``runtime.probes``) take a few seconds, most of them the child's torch import
and, on a GPU, its CUDA start-up. The results are stored as JSON under the cache directory
(``$AUTOTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``), one
file per workload and machine: the key hashes the probe spec (env, policy, rollout length,
the learner settings an update's work depends on, devices) with what the costs depend on here
(host name, CPU model, the host's core count, the names of the GPUs CUDA may use here as
``CUDA_VISIBLE_DEVICES`` shows them, the Python, torch, numpy, gymnasium and EnvPool versions).
The host's cores, not the affinity mask's: a job the daemon gives some of the cores keeps the
probes of that workload measured for the whole machine. The costs are the same per core, and
the loaded actor round is timed with every core of the mask busy, as the machine is when jobs
share it. Keyed on the mask, each arriving job probed again for about 20 s, on cores it was
given to train on, beside the running jobs.
An entry older than ``MAX_AGE_S``, one that cannot be read back (not an object, a cost that is
not a finite number above 0), one without the GPU learner a run that sees a GPU asks for
(probes whose CUDA did not start are not kept: they would size every run as if there were no
GPU), and any custom env
(``module:Id``, or an id an ``--env-module`` registers: its code may have changed) is probed
afresh; ``refresh`` forces it
(``autotune train --reprobe``). Files are written whole (a temporary file, then a rename),
readable by the owner only, and read with ``json`` alone.

Runs that start together probe a workload once: the one that measures holds an ``flock`` on
``<key>.lock`` while it does, and another run of the same workload waits for it and reads its
entry, instead of measuring the same costs beside it (two Ant-v5 jobs started 30 s apart on a
16-core host each spent 35-49 s probing, each on every core while the other probed as well).
A holder that dies releases the lock with its process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from runtime.atomic_file import replaced
from runtime.cache_dirs import cache_root, cpu_model
from runtime.probes import ProbeError, Probes, run_probes

logger = logging.getLogger(__name__)

MAX_AGE_S = 7 * 86400.0
"""Seconds a cached probe stays valid."""
FORMAT = 9
"""Part of the key: entries written before the policy forward and a CPU learner's update were
timed on the thread's own clock (as time passed, they cached a busy machine's waits), before
the env step was timed on its own thread's clock
(the process's clock counted its other threads too), before a GPU learner replayed its
steps from CUDA graphs (9-11x the eager loop's update rate), before CUDA learners ran a
fused Adam and the GPU's context watts were read over the CPU learner's probe, before a
graphed learner's loss was compiled (``policies.compiled_loss``), or before the learner was
timed at two trajectories per minibatch at least (``runtime.probes.learner_batches``: a line
through a one-trajectory size was the plain loss's and the compiled one's mixed), are measured
again."""


def cache_dir() -> Path:
    """Where probe results are kept (see the module docstring)."""
    return cache_root() / "probes"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def mask_cores() -> int:
    """Cores in this process's affinity mask (an actor on each for the loaded probe)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_facts() -> dict[str, Any]:
    """What probe results depend on besides the workload: this process's ``_host_facts``,
    with the GPUs that ``CUDA_VISIBLE_DEVICES`` shows it now (a study's worker sets it)."""
    facts = _host_facts()
    return {**facts, "gpus": visible_gpus(facts["gpus"])}


@functools.cache
def _host_facts() -> dict[str, Any]:
    """The host's facts, read once per process (NVML and the packages' metadata are read for
    every key a run looks up: its own, the wider ones, the guard on a GPU learner)."""
    from runtime.hw.gpus import list_gpus

    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 1,
        "gpus": [g.name for g in list_gpus()],
        "python": sys.version.split()[0],
        **{dist: _version(dist) for dist in ("torch", "numpy", "gymnasium", "envpool")},
    }


def visible_gpus(names: list[str]) -> list[str]:
    """The GPUs this process's CUDA can use, of NVML's ``names``: all of them where
    ``CUDA_VISIBLE_DEVICES`` is unset, else its entries in order, an index as the GPU's name
    and a UUID or MIG instance as itself, up to the first that names no GPU (as CUDA reads
    it). So a run that hides the GPUs, or sees another kind of GPU, has probes of its own."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names
    out = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < len(names):
            out.append(names[int(entry)])
        elif entry and not entry.lstrip("-").isdigit():
            out.append(entry)  # GPU-<uuid> or MIG-<uuid>
        else:
            break  # "", -1 or an index past the last GPU: CUDA sees no more
    return out


COST_SETTINGS = ("epochs", "minibatches", "min_minibatch", "normalize_obs", "compile_loss")
"""The learner settings in a workload's key: those an update's work depends on. The others (the
learning rate and its schedule, the discount, the loss's coefficients and clips, the rewards'
scaling, the lag bound) are numbers in the same arithmetic, so a run that changes only them
reads the probes taken already instead of spending them again (22-45 s on an H200 host)."""


def cache_key(spec: dict[str, Any], facts: dict[str, Any]) -> str:
    blob = json.dumps({"spec": spec, "machine": facts}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def entry_path(
    env_id: str,
    policy: str,
    rollout_len: int,
    learner: dict[str, Any],
    devices: list[str],
    backend: str = "gymnasium",
    also: tuple[str, ...] = (),
) -> Path | None:
    """The cache file of a workload's probes on this machine (``also``: the backends its env
    is timed on as well); None for a custom env."""
    from runtime.env_backends import is_custom

    if is_custom(env_id):
        return None
    learner = {k: learner[k] for k in COST_SETTINGS if k in learner}
    if not learner.get("min_minibatch"):  # off: the key entries had before the setting
        learner.pop("min_minibatch", None)
    spec = {
        "env": env_id,
        "policy": policy,
        "rollout_len": rollout_len,
        "learner": learner,
        "devices": sorted(devices),
        "format": FORMAT,
    }
    if backend != "gymnasium":  # gymnasium's entries keep the key they had
        spec["env_backend"] = backend
    if also:
        spec["also_backends"] = sorted(also)
    return cache_dir() / f"{cache_key(spec, machine_facts())}.json"


def probes(
    env_id: str,
    policy: str,
    rollout_len: int,
    learner: dict[str, Any],
    devices: list[str],
    refresh: bool = False,
    backend: str = "gymnasium",
    on_gpu_learner: Callable[[], None] | None = None,
    also: tuple[str, ...] = (),
) -> Probes:
    """The workload's probes: from the cache when a valid entry exists (its own, or one of a
    workload that measured it and more: ``_read_wider``), else measured now
    (``runtime.probes.run_probes``, ``on_gpu_learner`` called as it times the GPU learner,
    the env timed on the backends ``also`` names as well) and stored; while another run
    measures them, its result.

    Raises:
        ProbeError: the workload could not be probed.
    """
    path = entry_path(env_id, policy, rollout_len, learner, devices, backend, also)
    if path is not None and not refresh:
        hit = _serving(_read(path), devices) or _serving(
            _read_wider(env_id, policy, rollout_len, learner, devices, backend, also), devices
        )
        if hit is not None:
            return hit
    with _measuring(path) as waited:
        if path is not None and (waited or not refresh):  # one may have finished meanwhile
            hit = _serving(_read(path), devices)
            if hit is not None:
                return hit
        measured = run_probes(
            env_id,
            policy,
            rollout_len,
            learner,
            devices,
            procs=mask_cores(),
            backend=backend,
            on_gpu_learner=on_gpu_learner,
            also=also,
        )
        if path is not None and _complete(measured, devices) and not measured.gpu_shared():
            _write(path, measured)
        elif measured.gpu_shared():
            logger.warning(
                "another process used the GPU while this workload was probed (%.0f %% busy): "
                "the GPU figures size this run only and are not kept; a later run probes again",
                measured.gpu_busy_pct,
            )
    return measured


def _missing(found: Probes, devices: list[str]) -> list[str]:
    """The devices asked whose learner ``found`` did not time; not a GPU where this process
    can use none (no GPU, or ``CUDA_VISIBLE_DEVICES`` hides them: the key says so)."""
    missing = [d for d in devices if d not in found.learners]
    if "cuda" in missing and not machine_facts()["gpus"]:
        missing.remove("cuda")
    return missing


def _complete(measured: Probes, devices: list[str]) -> bool:
    """Whether ``measured`` may serve the runs of its key for the week: a GPU learner that
    could not be timed this time (CUDA did not start) would size them all as if the machine
    had no GPU, so such probes are used by this run only."""
    missing = _missing(measured, devices)
    if missing:
        logger.warning(
            "the probes timed no %s learner, so they are not cached: a later run measures "
            "them again",
            " or ".join(missing),
        )
    return not missing


def _serving(found: Probes | None, devices: list[str]) -> Probes | None:
    """``found`` where it times every learner asked (``_missing``); None otherwise (an entry
    written before ``_complete`` guarded the cache)."""
    return found if found is not None and not _missing(found, devices) else None


def _read_wider(
    env_id: str,
    policy: str,
    rollout_len: int,
    learner: dict[str, Any],
    devices: list[str],
    backend: str,
    also: tuple[str, ...],
) -> Probes | None:
    """The entry of a workload that measured all this one asks and more, narrowed to what it
    asks (``Probes.narrowed``); None where there is none: a GPU-trained workload's probes
    inside those of one sized over both devices (the GPU learner is timed first either way),
    and an env backend's inside those that timed gymnasium's env as well (``auto``'s). Not a
    CPU-trained workload inside a GPU one: there the CPU learner may have been timed at one
    size only (``runtime.probes.DOMINATED``). Gymnasium's, likewise, inside ``auto``'s on
    EnvPool, which timed gymnasium's env as its other backend."""
    device_sets = [devices]
    if "cuda" in devices and "cpu" not in devices:
        device_sets.append([*devices, "cpu"])
    also_sets = [also]
    if backend != "gymnasium" and "gymnasium" not in also:
        also_sets.append((*also, "gymnasium"))
    wider = [(d, backend, a) for d in device_sets for a in also_sets][1:]  # [0]: its own
    if backend == "gymnasium" and not also:
        wider += [(d, "envpool", ("gymnasium",)) for d in device_sets]
    for d, b, a in wider:
        path = entry_path(env_id, policy, rollout_len, learner, d, b, a)
        found = _read(path) if path is not None else None
        if found is not None and (b == backend or backend in found.other_backends):
            return (found if b == backend else found.on_backend(backend)).narrowed(devices, also)
    return None


@contextlib.contextmanager
def _measuring(path: Path | None):
    """Holds ``path``'s probe lock while the body measures; yields whether another run held
    it first (its entry is then worth reading). No lock where nothing is cached, or where the
    cache directory cannot take one (the run probes as before)."""
    if path is None:
        yield False
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            logger.info("another run on this machine is probing this workload: using its result")
            fcntl.flock(fd, fcntl.LOCK_EX)
            waited = True
        yield waited
    finally:
        os.close(fd)  # releases the lock


def _read(path: Path) -> Probes | None:
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            return None
        found = Probes.from_dict({**doc, "cached": True})
    except (OSError, ValueError, ProbeError, RecursionError):  # measured again
        return None
    if not 0 <= time.time() - found.measured_at <= MAX_AGE_S:
        return None
    return found


def _write(path: Path, found: Probes) -> None:
    """Stores ``found``; a cache that cannot be written is skipped (the run goes on)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with replaced(path) as f:
            json.dump(found.to_dict(), f)
