"""``autotune wrap --mode live``: one run of CMD, its knobs changed while it trains.

The script calls ``autotune.client.poll()`` at safe points; the wrapper's ``ScriptJob`` is the
online tuner's ``Job`` (``autotune.tuning.job``): a config goes out as a KNOBS message with a
sequence number, has taken effect once the script polled with that number, and a window is
measured between the script's step reports (``autotune.tuning.counters``), with the energy of its
process tree read when each report arrives (GPU joules of the GPUs its processes use, counted
from when each was first seen in use).

A script that never polls cannot be tuned live: after ``report_timeout_s`` without a poll the
wrapper says so (use restart mode) and stops it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

from autotune.control import client, protocol
from autotune.control.protocol import MsgType
from autotune.tuning.counters import Counters
from autotune.tuning.job import Job
from autotune.tuning.online_tuner import OnlineTuner
from autotune.wrap.process_tree import Tree, stop_tree
from autotune.wrap.wrapper import GPU_CHECK_S, POLL_S, Wrapper, knob_env, substitute
from runtime.energy.cpu import CPUModelEnergy, tree_pids
from runtime.hw.gpus import gpus_used_by

logger = logging.getLogger(__name__)

LIVE_START_S = 300.0
"""The most a live script may take from its start to its first poll (imports, CUDA, envs), where
``--report-timeout-s`` is shorter: that one counts from a poll."""


class LiveModeUnsupported(RuntimeError):
    """The script does not call ``autotune.client.poll()``."""


class ScriptJob:
    """A running script as the tuner's ``Job`` (see the module docstring)."""

    def __init__(self, wrapper: Wrapper, proc: subprocess.Popen, cpu: CPUModelEnergy) -> None:
        self.wrapper, self.proc, self.cpu = wrapper, proc, cpu
        self.identity: bytes | None = None
        self.seq = self.polled = 0
        self.values: dict[str, Any] | None = None
        self.started = self.last_poll = time.monotonic()
        self.gpu0: dict[int, float] = {}
        """Per GPU the script uses, its counter when first seen in use (joules count from
        there, so the total never jumps)."""
        self.next_gpu_check = 0.0
        self.latest = self._counters(0)

    def _counters(self, steps: int) -> Counters:
        gpu = self.wrapper.gpu.read_energy_j()
        if time.monotonic() >= self.next_gpu_check:
            self.next_gpu_check = time.monotonic() + GPU_CHECK_S
            for i in gpus_used_by(tree_pids(self.proc.pid)) - set(self.gpu0):
                if i in gpu:
                    self.gpu0[i] = gpu[i]
        gpu_j = sum(gpu[i] - self.gpu0[i] for i in self.gpu0 if i in gpu)
        return Counters(time.monotonic(), steps, 0.0, gpu_j, self.cpu.read_energy_j())

    def apply(self, values: dict[str, Any]) -> None:
        self.seq += 1
        self.values = dict(values)
        self._push()

    def _push(self) -> None:
        if self.identity is not None and self.values is not None:
            self.wrapper.sock.send_multipart(
                [self.identity, protocol.encode(MsgType.KNOBS, seq=self.seq, values=self.values)]
            )

    def ready(self) -> bool:
        return self.polled >= self.seq

    def counters(self) -> Counters:
        return self.latest

    def pump(self, report_timeout_s: float) -> None:
        """Reads what the script sent; raises ``LiveModeUnsupported`` if it never polls."""
        if self.wrapper.sock.poll(int(POLL_S * 1000)):
            while self.wrapper.sock.poll(0):
                frames = self.wrapper.sock.recv_multipart()
                identity, frame = frames[0], frames[-1]
                try:
                    msg = protocol.decode(frame)
                except ValueError as exc:
                    logger.warning("ignored a message from the script: %s", exc)
                    continue
                first = self.identity is None
                self.identity = identity
                if first:  # its start-up is over: the report timeout counts from here
                    self.last_poll = time.monotonic()
                    self._push()  # a config asked for before the script connected
                if msg["type"] == MsgType.POLL:
                    self.last_poll = time.monotonic()
                    self.polled = max(self.polled, int(msg.get("seq", 0)))
                elif msg["type"] == MsgType.PROGRESS and msg.get("steps") is not None:
                    self.latest = self._counters(int(msg["steps"]))
        self.cpu.read_energy_j()
        # silent this long after a poll; before its first, its start-up gets LIVE_START_S
        started = self.identity is not None
        limit = report_timeout_s if started else max(report_timeout_s, LIVE_START_S)
        if time.monotonic() - self.last_poll > limit:
            since = "" if started else " since it started"
            raise LiveModeUnsupported(
                f"the script has not called autotune.client.poll() for {limit:.0f} s{since}; "
                "live mode needs it at safe points (use --mode restart for scripts that "
                "read their knobs once)"
            )


def run_live(
    wrapper: Wrapper,
    tuner_factory: Callable[[Job], OnlineTuner],
    base: dict[str, Any],
    report_timeout_s: float,
    on_report: Callable[[Counters], None] | None = None,
) -> tuple[OnlineTuner, int]:
    """Runs CMD once with ``base`` knobs and tunes it live until it exits; ``on_report`` gets
    the script's totals at each of its reports.

    Returns:
        The tuner and the script's exit code.

    Raises:
        LiveModeUnsupported: the script stopped (it never polled).
        ValueError: CMD cannot be started, or the tuner's settings are bad; the script is
            not left running on any error.
    """
    env = {
        **os.environ,
        **knob_env(base),
        client.ENV_ENDPOINT: wrapper.endpoint,
        client.ENV_TRIAL: "live",
    }
    try:
        proc = subprocess.Popen(substitute(wrapper.cmd, base), env=env)
    except OSError as exc:
        raise ValueError(f"cannot start {wrapper.cmd[0]!r}: {exc}") from None
    tree = Tree(proc)
    try:
        job = ScriptJob(wrapper, proc, CPUModelEnergy(pids=tree.pids))
        tuner = tuner_factory(job)
    except BaseException:  # bad settings, say: the script is not left running
        stop_tree(proc, tree)
        raise
    marked: set[int] = set()
    try:
        while proc.poll() is None:
            seen = job.latest
            job.pump(report_timeout_s)
            if on_report is not None and job.latest is not seen:
                on_report(job.latest)
            tuner.tick()
            _record_command(tuner, wrapper.cmd, marked)
    except BaseException:  # it stopped polling, Ctrl-C, SIGTERM, a failure here
        stop_tree(proc, tree)
        tuner.close("script stopped")
        raise
    tuner.close("script ended")
    code = proc.wait()
    tree.end_outliving()
    return tuner, code


def _record_command(tuner: OnlineTuner, cmd: list[str], marked: set[int]) -> None:
    """Marks the trial being measured with the command it runs (``cmd``, as a restart-mode
    trial's ``TrialRun.attrs`` does), so that an export of a study resumed with another
    command pools no live trial with another command's (``workflows.wrap_export``); ``marked``
    holds the trials marked so far."""
    trial = tuner.current.trial if tuner.current is not None else None
    if trial is not None and trial.number not in marked:
        trial.set_user_attr("cmd", list(cmd))
        marked.add(trial.number)
