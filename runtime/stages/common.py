"""What every runtime process shares: process set-up and the telemetry sender."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import faulthandler
import logging
import math
import multiprocessing
import os
import signal
import sys
import time
from typing import Any

import setproctitle
import zmq

from runtime import topology, wire
from runtime.cache_dirs import use_kernel_cache
from runtime.commands import CommandIn
from runtime.curve import Guard, NoGuard
from runtime.process_exit import freeze_at_exit

PR_SET_PDEATHSIG = 1
LOG_FORMAT = "%(asctime)s %(processName)s %(name)s %(levelname)s: %(message)s"


def init_service_process(
    name: str, log_level: int | None = None, kernel_cache: bool = False
) -> None:
    """Set-up for a child process: Ctrl-C is the runner's to handle, die with the runner.

    Children ignore SIGINT so that Ctrl-C in the terminal (sent to the whole process group)
    reaches only the runner, which then drains the pipeline in order. On Linux a child asks the
    kernel to SIGKILL it when the runner dies, however the runner died, so no actor or trainer
    is left running on its own. The process title names the role (``autotune: actor 3``,
    ``autotune: compressor``), so ``ps`` and ``top`` show it; SIGUSR1 prints every thread's
    stack to stderr (for a process that seems stuck: ``kill -USR1 PID`` with the PID ``ps``
    shows for that role). ``kernel_cache``: a trainer, whose learner may compile its loss,
    keeps the kernels in the tool's cache (``runtime.cache_dirs.use_kernel_cache``).
    """
    if kernel_cache:
        use_kernel_cache()
    setproctitle.setproctitle(f"autotune: {name.replace('-', ' ', 1)}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _die_with_parent()
    freeze_at_exit()  # its teardown is not what the run's drain waits for
    if log_level is None:
        log_level = int(os.environ.get("AUTOTUNE_LOG_LEVEL", str(logging.WARNING)))
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    logging.getLogger(__name__).debug("%s started (pid %d)", name, os.getpid())


EXIT_WAIT_S = 300.0
"""A drained service keeps its sockets open at most this long waiting for the runner's exit."""


def await_exit(commands: CommandIn, timeout_s: float = EXIT_WAIT_S) -> None:
    """Blocks until the runner's COMMAND ``exit`` arrives (or ``timeout_s`` passes).

    A drained service must not close its output socket while the next stage may still be
    reading it: ZeroMQ can drop the queued tail of a socket closed under back-pressure, even
    with LINGER. The runner sends ``exit`` once the trainer has reported its final figures,
    which proves everything upstream was consumed.
    """
    deadline = time.monotonic() + timeout_s
    malformed = wire.MalformedCounter("exit-wait")
    while time.monotonic() < deadline:
        if commands.poll(100) and exit_requested(commands, malformed):
            return


def exit_requested(commands: CommandIn, malformed: wire.MalformedCounter) -> bool:
    """Reads every command waiting (never blocks); whether one was ``exit``. What is not a
    command of this run is counted in ``malformed``."""
    seen = False
    for msg in commands.waiting(malformed):  # every one, so none is left for the next read
        seen |= msg.meta.get("cmd") == "exit"
    return seen


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    runner = multiprocessing.parent_process()  # its pid, recorded when this process spawned
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        logging.getLogger(__name__).warning(
            "prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno()
        )
    if runner is not None and os.getppid() != runner.pid:  # it died before prctl took effect
        os._exit(1)


class StatsSender:
    """Sends STATS messages (a source name and a counter map) to the runner's telemetry socket.

    Periodic reports are sent without blocking and skipped when the socket is full (they are
    cumulative, so a skipped one loses nothing); a final report blocks until queued. With the
    run's key each report is signed and numbered (``inst``: this sender, ``n``: its report
    count, ``mono``: when, on the host's monotonic clock), so the runner takes no report that
    another process made or sent again, nor one a replaced process sent before its end.
    """

    def __init__(
        self,
        sock: zmq.Socket,
        source: str,
        key: bytes = b"",
        guard: Guard | NoGuard | None = None,
    ) -> None:
        self.sock, self.source, self.key = sock, source, key
        self.guard = guard
        """The process's ZAP guard (``runtime.curve``), whose refusals every report carries
        as ``auth_refused``."""
        self.inst = os.urandom(8).hex()
        self.n = 0

    @classmethod
    def service(cls, ctx: zmq.Context, endpoints: topology.Endpoints, source: str) -> StatsSender:
        """The sender of a process that binds some of the run's links: it starts the process's
        ZAP guard first (``topology.guard``; call this before any bind, and stop
        ``sender.guard`` before ``ctx`` ends)."""
        guard = topology.guard(ctx, endpoints)
        return cls(topology.telemetry_out(ctx, endpoints), source, endpoints.run_key, guard)

    def send(self, counters: dict[str, Any]) -> None:
        final = bool(counters.get("final"))
        if "cpu_s" not in counters:  # the process's CPU so far, every thread's
            counters = {**counters, "cpu_s": round(time.process_time(), 3)}
        if self.guard is not None:
            counters = {**counters, "auth_refused": self.guard.refused}
        meta = {"src": self.source, "time": time.time(), "c": counters}
        if self.key:
            mine = {"inst": self.inst, "n": self.n, "mono": time.monotonic()}  # this host's clock
            meta = wire.sign(self.key, wire.MsgType.STATS, meta | mine)
        self.n += 1
        with contextlib.suppress(zmq.Again):
            wire.send_msg(self.sock, wire.MsgType.STATS, meta, flags=0 if final else zmq.NOBLOCK)


class LiveSettings:
    """A process's view of the COMMAND ``live`` messages: the newest epoch it has applied."""

    def __init__(self) -> None:
        self.epoch = 0
        self.reset_epoch = 0
        """The newest COMMAND ``reset`` taken (the runner replaced the compressor and the
        migrator); ``reset_due`` is set until the process has acted on it."""
        self.reset_due = False

    def take(self, msg: wire.Message) -> dict[str, Any] | None:
        """The settings of ``msg`` if it is a ``live`` message newer than what was applied
        (a newer ``reset`` sets ``reset_due``).

        Raises:
            wire.ProtocolError: if a ``live`` or ``reset`` message is malformed.
        """
        if msg.type is wire.MsgType.COMMAND and msg.meta.get("cmd") == "reset":
            epoch = wire.meta_int(msg.meta, "epoch")
            if epoch > self.reset_epoch:
                self.reset_epoch, self.reset_due = epoch, True
            return None
        if msg.type is not wire.MsgType.COMMAND or msg.meta.get("cmd") != "live":
            return None
        epoch = wire.meta_int(msg.meta, "epoch")
        if epoch <= self.epoch:
            return None
        out = {
            k: msg.meta.get(k) for k in ("chunk_bytes", "batch_size", "inflight_steps_per_actor")
        }
        for key, value in out.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise wire.ProtocolError(f"live {key}={value!r}: must be an integer >= 1")
        timeout = msg.meta.get("chunk_timeout_s")
        if not isinstance(timeout, int | float) or not (math.isfinite(timeout) and timeout > 0):
            raise wire.ProtocolError(f"live chunk_timeout_s={timeout!r}: must be finite and > 0")
        out["chunk_timeout_s"] = float(timeout)
        self.epoch = epoch
        return out

    def poll(self, commands: CommandIn, malformed: wire.MalformedCounter) -> dict[str, Any] | None:
        """Reads every waiting COMMAND message; returns the newest new settings, if any."""
        newest = None
        if not commands.poll(0):
            return None
        for msg in commands.waiting(malformed):
            try:
                newest = self.take(msg) or newest
            except wire.ProtocolError as exc:
                malformed.drop(exc)
        return newest
