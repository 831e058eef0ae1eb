"""``autotune wrap -- CMD``: tune any training script, one fresh run of CMD per trial.

A trial (``run_trial``) starts CMD with its knobs in the environment (``AUTOTUNE_KNOBS``, and
``AUTOTUNE_<NAME>`` each) and in its arguments (``{name}`` placeholders), lets the script's own
output through untouched, and measures the run: the steps it reports through
``autotune.client`` (or, if it reports nothing, one run), its wall time, and the energy of its
process tree (GPU energy of the GPUs on which its processes held a compute context, CPU energy
of its processes from their busy time).

The objective is steps per joule (or steps per second); a script that reports no steps is
scored per run (runs per joule, runs per second), so it can still be tuned. A trial fails, and
the best config so far is kept, when the script

* exits with a non-zero code (a crash),
* stops reporting for ``report_timeout_s`` after it started reporting (a hang), or
* runs past ``trial_s`` without having reported any step (no way to measure it).

A script that reports steps and runs past ``trial_s`` is stopped (SIGTERM, then SIGKILL) and
measured up to there: long training scripts are tuned on a slice of their run. Processes the
script started that outlive it are ended when it exits (``autotune.wrap.process_tree``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from autotune.control import client, protocol
from autotune.control.protocol import MsgType
from autotune.tuning.counters import Counters
from autotune.tuning.knobs import Knob, KnobError
from autotune.wrap.measure import Marks, Tee
from autotune.wrap.process_tree import Tree, stop_tree
from runtime.energy.cpu import CPUModelEnergy, tree_pids
from runtime.energy.gpu import probe_gpu_energy
from runtime.hw.gpus import gpus_used_by

logger = logging.getLogger(__name__)

MAX_RANGE = 256
"""Most integers a ``LOW..HIGH`` knob may span (give a list for wider ones)."""
GPU_CHECK_S = 1.0
"""How often the wrapper asks NVML which GPUs the run's processes use."""
POLL_S = 0.1
TAIL_WAIT_MS = 100
"""Once the script has exited, how long the wrapper waits for a report still on its way
before it takes the run's figures; what is queued behind that one is read at once."""


def _scalar(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def script_defaults(specs: list[str], space: list[Knob], cmd: list[str] = ()) -> dict[str, Any]:
    """Trial one's values: each ``NAME=VALUE`` of ``specs`` (the script's own defaults), else
    the value ``cmd`` gives the knob's flag without a placeholder (``--num-envs 8``,
    ``--num_envs=8``) where it is one of the knob's choices, else its first choice.

    Raises:
        KnobError: a name that is not a knob, or a value that is not among its choices.
    """
    knobs = {k.name: k for k in space}
    out = {k.name: _flag_value(cmd, k) for k in space}
    for spec in specs:
        name, sep, text = spec.partition("=")
        knob = knobs.get(name.strip())
        if not sep or knob is None:
            raise KnobError(f"--default {spec!r}: expected NAME=VALUE for a knob: {list(knobs)}")
        value = _scalar(text.strip())
        if value not in knob.choices:
            raise KnobError(f"--default {spec!r}: {value!r} is not among {list(knob.choices)}")
        out[knob.name] = value
    return out


def _flag_value(cmd: list[str], knob: Knob) -> Any:
    """The value of ``--NAME`` (dashes or underscores) in ``cmd`` if it is among the knob's
    choices, else the knob's first choice."""
    flags = {f"--{knob.name}", f"--{knob.name.replace('_', '-')}"}
    for i, arg in enumerate(cmd):
        flag, eq, text = arg.partition("=")
        if flag in flags:
            value = _scalar(text if eq else (cmd[i + 1] if i + 1 < len(cmd) else ""))
            if value in knob.choices:
                return value
    return knob.choices[0]


RESERVED = frozenset(
    [
        "KNOBS",
        "WRAP",
        "TRIAL",
        "HOME",
        "CONTROL",
        "KEYS",
        "CACHE_DIR",
        "ENV_MODULES",
        "ENV_PATH",
        "GMI_SPARES",
        "LOG_LEVEL",
        "MACHINE_LOCKS",
    ]
)
"""Knob names whose ``AUTOTUNE_<NAME>`` the wrap or autotune itself reads."""


def parse_knob(spec: str, apply: str = "restart") -> Knob:
    """A script knob from ``NAME=LOW..HIGH`` (integers), ``NAME=A,B,C`` or ``NAME=VALUE``.

    Raises:
        KnobError: saying what was wrong and what is allowed.
    """
    name, sep, values = spec.partition("=")
    name, values = name.strip(), values.strip()
    if not sep or not values or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise KnobError(
            f"--knob {spec!r}: expected NAME=LOW..HIGH, NAME=A,B,C or NAME=VALUE "
            "with NAME a Python identifier ({NAME}, AUTOTUNE_NAME)"
        )
    if name.upper() in RESERVED:
        raise KnobError(
            f"--knob {spec!r}: AUTOTUNE_{name.upper()} is autotune's own variable; name the "
            f"knob otherwise (not {', '.join(sorted(n.lower() for n in RESERVED))})"
        )
    if ".." in values:
        lo_text, _, hi_text = values.partition("..")
        try:
            lo, hi = int(lo_text), int(hi_text)
        except ValueError:
            raise KnobError(f"--knob {spec!r}: LOW..HIGH takes integers") from None
        if lo > hi:
            raise KnobError(f"--knob {spec!r}: LOW {lo} is above HIGH {hi}; nothing to try")
        if hi - lo + 1 > MAX_RANGE:
            raise KnobError(
                f"--knob {spec!r} spans {hi - lo + 1} integers (at most "
                f"{MAX_RANGE}); list the values to try instead, e.g. "
                f"{name}={lo},{lo * 2 or 1},{hi}"
            )
        choices: tuple[Any, ...] = tuple(range(lo, hi + 1))
    else:
        choices = tuple(dict.fromkeys(_scalar(v.strip()) for v in values.split(",")))
        if any(v == "" for v in choices):
            raise KnobError(f"--knob {spec!r}: an empty value in the list")
    return Knob(name, choices, apply)


def script_name(cmd: list[str]) -> str:
    """A short name for CMD: the stem of its first ``.py`` argument, else of the program."""
    script = next((a for a in cmd if a.endswith(".py")), cmd[0] if cmd else "cmd")
    return Path(script).stem


def substitute(cmd: list[str], values: dict[str, Any]) -> list[str]:
    """CMD with ``{name}`` placeholders of knob names replaced; other braces are left alone."""
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")\}") if values else None
    return [pattern.sub(lambda m: str(values[m.group(1)]), a) if pattern else a for a in cmd]


def knob_env(values: dict[str, Any]) -> dict[str, str]:
    env = {client.ENV_KNOBS: json.dumps(values)}
    env.update({f"AUTOTUNE_{k.upper()}": str(v) for k, v in values.items()})
    return env


@dataclass
class TrialRun:
    """What one run of CMD did."""

    values: dict[str, Any]
    wall_s: float = 0.0
    steps: int | None = None
    reports: int = 0
    gpu_j: float = 0.0
    cpu_j: float = 0.0
    returncode: int | None = None
    error: str | None = None
    stopped: bool = False
    """Stopped by the wrapper at ``trial_s`` (measured up to there)."""
    metrics: dict[str, float] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)
    """NVML indices of the GPUs the run used (their energy is ``gpu_j``)."""
    outlived: int = 0
    """Processes the script started that still ran when it exited (ended by the wrapper)."""

    window: dict[str, Any] = field(default_factory=dict)
    """The measured span: ``from`` (``first report``, ``first output line`` or ``start``),
    ``s``, ``amount`` (steps, or 1 run), ``gpu_j``, ``cpu_j``; start-up before it left out."""

    @property
    def unit(self) -> str:
        return "steps" if self.steps else "runs"

    def attrs(self, cmd: list[str]) -> dict[str, Any]:
        """What a study's trial records of this run of ``cmd`` (the command it ran: a study
        resumed with another holds trials of several)."""
        keys = ("wall_s", "steps", "unit", "gpu_j", "cpu_j", "stopped", "gpus", "metrics")
        return {
            **{k: getattr(self, k) for k in keys},
            "window": self.window,
            "outlived": self.outlived,
            "cmd": list(cmd),
        }

    def figures(self) -> dict[str, float]:
        """Steps (or runs) per joule and per second, GPU and CPU watts, over the window."""
        measured = self.window and self.window["gpu_j"] + self.window["cpu_j"] > 0
        w = (
            self.window
            if measured
            else {  # too short a window to meter: the whole run
                "s": self.wall_s,
                "amount": float(self.steps or 1),
                "gpu_j": self.gpu_j,
                "cpu_j": self.cpu_j,
            }
        )
        joules, secs = w["gpu_j"] + w["cpu_j"], w["s"]
        return {
            "steps_per_joule": w["amount"] / joules if joules > 0 else 0.0,
            "steps_per_s": w["amount"] / secs if secs > 0 else 0.0,
            "gpu_w": w["gpu_j"] / secs if secs > 0 else 0.0,
            "cpu_w": w["cpu_j"] / secs if secs > 0 else 0.0,
        }

    def score(self, objective: str) -> float:
        """Steps (or one run) per joule, or per second, over the window."""
        return self.figures()[objective]


class Wrapper:
    """Runs CMD per trial and listens for its reports.

    Args:
        cmd: The command and its arguments (``{name}`` placeholders allowed).
        trial_s: Longest a trial runs (None: until CMD exits).
        report_timeout_s: Longest silence after the first report before the run counts as hung.
        gpu: GPU energy source (``runtime.energy.gpu``); the probed one when None.
    """

    def __init__(
        self,
        cmd: list[str],
        trial_s: float | None = None,
        report_timeout_s: float = 60.0,
        gpu: Any = None,
    ) -> None:
        if not cmd:
            raise ValueError(
                "no command to wrap: give it after --, e.g. autotune wrap -- python train.py"
            )
        self.cmd, self.trial_s, self.report_timeout_s = cmd, trial_s, report_timeout_s
        self.on_report: Callable[[Counters], None] | None = None
        """Called with the run's totals (steps, GPU and CPU joules) at each of its reports."""
        self.gpu = gpu if gpu is not None else probe_gpu_energy()
        self._dir = tempfile.TemporaryDirectory(prefix="autotune-wrap-")
        self.endpoint = f"ipc://{self._dir.name}/wrap.sock"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)

    def close(self) -> None:
        self.ctx.destroy(linger=0)
        self._dir.cleanup()

    def run_trial(self, number: int, values: dict[str, Any]) -> TrialRun:
        """One fresh run of CMD with ``values`` (see the module docstring)."""
        run = TrialRun(values)
        env = {
            **os.environ,
            **knob_env(values),
            client.ENV_ENDPOINT: self.endpoint,
            client.ENV_TRIAL: str(number),
        }
        env["PYTHONUNBUFFERED"] = "1"  # its lines come as it prints them: the first one times it
        start = time.monotonic()
        gpu0 = self.gpu.read_energy_j()
        try:
            proc = subprocess.Popen(substitute(self.cmd, values), env=env, stdout=subprocess.PIPE)
        except OSError as exc:
            run.error = f"cannot start {self.cmd[0]!r}: {exc}"
            return run
        tee = Tee(proc.stdout)
        tree = Tree(proc)
        cpu = CPUModelEnergy(pids=tree.pids)
        marks = Marks()
        last_report, used, next_gpu_check = None, set(), start

        def take_reports(wait_ms: int) -> None:
            """Takes what the script sent, marking each report's readings."""
            nonlocal last_report
            while self.sock.poll(wait_ms):
                wait_ms = 0
                if self._take(run, str(number)):
                    last_report = time.monotonic()
                    gpu, cpu_j = self.gpu.read_energy_j(), cpu.read_energy_j()
                    marks.report(run.steps, gpu, cpu_j)
                    if self.on_report is not None:
                        gpu_j = sum(gpu[i] - gpu0[i] for i in used if i in gpu and i in gpu0)
                        self.on_report(
                            Counters(time.monotonic(), run.steps or 0, 0.0, gpu_j, cpu_j)
                        )

        try:
            while proc.poll() is None:
                if time.monotonic() >= next_gpu_check:
                    used |= gpus_used_by(tree_pids(proc.pid))
                    next_gpu_check = time.monotonic() + GPU_CHECK_S
                take_reports(int(POLL_S * 1000))
                cpu_j = cpu.read_energy_j()  # samples the tree while its processes live
                if tee.first_line_at is not None and marks.output is None:
                    marks.output = (tee.first_line_at, self.gpu.read_energy_j(), cpu_j)
                now = time.monotonic()
                if last_report is not None and now - last_report > self.report_timeout_s:
                    run.error = (
                        f"hung: no report for {self.report_timeout_s:.0f} s after "
                        f"{run.reports} reports (--report-timeout-s)"
                    )
                elif self.trial_s is not None and now - start > self.trial_s:
                    if run.steps:
                        run.stopped = True
                    else:
                        run.error = (
                            f"ran past --trial-s {self.trial_s:.0f} without reporting a "
                            "step: call autotune.client.report(steps=...) or let the "
                            "run finish within --trial-s"
                        )
                if run.error or run.stopped:
                    stop_tree(proc, tree)
                    break
        except BaseException:  # Ctrl-C, SIGTERM, a failure here: the script is not left running
            stop_tree(proc, tree)
            raise
        # reports sent just before the script exited, still on their way: counted in the
        # window (it ends at the latest), not only in the step total
        take_reports(TAIL_WAIT_MS)
        run.returncode = proc.wait()
        run.outlived = tree.end_outliving()  # not left to run through the next trial
        tee.join()
        end = time.monotonic()
        run.wall_s = end - start
        gpu1 = self.gpu.read_energy_j()
        run.gpus = sorted(i for i in used if i in gpu0 and i in gpu1)
        run.gpu_j = sum(gpu1[i] - gpu0[i] for i in run.gpus)
        run.cpu_j = cpu.read_energy_j()
        run.window = marks.window(run.gpus, (end, gpu1, run.cpu_j))
        if run.error is None and not run.stopped and run.returncode != 0:
            run.error = f"exited with code {run.returncode}"
        return run

    def _take(self, run: TrialRun, trial: str) -> bool:
        """Reads one message; True if it was a report of this trial."""
        frames = self.sock.recv_multipart()
        try:
            msg = protocol.decode(frames[-1])
        except ValueError as exc:
            logger.warning("ignored a message from the script: %s", exc)
            return False
        if msg["type"] != MsgType.PROGRESS or str(msg.get("trial")) != trial:
            return False
        run.reports += 1
        if msg.get("steps") is not None:
            run.steps = max(run.steps or 0, int(msg["steps"]))
        run.metrics.update(msg.get("metrics") or {})
        return True
