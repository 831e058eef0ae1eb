"""``autotune study --workers N --cluster ADDRESS``: the N workers as Ray tasks on a cluster's
nodes, against one shared study storage.

Each worker is a Ray task that needs ``--worker-cpus`` CPUs, and a GPU where
``--worker-gpus 1`` asks for one (Ray then gives it its own, through ``CUDA_VISIBLE_DEVICES``).
It opens the same study and runs its share of the trials as a local worker does
(``autotune.workflows.study_workers``), with the actor knob ranging over its CPUs, measuring
only its own processes' CPU time and its own GPU. Ray grants a count of CPUs, not which cores,
so a worker is not pinned. Finished trials come back through a Ray queue and are shown as they
finish; Ctrl-C cancels every worker, and each fails its running trial as interrupted.

Workers on other hosts reach the study through its storage, so it must be a database server
(``postgresql://...``) they all reach; SQLite is allowed with ``local:N`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.workflows.study import StudyOptions, make_study
from autotune.workflows.study_workers import WorkerPlan, split_trials, take


def _cluster_worker(options: StudyOptions, plan: WorkerPlan, out: Any) -> None:
    """A worker task on a Ray node: opens the study and runs its trials."""
    import ray

    gpus = ray.get_gpu_ids()
    gpu = int(gpus[0]) if gpus else None
    try:
        offline = make_study(options, cores=len(plan.cores), gpu=gpu)
        for i in range(plan.trials):
            row = offline.step(confirm=i >= plan.trials - plan.confirm)
            out.put({**row.__dict__, "worker": plan.index})
    except KeyboardInterrupt:
        out.put({"worker": plan.index, "interrupted": True})
    except ValueError as exc:
        out.put({"worker": plan.index, "failed": str(exc)})
    except Exception as exc:
        out.put({"worker": plan.index, "failed": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        out.put({"worker": plan.index, "done": True})


def plan_cluster_workers(options: StudyOptions, cluster_cpus: int) -> list[WorkerPlan]:
    """The workers' plans: ``options.worker_cpus`` CPUs each.

    Raises:
        ValueError: the cluster has fewer CPUs than the workers need.
    """
    n, each = options.workers, options.worker_cpus
    if each * n > cluster_cpus:
        raise ValueError(
            f"--workers {n} x --worker-cpus {each}: the cluster offers {cluster_cpus} CPUs "
            f"(allowed up to {max(cluster_cpus // n, 1)} CPUs per worker, or fewer workers)"
        )
    return [WorkerPlan(i, tuple(range(each)), None, *split_trials(options, i)) for i in range(n)]


def run_cluster_workers(
    options: StudyOptions,
    done: Callable[[dict[str, Any]], None],
    say: Callable[[str], None] = print,
) -> bool:
    """Connects to ``options.cluster``, runs the workers there to the end, passing each finished
    trial to ``done``; True if Ctrl-C (or a worker's failure) cut the session short.

    Raises:
        ValueError: the cluster cannot be reached, or has too few CPUs (or GPUs) for the workers.
    """
    from runtime.cluster import parse_cluster
    from runtime.cluster.ray_cluster import ClusterError, RayCluster

    try:
        cluster = RayCluster(parse_cluster(options.cluster))
    except ClusterError as exc:
        raise ValueError(str(exc)) from None
    try:
        import ray
        from ray.util.queue import Empty, Queue

        nodes = cluster.nodes()
        plans = plan_cluster_workers(options, sum(n.cpus for n in nodes))
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if options.worker_gpus and gpus < options.workers:
            raise ValueError(
                f"--worker-gpus 1 with --workers {options.workers}: the cluster has {gpus} GPUs"
            )
        say(
            f"cluster {options.cluster}: {len(nodes)} nodes; {options.workers} workers of "
            f"{len(plans[0].cores)} CPUs{' and a GPU' if options.worker_gpus else ''} each"
        )
        out = Queue()
        task = ray.remote(_cluster_worker).options(
            num_cpus=len(plans[0].cores), num_gpus=options.worker_gpus, max_retries=0
        )
        refs = {task.remote(options, p, out): p.index for p in plans}
        return _gather(refs, out, Empty, done, say)
    finally:
        cluster.close()


def _gather(refs: dict[Any, int], out: Any, empty: type, done: Callable, say: Callable) -> bool:
    import ray

    finished: set[int] = set()
    cut = False
    try:
        while len(finished) < len(refs):
            try:
                msg = out.get(timeout=1.0)
            except empty:  # every row put so far has been read: a task that ended is done
                ended, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
                for ref in ended:
                    if refs[ref] in finished:
                        continue
                    finished.add(refs[ref])
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayError as exc:  # its node went away, or it crashed
                        say(f"worker {refs[ref]} ended: {str(exc).splitlines()[0]}")
                        cut = True
                continue
            cut = take(msg, finished, done, say) or cut
    except KeyboardInterrupt:
        cut = True
        for ref in refs:
            ray.cancel(ref)
        ray.wait(list(refs), num_returns=len(refs), timeout=60)
    return cut
