"""NVIDIA MPS control: find or start a control daemon, list its servers, stop only our own.

A GMI is a CUDA process started with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` under an MPS control
daemon; the percentage of a running client cannot change. ``MPSControl.start`` reuses a daemon
that already answers on the chosen pipe directory, and otherwise starts one with private pipe
and log directories under a temp dir; ``stop`` quits only a daemon this object started. Where
MPS cannot start (no binary, no permission, no GPU) ``start`` raises ``MPSUnavailable`` with
the reason; callers then run GMIs as plain shared processes and label them ``shared``.

Nothing here changes a GPU's compute mode, MIG mode, clocks or power limit.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
"""Where a system-wide daemon listens when ``CUDA_MPS_PIPE_DIRECTORY`` is unset."""
COMMAND_TIMEOUT_S = 10.0
START_TIMEOUT_S = 10.0


class MPSUnavailable(RuntimeError):
    """MPS cannot be used here; the message says why."""


@dataclass(frozen=True)
class MPSState:
    """What ``MPSControl.state`` found."""

    binary: str | None
    running: bool
    pipe_dir: str | None
    started_by_us: bool
    servers: tuple[int, ...] = ()

    @property
    def mode(self) -> str:
        """``mps`` when a daemon answers, else ``shared`` (GMIs are plain shared processes)."""
        return "mps" if self.running else "shared"


class MPSControl:
    """One MPS control daemon, found or started (see the module docstring).

    Args:
        pipe_dir: Pipe directory to look for a running daemon in; default
            ``$CUDA_MPS_PIPE_DIRECTORY`` or ``/tmp/nvidia-mps``.
        binary: The control binary; default ``nvidia-cuda-mps-control`` from ``PATH``.
    """

    def __init__(self, pipe_dir: str | None = None, binary: str | None = None) -> None:
        self.binary = binary or shutil.which(CONTROL_BINARY)
        self.pipe_dir = pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR)
        self.log_dir: str | None = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
        self.started_by_us = False
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def _env(self) -> dict[str, str]:
        # the daemon sees every GPU: a client's CUDA_VISIBLE_DEVICES (a GMI's, or a job's on a
        # daemon's budget of another GPU) then names a GPU among all, as NVML counts them,
        # where inherited it would renumber the daemon's GPUs and leave clients none to find
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update(CUDA_MPS_PIPE_DIRECTORY=self.pipe_dir, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env

    def command(self, text: str) -> str:
        """Sends one command to the daemon on ``pipe_dir`` and returns its answer.

        Raises:
            MPSUnavailable: No binary, or the daemon did not answer.
        """
        return self._run([], text + "\n", f"answer {text!r}")

    def _run(self, args: list[str], stdin: str | None, what: str) -> str:
        """Runs the control binary; a failure is ``MPSUnavailable`` saying it did not ``what``."""
        if self.binary is None:
            raise MPSUnavailable(f"{CONTROL_BINARY} is not on PATH (no NVIDIA MPS here)")
        try:
            done = subprocess.run(
                [self.binary, *args],
                input=stdin,
                env=self._env(),
                text=True,
                capture_output=True,
                timeout=COMMAND_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MPSUnavailable(f"MPS control did not {what}: {exc}") from None
        if done.returncode != 0:
            raise MPSUnavailable(
                f"MPS control did not {what} (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done.stdout

    def running(self) -> bool:
        """A daemon answers on ``pipe_dir``."""
        try:
            self.command("get_server_list")
        except MPSUnavailable:
            return False
        return True

    def servers(self) -> tuple[int, ...]:
        """PIDs of the MPS servers the daemon runs (one per user with clients)."""
        return tuple(int(x) for x in self.command("get_server_list").split() if x.isdigit())

    def state(self) -> MPSState:
        running = self.binary is not None and self.running()
        return MPSState(
            self.binary,
            running,
            self.pipe_dir if running else None,
            self.started_by_us,
            self.servers() if running else (),
        )

    def start(self) -> MPSState:
        """Reuses a running daemon or starts a private one.

        Raises:
            MPSUnavailable: No binary, or the daemon could not start (e.g. not permitted).
        """
        if self.binary is None:
            raise MPSUnavailable(f"{CONTROL_BINARY} is not on PATH (no NVIDIA MPS here)")
        if self.running():
            logger.info("reusing the MPS control daemon on %s", self.pipe_dir)
            return self.state()
        self._tmp = tempfile.TemporaryDirectory(prefix="autotune-mps-")
        self.pipe_dir = os.path.join(self._tmp.name, "pipe")
        self.log_dir = os.path.join(self._tmp.name, "log")
        os.makedirs(self.pipe_dir)
        os.makedirs(self.log_dir)
        self._run(["-d"], None, "start the daemon")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.running():
            if time.monotonic() > deadline:
                raise MPSUnavailable(
                    f"the MPS control daemon started but does not answer on "
                    f"{self.pipe_dir}; see {self.log_dir}"
                )
            time.sleep(0.1)
        self.started_by_us = True
        logger.info("started an MPS control daemon on %s", self.pipe_dir)
        return self.state()

    def client_env(self, active_thread_pct: int | None) -> dict[str, str]:
        """Environment for a GMI process: the daemon's directories and its SM percentage."""
        if active_thread_pct is not None and not 1 <= active_thread_pct <= 100:
            raise ValueError(f"MPS active-thread percentage {active_thread_pct}: allowed 1..100")
        env = self._env()
        if active_thread_pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_pct)
        return env

    def stop(self) -> None:
        """Quits the daemon if this object started it; a reused daemon is left running."""
        if not self.started_by_us:
            return
        try:
            self.command("quit")
        finally:
            self.started_by_us = False
            deadline = time.monotonic() + START_TIMEOUT_S
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    def __enter__(self) -> MPSControl:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
