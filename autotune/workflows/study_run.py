"""An offline study's trials, wherever its options put them: on a cluster's nodes, in worker
processes on this machine, or here. The ``study`` command and ``autotune.study`` both run it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.tuning.offline_study import OfflineStudy
from autotune.workflows.study import StudyOptions, make_study, run_here
from autotune.workflows.study_cluster import run_cluster_workers
from autotune.workflows.study_workers import WorkerPlan, plan_workers, run_workers


def prepare(options: StudyOptions) -> tuple[OfflineStudy, list[WorkerPlan]]:
    """The study (made or resumed, for one worker's cores where workers share this machine)
    and the workers' plan (empty: the trials run here or on a cluster).

    Raises:
        ValueError: bad options (``KnobError``, ``ConfigError``, ``StudyError``).
    """
    plan = plan_workers(options) if options.workers > 1 and not options.cluster else []
    cores = len(plan[0].cores) if plan else (options.worker_cpus or None)
    return make_study(options, cores=cores), plan


def run_trials(
    options: StudyOptions,
    offline: OfflineStudy,
    plan: list[WorkerPlan],
    done: Callable[[dict[str, Any]], None],
    say: Callable[[str], None],
) -> bool:
    """Runs the trials, ``done`` given each trial's row; True if Ctrl-C cut them. A wrapped
    script's link is closed however they end.

    Raises:
        ValueError: the cluster cannot be reached or is too small for the workers.
    """
    try:
        if options.cluster is not None:
            return run_cluster_workers(options, done, say=say)
        if plan:
            return run_workers(options, plan, done, say=say)
        return run_here(offline, options.trials, options.confirm, done)
    finally:
        closer = getattr(offline.trials, "wrapper", None)
        if closer is not None:
            closer.close()
