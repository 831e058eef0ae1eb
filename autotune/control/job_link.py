"""A training job's side of the daemon: register, take configs, report counters.

``autotune train --tune`` first tries ``DaemonLink.register``; if no daemon answers it tunes
in-process instead (``autotune.workflows.tune``). Once registered, ``tick`` (called every runner
tick, never blocking) applies APPLY messages through ``Runner.reconfigure`` and sends a REPORT every
``REPORT_INTERVAL_S``. A refused config is reported with its error; the daemon fails that trial.

A BUDGET message pins the job's process tree to the budget's cores
(``autotune.control.pinning``) and charges the job its share of the machine's energy
(``runtime.energy.shares``); the daemon's tuner keeps the config inside it. Reports say
which budget the job has taken.

If the daemon goes away the job trains on with the config (and the cores) it has; reports
sent while no daemon listens are dropped (they are snapshots, nothing accumulates). A daemon
started again answers the next report with WHO and the job registers again (naming the budget
it holds), resuming its study there: one HELLO at a time (the WHOs queued behind it ask for
nothing new), and after a refusal not before ``HELLO_RETRY_S``, doubled at each refusal up to
``HELLO_RETRY_MAX_S``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any

import zmq

from autotune.control import protocol
from autotune.control.allocator import Budget
from autotune.control.pinning import pin_tree
from autotune.control.protocol import MsgType
from autotune.tuning.runner_job import (
    TunableRunner,
    config_changes,
    knob_values,
    read_counters,
)
from runtime.config import ConfigError
from runtime.energy.shares import shares_from

logger = logging.getLogger(__name__)

HELLO_RETRY_S = 1.0
"""After the daemon refuses to register the job again, the wait before the next HELLO."""
HELLO_RETRY_MAX_S = 60.0
"""The longest wait between two HELLOs the daemon refuses (the wait doubles up to it)."""
BYE_LINGER_MS = 1000
"""How long a job that gave up on its registration lets its goodbye leave as it closes."""


class DaemonRefused(RuntimeError):
    """The daemon answered the registration with an error (bad study, storage or knobs)."""


class DaemonLink:
    """Args:
    endpoint: The daemon's control endpoint.
    hello: The registration (study, storage, settings, knob space, base config).
    runner: The job's ``runtime.runner.Runner``.
    """

    def __init__(self, endpoint: str, hello: dict[str, Any], runner: TunableRunner) -> None:
        self.endpoint, self.runner = endpoint, runner
        self.job_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.token = protocol.new_token()  # the daemon takes this job's messages only with it
        self.hello = {**hello, "job": self.job_id, "pid": os.getpid(), "token": self.token}
        self.ctx = zmq.Context()
        self.sock = protocol.dealer(self.ctx, endpoint)
        self.applied, self.refused = 0, None
        self.registered = False
        self.tuning: dict[str, Any] | None = None
        self.last_report = 0.0
        self.registrations = 0
        self.budget: dict[str, Any] | None = None
        """The budget the job is pinned to (``Budget.to_dict``), if the daemon gave one."""
        self.budget_seq = 0
        self.hello_at: float | None = None
        """When the HELLO awaiting its answer went (None: none awaits one)."""
        self.retry_s, self.retry_at, self.refusal_logged = HELLO_RETRY_S, 0.0, False

    def register(self, timeout_s: float = protocol.REQUEST_TIMEOUT_S) -> bool:
        """Registers with the daemon; False if none answered within ``timeout_s``.

        Raises:
            DaemonRefused: with the daemon's reason (nothing in the job has changed).
        """
        if not protocol.daemon_present(self.endpoint):
            return False
        if not self.sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
            return False
        self._send(MsgType.HELLO, **self.hello)
        self.hello_at = time.monotonic()
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self.sock.poll(int(left * 1000)):
                msg = protocol.decode(self.sock.recv())
                if msg["type"] == MsgType.ERROR:
                    self.hello_at = None  # answered: nothing to take back at the close
                    raise DaemonRefused(msg.get("message", "refused"))
                self._handle(msg)
                if self.registered:
                    return True
        return False

    def close(self, timeout_s: float = protocol.REQUEST_TIMEOUT_S) -> dict[str, Any] | None:
        """Says goodbye; returns the daemon's tuning section for the result (None if the
        daemon is gone). A job that gave up waiting for its WELCOME says goodbye too, without
        waiting: a daemon slow to read the HELLO would otherwise register it after all and hold
        its budget until the job counted as silent."""
        linger = 0
        try:
            if self.registered and self._send(MsgType.BYE, job=self.job_id, token=self.token):
                deadline = time.monotonic() + timeout_s
                while self.tuning is None and (left := deadline - time.monotonic()) > 0:
                    if self.sock.poll(int(left * 1000)):
                        self._handle(protocol.decode(self.sock.recv()))
            elif self.hello_at is not None:  # a HELLO went unanswered
                self._send(MsgType.BYE, job=self.job_id, token=self.token)
                linger = BYE_LINGER_MS  # the goodbye leaves before the socket closes
            return self.tuning
        finally:
            self.sock.close(linger=linger)
            self.ctx.term()

    def tick(self) -> None:
        """Handles what the daemon sent and reports when due. Never blocks."""
        while self.sock.poll(0):
            try:
                self._handle(protocol.decode(self.sock.recv()))
            except ValueError as exc:
                logger.warning("ignored a message from the daemon: %s", exc)
        now = time.monotonic()
        if now - self.last_report >= protocol.REPORT_INTERVAL_S:
            self.last_report = now
            self._send(
                MsgType.REPORT,
                job=self.job_id,
                token=self.token,
                counters=read_counters(self.runner).to_wire(),
                settled=self.runner.settled(),
                applied=self.applied,
                refused=self.refused,
                config=self._config(),
                budget_seq=self.budget_seq,
                nodes=self._nodes(),
                noise_scale=self._noise_scale(),
            )

    def _noise_scale(self) -> float | None:
        tel = getattr(self.runner, "telemetry", None)
        value = tel.lead_trainer().get("noise_scale") if tel is not None else None
        return float(value) if isinstance(value, int | float) else None

    def _nodes(self) -> list[dict[str, Any]] | None:
        nodes = getattr(self.runner, "cluster_nodes", None)  # a Runner placing on a cluster
        return nodes() if nodes is not None else None

    def _take_budget(self, msg: dict[str, Any]) -> None:
        try:
            seq, budget = int(msg["seq"]), Budget.from_dict(msg["budget"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            logger.warning("ignored a malformed BUDGET from the daemon: %s", exc)
            return
        if seq <= self.budget_seq:
            return  # a resend of one already taken
        try:
            pinned = pin_tree(os.getpid(), budget.cores)
        except ValueError as exc:
            logger.warning("budget %s not taken: %s", budget.to_dict(), exc)
            return
        self.budget, self.budget_seq = budget.to_dict(), seq
        actors = getattr(self.runner, "actors", None)  # each on cores of its own again
        if actors is not None and hasattr(actors, "pin"):
            actors.pin(getattr(self.runner, "endpoints", None))
        meter = getattr(self.runner, "meter", None)
        try:
            if meter is not None:  # charged its share of the machine's energy from now on
                shares_from(meter, msg)
        except (TypeError, ValueError) as exc:
            logger.warning("energy shares of the budget not taken: %s", exc)
        share = "" if budget.mps_pct is None else f", {budget.mps_pct} % of GPU {budget.gpu}"
        logger.info(
            "budget from the daemon: cores %s%s (%d threads pinned)",
            list(budget.cores),
            share,
            pinned,
        )

    def _config(self) -> dict[str, Any]:
        return knob_values(self.runner.cfg, self.hello["base"])

    def _send(self, kind: MsgType, **body: Any) -> bool:
        try:
            self.sock.send(protocol.encode(kind, **body), zmq.NOBLOCK)
            return True
        except zmq.Again:  # no daemon connected: a report is a snapshot, the next one will do
            return False

    def _hello_again(self) -> None:
        """Registers again (a WHO: the daemon does not know the job), unless a HELLO awaits its
        answer (for ``REQUEST_TIMEOUT_S`` at most) or the wait after a refusal is not over."""
        now = time.monotonic()
        if self.hello_at is not None and now - self.hello_at < protocol.REQUEST_TIMEOUT_S:
            return
        if now < self.retry_at:
            return
        log = logger.debug if self.refusal_logged else logger.warning
        log("the daemon does not know this job (restarted?); registering again")
        held = self.budget or self.hello.get("held")
        if self._send(MsgType.HELLO, **{**self.hello, "held": held}):
            self.hello_at = now

    def _refused(self, reason: Any) -> None:
        """The daemon refused the HELLO that awaited its answer: the job is not registered, and
        asks again only after a wait that doubles at each refusal (logged once)."""
        self.hello_at, self.registered = None, False
        self.retry_at = time.monotonic() + self.retry_s
        if not self.refusal_logged:
            logger.warning(
                "the daemon refused to register this job again: %s; asking again in %.0f s, "
                "then at doubling waits up to %.0f s",
                reason,
                self.retry_s,
                HELLO_RETRY_MAX_S,
            )
            self.refusal_logged = True
        else:
            logger.debug("the daemon refused to register this job again: %s", reason)
        self.retry_s = min(2 * self.retry_s, HELLO_RETRY_MAX_S)

    def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == MsgType.WELCOME:
            self.hello_at, self.retry_at = None, 0.0
            self.retry_s, self.refusal_logged = HELLO_RETRY_S, False
            if msg.get("again"):  # the daemon kept this registration: its counts go on
                self.registered = True
                return
            self.registered = True
            self.registrations += 1
            self.applied, self.refused = 0, None  # sequence numbers are per registration
            self.budget_seq = 0
            logger.info(
                "registered with the daemon on %s as %s (%s trials in the study)",
                self.endpoint,
                self.job_id,
                msg.get("trials"),
            )
        elif kind == MsgType.WHO:
            self._hello_again()
        elif kind == MsgType.APPLY:
            try:
                seq, values = int(msg["seq"]), dict(msg["values"])
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                logger.warning("ignored a malformed APPLY from the daemon: %s", exc)
                return
            if seq <= self.applied:
                return  # a resend of one already taken
            try:
                self.runner.reconfigure(**config_changes(values))
                self.refused = None
            except (ConfigError, TypeError, ValueError) as exc:  # nothing changed in the job
                why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
                self.refused = why
            self.applied = seq
        elif kind == MsgType.BUDGET:
            self._take_budget(msg)
        elif kind == MsgType.FAREWELL:
            self.tuning = msg.get("tuning")
        elif kind == MsgType.ERROR and self.hello_at is not None:  # the answer to a HELLO
            self._refused(msg.get("message"))
        elif kind == MsgType.ERROR:
            logger.warning("the daemon says: %s", msg.get("message"))


def ask_offer(endpoint: str, claim: dict[str, Any]) -> tuple[Budget, dict[str, float]] | None:
    """The budget the daemon would give a job with ``claim`` now (``OFFER``) and the shares of
    the machine's energy it would be charged (``gpu_share``, ``cpu_share``), or None where no
    daemon answers.

    Raises:
        DaemonRefused: the daemon cannot take the job (its message says what is available).
    """
    answer = protocol.request(endpoint, MsgType.OFFER, claim=claim, pid=os.getpid())
    if answer is None:
        return None
    if answer["type"] == MsgType.ERROR:
        raise DaemonRefused(answer.get("message", "refused"))
    try:
        shares: dict[str, Any] = {k: float(answer.get(k, 1.0)) for k in ("gpu_share", "cpu_share")}
        index = answer.get("gpu_index")  # the GPU charged: that one alone, not every GPU
        shares["gpu_index"] = None if index is None else int(index)
        return Budget.from_dict(answer["budget"]), shares
    except (KeyError, TypeError, ValueError) as exc:
        raise DaemonRefused(f"the daemon's offer is malformed: {exc}") from None
