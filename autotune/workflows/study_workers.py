"""``autotune study --workers N``: N trials at once on this machine, one worker process each.

Each worker opens the same study (so they share one sampler history through the storage) and
runs its share of the trials on its own slice of the CPU cores (``sched_setaffinity``, which
its actor processes inherit) and, on a GPU machine, on its own GPU (``CUDA_VISIBLE_DEVICES``);
the actor knob is limited to the worker's cores. So that workers do not charge each other's
energy, a worker measures only its own GPU and the CPU time of its own processes (the CPU
model, labelled ``model``, even where RAPL is readable: RAPL counts the whole package).

Workers on other machines are the same command with the same ``--storage`` (PostgreSQL) and
``--study``. Workers report each finished trial to the parent, which shows them; Ctrl-C stops
every worker, and each fails its running trial as interrupted.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.tuning.knobs import Machine
from autotune.workflows.study import StudyOptions, make_study


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    cores: tuple[int, ...]
    gpu: int | None
    trials: int
    confirm: int = 0
    """How many of ``trials`` (the last) are confirmations (``autotune study --confirm``)."""


def plan_workers(options: StudyOptions) -> list[WorkerPlan]:
    """Splits this machine's cores (and GPUs) and the trials among ``options.workers`` workers.

    Raises:
        ValueError: too few cores or GPUs for that many workers.
    """
    n = options.workers
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < n:
        raise ValueError(
            f"--workers {n}: this process may use {len(cores)} cores; each local "
            f"worker needs at least one (allowed 1..{len(cores)})"
        )
    gpus = Machine.here().gpus
    if 0 < gpus < n:
        raise ValueError(
            f"--workers {n}: {gpus} GPU(s) here and each local worker needs its own "
            f"(allowed 1..{gpus}); run more workers on other machines with the same "
            "--storage and --study"
        )
    per, extra = divmod(len(cores), n)
    plans, start = [], 0
    for i in range(n):
        size = per + (i < extra)
        plans.append(
            WorkerPlan(
                i,
                tuple(cores[start : start + size]),
                i if gpus else None,
                *split_trials(options, i),
            )
        )
        start += size
    return plans


def split_trials(options: StudyOptions, i: int) -> tuple[int, int]:
    """Worker ``i``'s share of the trials, and of the confirmations among them."""
    n = options.workers
    trials = options.trials // n + (i < options.trials % n)
    confirm = options.confirm // n + (i < options.confirm % n)  # <= trials: confirm <= trials
    return trials, confirm


def _worker(options: StudyOptions, plan: WorkerPlan, out: Any) -> None:
    """A worker process: pins itself, opens the study and runs its trials."""
    os.sched_setaffinity(0, plan.cores)
    if plan.gpu is not None:
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's numbering = NVML's
        os.environ["CUDA_VISIBLE_DEVICES"] = str(plan.gpu)
    try:
        offline = make_study(options, cores=len(plan.cores), gpu=plan.gpu)
        for i in range(plan.trials):
            row = offline.step(confirm=i >= plan.trials - plan.confirm)
            out.put({**row.__dict__, "worker": plan.index})
    except KeyboardInterrupt:
        out.put({"worker": plan.index, "interrupted": True})
    except ValueError as exc:  # KnobError, StudyError, a knob space other than the study's
        out.put({"worker": plan.index, "failed": str(exc)})
    except Exception as exc:  # anything else cuts the session short too, and says so
        out.put({"worker": plan.index, "failed": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        out.put({"worker": plan.index, "done": True})


def take(
    msg: dict[str, Any],
    finished: set[int],
    done: Callable[[dict[str, Any]], None],
    say: Callable[[str], None],
) -> bool:
    """One message from a worker (a finished trial, or its end); True if it cuts the session
    short (the worker was interrupted or failed)."""
    if msg.get("done"):
        finished.add(msg["worker"])
    elif msg.get("interrupted"):
        return True
    elif msg.get("failed"):
        say(f"worker {msg['worker']}: {msg['failed']}")
        return True
    else:
        done(msg)
    return False


def run_workers(
    options: StudyOptions,
    plans: list[WorkerPlan],
    done: Callable[[dict[str, Any]], None],
    say: Callable[[str], None] = print,
) -> bool:
    """Runs the workers to the end, passing each finished trial to ``done``; True if Ctrl-C (or
    a worker's failure) cut the session short."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(options, p, out), name=f"study-worker-{p.index}")
        for p in plans
    ]
    for p in procs:
        p.start()
    finished: set[int] = set()
    cut = False
    try:
        while len(finished) < len(procs):
            try:
                msg = out.get(timeout=1.0)
            except queue.Empty:
                for plan, p in zip(plans, procs, strict=True):
                    if p.exitcode is not None and plan.index not in finished:
                        say(f"worker {plan.index} ended with code {p.exitcode}")
                        finished.add(plan.index)
                        cut = cut or p.exitcode != 0
                continue
            cut = take(msg, finished, done, say) or cut
    except KeyboardInterrupt:
        cut = True
        for p in procs:  # the terminal sent them SIGINT too; this covers a signal to us alone
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)
    for p in procs:
        p.join()
    return cut
