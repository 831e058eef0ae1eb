"""Where a run's actor processes run: the cores each is pinned to, every thread of a process
put on them, and one BLAS thread for each process started."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

logger = logging.getLogger(__name__)

BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def actor_cores(index: int, actors: int, pin: bool | None = None) -> list[int] | None:
    """The cores actor slot ``index`` of ``actors`` is pinned to: the ``index``-th block of
    ``cores // actors`` cores of this process's CPU set (``runtime.env_backends.
    actor_threads``: one core, or several for its EnvPool threads); the stages and the trainer
    share them, or take what the blocks leave, as the scheduler places them (a core kept for
    them idled most of its time: docs/BENCHMARKS.md). None (the scheduler places it) where the
    run has more actors than cores, or where pinning is off. ``pin``: True, False, or None
    (``TrainConfig.pin_actors``' auto): pinned where this CPU set is narrower than the
    machine's (a daemon's budget, a container's or ``taskset``'s set: cores the run owns),
    not where the run shares the whole machine with whatever else is started on it."""
    cores = sorted(os.sched_getaffinity(0))
    if pin is None:
        pin = len(cores) < (os.cpu_count() or len(cores))
    per = len(cores) // max(actors, 1)
    if not pin or per < 1 or (index + 1) * per > len(cores):
        return None
    return cores[index * per : (index + 1) * per]


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Processes started inside get one BLAS/OpenMP thread: an actor owns one core, and numpy's
    OpenBLAS would otherwise start a thread per core (and spin them) for the policy's matrix
    products. The variables are read when the child loads numpy, so they are set in this
    process's environment for the start and restored after it."""
    saved = {name: os.environ.get(name) for name in BLAS_THREAD_VARS}
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARS, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def place_threads(pid: int | None, key: str, cores: set[int]) -> bool:
    """Puts every thread of process ``pid`` (actor incarnation ``key``) on ``cores``; False
    where it ended or can't be."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # ended meanwhile (its restart is placed at its start)
        return False
    placed = False
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cores)
            placed = True
        except ProcessLookupError:  # that thread ended meanwhile
            continue
        except OSError as exc:
            logger.warning("actor %s not placed on cores %s: %s", key, sorted(cores), exc)
            return False
    return placed
