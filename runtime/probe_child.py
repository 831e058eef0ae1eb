"""The probes' child process, run and watched: its output read as it comes, and a line it
writes to stderr to say that the GPU learner's timing begins (``GPU_LEARNER_MARK``) passed on
to the caller while the child goes on.

The learner's timing on the GPU is the longest probe (its loss compiled, each size's graph
captured: 15-20 s on an H200 host with a cold kernel cache). The env steps on every core are
timed before it, and what follows times one thread (the CPU learner) or the GPU, so a run with
cores to spare can start its first trainer's process then and import torch in it
(``runtime.gmi.spares.started_ahead``); a spare does not touch the GPU.
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

GPU_LEARNER_MARK = "autotune-probes: timing the GPU learner"
"""The line the child writes to stderr as the GPU learner's timing begins."""
POLL_S = 0.05


def run_child(
    cmd: list[str],
    env: dict[str, str],
    timeout_s: float,
    on_gpu_learner: Callable[[], None] | None = None,
) -> tuple[int, str, list[str]] | None:
    """Runs ``cmd``; its exit code, stdout and stderr lines (the mark left out), or None where
    it ran past ``timeout_s`` (then it is killed, as it is if this raises, Ctrl-C included).
    ``on_gpu_learner`` is called once, in this thread, when the child writes
    ``GPU_LEARNER_MARK``; what it raises is logged, and the child goes on."""
    out: list[str] = []
    err: list[str] = []
    marked = threading.Event()
    called = False
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",  # a stray byte must not stop a reader, and the child with it
        env=env,
    ) as proc:

        def read_out() -> None:
            out.append(proc.stdout.read())

        def read_err() -> None:
            for line in proc.stderr:
                if line.rstrip("\n") == GPU_LEARNER_MARK:
                    marked.set()
                else:
                    err.append(line.rstrip("\n"))

        readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    return None
                if marked.is_set() and not called:
                    called = True
                    _call(on_gpu_learner)
                time.sleep(POLL_S)
            for reader in readers:  # bounded: a grandchild may hold the pipes open
                reader.join(max(0.0, deadline - time.monotonic()) + 1.0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if marked.is_set() and not called:  # the mark came as the child ended
        _call(on_gpu_learner)
    return proc.returncode, "".join(out), err


def _call(on_gpu_learner: Callable[[], None] | None) -> None:
    if on_gpu_learner is None:
        return
    try:
        on_gpu_learner()
    except Exception:  # the probes go on: what it started is the caller's to end
        logger.exception("starting work beside the GPU learner's probe failed")


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)")


def failure_line(stderr: list[str], code: int) -> str:
    """What a failed child says went wrong: the exception its traceback ended with (a CUDA
    error's hints follow that line, the last of them says nothing of the cause), with its
    last line beside it where that differs; else its last line, else its exit code."""
    lines = [ln.strip() for ln in stderr if ln.strip()]
    if not lines:
        return f"probe process exited {code}"
    raised = [ln for ln in lines if _RAISED.match(ln)]
    if not raised or raised[-1] == lines[-1]:
        return lines[-1]
    return f"{raised[-1]} (its last line: {lines[-1]})"
