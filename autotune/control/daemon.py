"""The tuning daemon: one process that tunes every training job registered with it.

``autotune daemon start`` runs it in the background; ``autotune train --tune`` registers with
it (``autotune.control.job_link``) and otherwise tunes in-process. For each job the daemon holds an
``OnlineTuner`` whose ``Job`` is ``RemoteJob``: configs go out as APPLY messages, and windows
are measured between the counters the job reports (``autotune.tuning.counters``). Trials live in the
job's Optuna storage, so a daemon killed outright and started again resumes every study: trials
left RUNNING are failed, the others rebuild the tuner's history (``OnlineTuner._restore``).

It also shares the machine out among its jobs (``autotune.control.sharing``): each job gets
a budget of cores, a GPU and an MPS share, is pinned to it, and is tuned inside it. One daemon
runs per state dir, and one hands out a core or GPU (locks: ``autotune.control.home``).

The loop never blocks on a job: it polls the control socket (``autotune.control.protocol``),
ticks each tuner, and drops jobs silent too long (``protocol.too_silent``; one that comes back
registers again). SIGTERM, SIGINT and a STOP message end it cleanly: trials being measured are
failed as "daemon stopped" and the jobs go on training with the config they have.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from autotune.control import admission, protocol
from autotune.control.allocator import Budget
from autotune.control.claims import (
    claim_from,
    offer_failed,
    process_gone,
    sender_pid,
    share_of,
    valid_pid,
)
from autotune.control.control_socket import bind_router, remove_socket_file
from autotune.control.home import hold_lock, hold_machine
from autotune.control.machine import MachineView, detect, energy_shares
from autotune.control.protocol import MsgType
from autotune.control.remote_job import RemoteJob, tuner_for
from autotune.control.sharing import MachineShares
from autotune.control.status import daemon_status
from autotune.tuning.budget import limits_for
from autotune.tuning.knobs import Knob
from autotune.tuning.online_tuner import OnlineTuner
from autotune.tuning.perf_model import Params
from autotune.tuning.runner_job import tuning_doc

logger = logging.getLogger(__name__)

TICK_S = 0.1
MAX_PER_TICK = 200
"""Messages read between two ticks at most (silent jobs dropped, budgets resent, tuning)."""
LIVE_SPAN_S = 10.0
"""The span of reports the live steps/s and watts in ``status`` are computed over."""
FAILED_HOLD_S = 60.0  # a job whose tuner failed is refused so long: no churn of the budgets


@dataclass
class Session:
    """One registered job."""

    job_id: str
    identity: bytes
    hello: dict[str, Any]
    tuner: OnlineTuner
    space: dict[str, Knob]
    remote: RemoteJob
    last_seen: float
    config: dict[str, Any] = field(default_factory=dict)
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))


class Daemon:
    """The service (see the module docstring).

    Args:
        endpoint: The control endpoint to bind (``autotune.control.protocol.resolve_endpoint``).
    """

    def __init__(
        self, endpoint: str, machine: MachineView | None = None, reserve: int | None = None
    ) -> None:
        self.endpoint = endpoint
        self.machine, self.reserve = machine, reserve
        self.shares: MachineShares | None = None
        self.lock: Any = None
        self.machine_locks: list[Any] = []  # on the cores and GPUs it hands out
        self.sessions: dict[str, Session] = {}
        self.stopping = False
        self.started = time.time()
        self.ctx = zmq.Context()
        self.sock: zmq.Socket | None = None
        self.auth: Any = None  # a tcp:// endpoint's ZAP authenticator (control.keys)
        self.peer: int | None = None  # the pid that sent the message read last (ipc:// only)
        self.peer_key: str | None = None  # its CURVE key (tcp:// only)
        self.failed: dict[str, tuple[float, str]] = {}  # job id: (refused until, why)
        self.offer_owners = admission.OfferOwners(lambda pid: f"offer-{pid}" in self.shares.shares)

    def bind(self) -> None:
        """Binds the control socket.

        Raises:
            protocol.ControlError: if another daemon answers on the endpoint or holds the
                state dir's lock, the machine cannot be read, or the path of an ``ipc://``
                endpoint holds something other than a socket.
        """
        other = protocol.request(self.endpoint, MsgType.PING, timeout_s=1.0)
        if other is not None:
            raise protocol.ControlError(
                f"a daemon already runs on {self.endpoint} (pid {other.get('pid')})"
            )
        self.lock = hold_lock("daemon.lock", "a daemon")
        try:
            machine = self.machine or detect(self.reserve)
        except ValueError as exc:
            raise protocol.ControlError(str(exc)) from None
        if self.machine is None:  # this machine's cores and GPUs, not a description's
            self.machine_locks = hold_machine(machine.reserved + machine.cores, machine.gpu_ids)
        self.shares = MachineShares(machine, self._budget, self._params)
        self.sock, self.auth = bind_router(self.ctx, self.endpoint)

    def serve(self) -> None:
        """Runs until STOP, SIGTERM or SIGINT."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "stopping", True))
        logger.info("daemon %d serving on %s", os.getpid(), self.endpoint)
        try:
            while not self.stopping:
                for _ in range(MAX_PER_TICK if self.sock.poll(int(TICK_S * 1000)) else 0):
                    if not self.sock.poll(0):
                        break
                    try:  # a flood does not starve the tick, nor a bad message end it
                        self._receive()
                    except Exception as exc:
                        logger.warning("a message failed: %s: %s", type(exc).__name__, exc)
                try:
                    self._tick()
                except Exception:  # one job must not end the daemon
                    logger.exception("daemon tick: recovered from an error")
        finally:
            for session in list(self.sessions.values()):
                self._drop(session, "daemon stopped")
            self.sock.close(linger=0)
            if self.auth is not None:
                self.auth.stop()
            self.ctx.destroy(linger=0)
            path = protocol.ipc_path(self.endpoint)
            try:
                if path is not None:
                    remove_socket_file(path)
            except protocol.ControlError as exc:  # put there since it bound: left as it is
                logger.warning("%s", exc)
            logger.info("daemon %d stopped", os.getpid())

    # --- messages ---------------------------------------------------------------------------

    def _send(self, identity: bytes, kind: MsgType, **body: Any) -> None:
        try:
            self.sock.send_multipart([identity, protocol.encode(kind, **body)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the peer left (ROUTER_MANDATORY) or is not reading
            logger.debug("cannot send %s: %s", kind, exc)

    def _receive(self) -> None:
        frames = self.sock.recv_multipart(copy=False)
        identity, self.peer = frames[0].bytes, protocol.peer_pid(frames[-1])  # the sender's
        self.peer_key = protocol.peer_key(frames[-1])
        try:
            msg = protocol.decode(frames[-1].bytes)
        except ValueError as exc:
            logger.warning("dropped a control message: %s", exc)
            self._send(identity, MsgType.ERROR, message=str(exc))
            return
        kind = msg["type"]
        if kind == MsgType.PING:
            pong = {"pid": os.getpid(), "endpoint": self.endpoint, "jobs": len(self.sessions)}
            self._send(identity, MsgType.PONG, **pong)
        elif kind == MsgType.STATUS:
            self._send(identity, MsgType.STATUS, status=self.status())
        elif kind == MsgType.STOP:
            self._send(identity, MsgType.STOPPING, pid=os.getpid())
            self.stopping = True
        elif kind == MsgType.HELLO:
            self._hello(identity, msg)
        elif kind == MsgType.OFFER:
            self._offer(identity, msg)
        elif kind in (MsgType.REPORT, MsgType.BYE):
            session = self.sessions.get(str(msg.get("job")))
            if session is None:
                self._send(identity, MsgType.WHO)
            elif not protocol.token_matches(session.hello["token"], msg):
                logger.warning("a %s for job %s without its token: ignored", kind, session.job_id)
                self._send(identity, MsgType.ERROR, message=protocol.not_its_token(session.job_id))
            elif kind == MsgType.BYE:
                doc = tuning_doc(session.tuner, session.space)
                self._drop(session, "job ended")
                self._send(identity, MsgType.FAREWELL, tuning=doc)
            else:
                self._report(session, identity, msg)
        else:
            self._send(
                identity,
                MsgType.ERROR,
                message=f"the daemon does not take {kind.value} messages; allowed: "
                f"{[m.value for m in protocol.DAEMON_TAKES]}",
            )

    def _hello(self, identity: bytes, msg: dict[str, Any]) -> None:
        job_id = str(msg.get("job"))
        if job_id.startswith("offer-"):
            self._send(identity, MsgType.ERROR, message="job ids starting offer- are reserved")
            return
        old = self.sessions.get(job_id)
        problem = admission.sender_problem(msg, self.peer, old.hello if old is not None else None)
        until, why = self.failed.get(job_id, (0.0, ""))
        if problem is None and time.monotonic() < until:
            problem = f"its tuning failed ({why}); it may register again in {FAILED_HOLD_S:.0f} s"
        problem = problem or self.offer_owners.problem(valid_pid(msg.get("pid")), self.peer_key)
        if problem is not None:  # a session registered already is left as it is
            self._send(identity, MsgType.ERROR, message=f"cannot register job {job_id}: {problem}")
            return
        if old is not None and old.identity == identity and old.hello.get("pid") == msg["pid"]:
            self._welcome_again(old)  # a HELLO it sent again before its first was answered
            return
        if old is not None:  # the job itself, registering again
            self._drop(old, "job registered again")
        for other in list(self.sessions.values()):  # a killed job's study goes with it
            if process_gone(valid_pid(other.hello.get("pid"))):
                self._drop(other, "its process has ended")
        hellos = {j: other.hello for j, other in self.sessions.items()}
        problem = admission.study_problem(msg, hellos)
        if problem is not None:
            self._send(identity, MsgType.ERROR, message=problem)
            return
        problem = admission.storage_problem(msg.get("storage"))
        try:
            claim = claim_from(job_id, msg.get("claim"))
        except ValueError as exc:
            problem = problem or str(exc)
        try:  # on the GPU of the budget it holds, where it says one
            share = share_of(claim, msg, self.shares.machine) if problem is None else None
        except ValueError as exc:  # a malformed machine model
            share, problem = None, str(exc)
        if share is not None:
            problem = self.shares.admit(claim, valid_pid(msg.get("pid")), share.budget)
        if problem is not None:
            self._send(identity, MsgType.ERROR, message=f"cannot tune job {job_id}: {problem}")
            return
        remote = RemoteJob(lambda kind, **body: self._send(identity, kind, **body))
        try:
            tuner, space = tuner_for(msg, remote)
        except (KeyError, TypeError, ValueError) as exc:  # StudyError, bad settings or knobs
            self._send(identity, MsgType.ERROR, message=f"cannot tune job {job_id}: {exc}")
            return
        self.sessions[job_id] = Session(
            job_id, identity, msg, tuner, space, remote, time.monotonic(), config=dict(msg["base"])
        )
        self._send(identity, MsgType.WELCOME, job=job_id, trials=tuner.trials_done)
        self.shares.join(share)  # after the welcome: budgets count anew
        logger.info(
            "job %s (pid %s, %s) registered: study %r, %d trials so far",
            job_id,
            msg.get("pid"),
            msg.get("env"),
            msg["study"],
            tuner.trials_done,
        )

    def _welcome_again(self, session: Session) -> None:
        """Answers a HELLO from the registered job itself (same token, pid and socket:
        one per WHO, queued while the daemon was slow) as registered, nothing dropped: its trial
        and the other jobs' budgets go on. Its budget and config go again, for a job that
        counts its sequence numbers afresh on any WELCOME."""
        session.last_seen = time.monotonic()
        trials = session.tuner.trials_done
        self._send(session.identity, MsgType.WELCOME, job=session.job_id, trials=trials, again=True)
        share = self.shares.shares.get(session.job_id)
        if share is not None and share.budget is not None:
            self._budget(session.job_id, share.budget, changed=False)
        if session.remote.seq > 0:
            session.remote.resend()

    def _report(self, session: Session, identity: bytes, msg: dict[str, Any]) -> None:
        try:
            session.remote.on_report(msg)
        except (KeyError, ValueError, TypeError, OverflowError) as exc:  # not a sign of life
            logger.warning("job %s sent a bad report: %s", session.job_id, exc)
            return
        session.identity = identity
        session.last_seen = time.monotonic()
        session.config = dict(msg.get("config") or session.config)
        session.recent.append(session.remote.latest)
        self.shares.taken(session.job_id, msg.get("budget_seq"))
        self.shares.progressed(session.job_id, session.remote.latest.trained_steps)

    # --- tuning -----------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        for session in list(self.sessions.values()):
            silent = now - session.last_seen
            if protocol.too_silent(silent, session.hello.get("pid")):
                logger.warning("job %s silent for %.0f s; dropped", session.job_id, silent)
                self._drop(session, "job went silent")
            elif session.remote.latest is not None:
                try:
                    session.tuner.tick()
                except Exception as exc:  # a storage failure must not take down the other jobs
                    logger.exception("tuning job %s failed; dropped", session.job_id)
                    self.failed[session.job_id] = (now + FAILED_HOLD_S, type(exc).__name__)
                    self._drop(session, "tuner error")
        self.failed = {j: f for j, f in self.failed.items() if f[0] > now}
        self.shares.tick()

    def _drop(self, session: Session, reason: str) -> None:
        self.sessions.pop(session.job_id, None)
        if self.shares is not None:  # a stopping daemon leaves every job what it has
            self.shares.leave(session.job_id, rebalance=not self.stopping)
        try:
            session.tuner.close(reason)
        except Exception:  # the storage may be the reason; the trial is failed on resume
            logger.exception("could not close the trial of job %s", session.job_id)

    # --- reading ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What ``autotune status`` shows: the daemon and, per job, the current config, live
        rates, the best so far and the trial history (``status.daemon_status``)."""
        return daemon_status(self, LIVE_SPAN_S)

    # --- sharing the machine ----------------------------------------------------------------

    def _offer(self, identity: bytes, msg: dict[str, Any]) -> None:
        try:
            pid = sender_pid(msg, self.peer)
            if problem := self.offer_owners.problem(pid, self.peer_key):
                raise ValueError(problem)
            budget = self.shares.offer(claim_from("offer", msg.get("claim")), pid)
            self.offer_owners.note(pid, self.peer_key)
        except ValueError as exc:  # a malformed claim, or AllocationError
            self._send(identity, MsgType.ERROR, message=str(exc))
            return
        except Exception as exc:  # whatever else its input makes fail: answered all the same
            logger.exception("an offer failed")
            self._send(identity, MsgType.ERROR, message=offer_failed(msg.get("claim"), exc))
            return
        energy = energy_shares(self.shares.machine, budget)
        self._send(identity, MsgType.OFFER, budget=budget.to_dict(), **energy)

    def _budget(self, job_id: str, budget: Budget, changed: bool) -> None:
        """A job's budget: to the job (pin there) and, where it changed, to its tuner (stay
        inside; a budget that changed after the first, the model's best inside it)."""
        session = self.sessions.get(job_id)
        if session is None:
            return
        share = self.shares.shares[job_id]
        energy = energy_shares(self.shares.machine, budget)
        self._send(
            session.identity,
            MsgType.BUDGET,
            seq=share.seq,
            budget=budget.to_dict(),
            **energy,
        )
        if not changed:
            return
        pct = budget.mps_pct if budget.gpu is not None else None
        session.tuner.set_limits({**limits_for(len(budget.cores), pct), **energy})
        best = (session.tuner.best() or {}).get("values") or {}  # not a trial being measured
        running = {**(session.tuner.applied or session.tuner.base), **best}
        sized = self.shares.sized(job_id, budget, running) if share.seq > 1 else None
        if sized is not None:  # a changed budget: the model's best inside it, at once
            session.tuner.adopt(sized)
        logger.info("job %s: budget %s", job_id, budget.to_dict())

    def _params(self, job_id: str) -> Params | None:
        """A job's fitted model multipliers, where its model sampler has fitted them."""
        session = self.sessions.get(job_id)
        sampler = getattr(session.tuner.study, "sampler", None) if session else None
        return getattr(sampler, "last", {}).get("params")


def run_daemon(endpoint: str, reserve: int | None = None) -> int:
    """Binds ``endpoint`` and serves until stopped (``autotune daemon run``/``start``).
    Returns the exit status: 2 if it cannot bind."""
    try:
        daemon = Daemon(endpoint, reserve=reserve)
        daemon.bind()
    except (protocol.ControlError, zmq.ZMQError) as exc:
        logger.error("cannot start: %s", exc)
        return 2
    daemon.serve()
    return 0
