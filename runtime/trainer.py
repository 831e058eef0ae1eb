"""Trainer GMI processes: batcher -> APPO learner -> versioned weights back to the actors.

A GMI (GPU multiplexing instance) is one trainer process bound to one GPU (under MPS, to a
share of its SMs: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) or to the CPU. Several GMIs train
data-parallel: each pulls chunk channels from the migrator with credits into its own batcher,
and all take every update in lockstep (``runtime.gmi.group``), averaging gradients with the
strategy the GMI-to-GPU layout selects. Rank 0 publishes the weights after every update.

End of a GMI:
  * EOS from the migrator (end of the run): train what is left, report, exit.
  * RETIRE (a hand-over; the runner started the next generation of GMIs): the same, then
    rank 0 writes the learner state (weights, optimiser, policy version) to the file the next
    generation waits for. The next generation grants the migrator credits only once it has
    loaded that state: until then the old generation trains on every chunk (make before
    break, ``runtime.gmi.fleet``), and none waits, growing stale, in a GMI that cannot train
    it yet. Nothing trained is lost and no experience is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import zmq

from policies.nonfinite import NonFiniteUpdate
from runtime import checkpoint, wire
from runtime.atomic_file import replaced
from runtime.commands import CommandIn
from runtime.config import TrainConfig
from runtime.envs import EnvInfo
from runtime.gmi.role import GMIRole
from runtime.stages.batcher import Batcher
from runtime.stages.common import LiveSettings, StatsSender

# torch (and the policies and GMI group that import it) loads inside functions: the runner imports
# this module without it, and a GMI only after ``placement.bind_gpu`` set its CUDA and MPS env.

logger = logging.getLogger(__name__)
REPORTED = ("loss_pi", "loss_v", "entropy", "lr", "kl", "noise_scale")
"""The figures of each update (``policies.appo.UpdateStats``) a trainer reports."""
STATS_INTERVAL_S = 0.5
WINDOW_CHUNKS = 4
RESUME_POLL_S = 0.05
RECOVERY_S = 10.0
"""How often the lead GMI saves what a replacement goes on from (``runtime.supervisor``); the
first save comes right after its first update, so a GMI that dies in its first seconds of
training does not send its replacement back to the state it started from."""


class Trainer:
    """Owns the batcher, the learner and the sockets of one trainer GMI.

    Args:
        cfg: The run's configuration.
        info: The environment description.
        dealer: DEALER to the migrator.
        weights: PUB for the weights (rank 0), else None.
        stats: Telemetry sender, or None.
        role: Place and generation; a single CPU/GPU trainer of generation 0 when None.
        group: The data-parallel group when the generation has several GMIs, else None.
        run_key: The run's weights key: every WEIGHTS message is signed with it.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        info: EnvInfo,
        dealer: zmq.Socket,
        weights: zmq.Socket | None,
        stats: StatsSender | None,
        role: GMIRole | None = None,
        group: Any = None,
        commands: CommandIn | None = None,
        run_key: bytes = b"",
    ) -> None:
        import torch

        from policies.actor_critic import ActorCritic
        from policies.appo import APPOLearner
        from policies.compiled_loss import compile_parts

        self.cfg, self.role, self.group = cfg, role, group
        self.dealer, self.weights, self.stats = dealer, weights, stats
        self.commands, self.run_key = commands, run_key
        self.live = LiveSettings()
        self.live.reset_epoch = role.reset_epoch if role is not None else 0
        self.saved_version: int | None = None
        self.halted: str | None = None
        """Why this trainer stopped training (a non-finite update), or None."""
        on_gpu = role.spec.gpu is not None if role is not None else cfg.resolved_device() == "cuda"
        self.device = "cuda" if on_gpu else "cpu"
        torch.manual_seed(cfg.seed)  # the actors build the same version-0 weights
        model = ActorCritic(
            info.obs_dim, info.act_dim, info.discrete, cfg.policy, cfg.learner.normalize_obs
        )
        model.matmul_dtype = torch.bfloat16 if cfg.trainer_precision == "bf16" else None
        dev, in_group = torch.device(self.device), group is not None  # a group: eager loop
        built = time.monotonic()
        self.learner = APPOLearner(model, cfg.learner, dev, cfg.steps, group=in_group)
        compiled = time.monotonic()
        self.learner.prepare(cfg.rollout_len)  # a compiled loss: before this GMI reports
        self.built_s = {"learner": compiled - built, "compile": time.monotonic() - compiled}
        self.compile_parts = compile_parts()  # where the compile's seconds went
        self.startup: dict[str, float] = {}  # the start's stages (runtime.startup_clock)
        self.learner.batch = cfg.batch_size  # a new generation starts at the run's batch now
        props = torch.cuda.get_device_properties(0) if on_gpu else None
        self.sm_count = props.multi_processor_count if props is not None else None
        self.batcher = Batcher(cfg.batch_size // cfg.rollout_len, WINDOW_CHUNKS)
        self.malformed = wire.MalformedCounter("trainer")
        self.eos = self.retiring = False
        self.env_info = info
        self.resume_from = role.resume_from if role is not None else None
        """The hand-over file of the previous generation, or for generation 0 the checkpoint
        the runner resumes from (``runtime.checkpoint``)."""
        self.resumed = self.resume_from is None
        self.floor_version = role.floor_version if role is not None else 0
        """Experience sampled with an older version is discarded (``GMIRole.floor_version``)."""
        self.trained_steps = 0
        self.updates = 0  # learner updates this GMI took part in (a group's, rows or none)
        self.credits_sent = 0  # CREDIT messages sent: the next one's number (``cseq``)
        self.discarded_steps = 0
        self.lag_sum, self.lag_max = 0.0, 0
        self.last: dict[str, float] = {}

    def publish(self) -> None:
        """Sends the weights and their version (rank 0 only); actors keep only the newest."""
        if self.weights is None:
            return
        names, arrays = self.learner.model.state_arrays()
        version = self.learner.version
        meta = {
            "version": version,
            "names": names,
            "mac": wire.weights_mac(self.run_key, version, names, arrays),
        }
        with contextlib.suppress(zmq.Again):  # no room for a subscriber: it gets a newer one
            wire.send_msg(self.weights, wire.MsgType.WEIGHTS, meta, arrays, zmq.NOBLOCK)

    def _grant_credits(self) -> None:
        n = self.batcher.credits_to_grant()
        if n:
            queued, epoch = self.batcher.queued_steps, self.live.reset_epoch
            meta = wire.credit_meta(self.run_key, self.name, n, queued, self.credits_sent, epoch)
            self.credits_sent += 1
            wire.send_msg(self.dealer, wire.MsgType.CREDIT, meta)

    def _receive(self, timeout_ms: int) -> None:
        if not self.dealer.poll(timeout_ms):
            return
        for msg in wire.recv_waiting(self.dealer, self.malformed):
            if msg.type is wire.MsgType.EOS:
                self.eos = True
                continue
            if msg.type is wire.MsgType.RETIRE:
                self.retiring = True
                continue
            try:
                self.batcher.add(msg)
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)

    def _try_resume(self) -> None:
        """Loads the previous generation's learner state once its file exists."""
        path = self.resume_from
        if not os.path.exists(path):
            return
        self.learner.load_state(checkpoint.load_state(path, self.device))
        self.resumed = True
        logger.info("%s took over the learner at version %d", self.name, self.learner.version)
        self.publish()

    def _train(self, rows: int | None = None) -> None:
        """One update on up to ``rows`` rows (a batch by default).

        In a group every rank calls this once per agreed update, with 0 rows if it has none.
        """
        batch = None
        if rows != 0:
            lag = self.cfg.learner.max_policy_lag
            taken = self.batcher.take(self.learner.version, lag, rows, self.floor_version)
            self.discarded_steps += taken.discarded_steps
            batch = taken.batch if taken.rows else None
        if batch is not None and self.halted is not None:  # a run that is stopping: not trained
            self.discarded_steps += int(batch["rewards"].size)
            batch = None
        if batch is None and (self.group is None or self.halted is not None):
            if rows != 0 and self.halted is None:  # only stale rows: announce the weights again
                self.publish()
            return
        try:
            result = self.learner.update(batch, self.group)
        except NonFiniteUpdate as exc:
            self.halted = f"{self.name}: {exc} (env {self.cfg.env})"
            logger.error("%s; the run stops", self.halted)
            self.discarded_steps += int(batch["rewards"].size) if batch is not None else 0
            return
        self.updates += 1
        if result.steps:
            self.trained_steps += result.steps
            self.lag_sum += result.policy_lag_mean * result.steps
            self.lag_max = max(self.lag_max, result.policy_lag_max)
            self.last = {k: getattr(result, k) for k in REPORTED}
        self.publish()

    def snapshot(self, final: bool = False) -> dict[str, object]:
        lag_mean = self.lag_sum / self.trained_steps if self.trained_steps else 0.0
        discarded = self.discarded_steps + self.batcher.dropped_steps
        out = {
            "trained_steps": self.trained_steps,
            "discarded_steps": discarded,
            "version": self.learner.version,
            "policy_lag_mean": lag_mean,
            "policy_lag_max": self.lag_max,
            "queued_steps": self.batcher.queued_steps,
            "device": self.device,
            "sm_count": self.sm_count,
            "malformed": self.malformed.count,
            "holds_state": self.resumed,  # it has the run's learner state and trains
            "resumed": self.resumed and self.resume_from is not None,  # took over a saved one
            "floor_version": self.floor_version,
            "retired": final and self.retiring,
            "batch_size": self.batcher.batch_rows * self.cfg.rollout_len,
            "live_epoch": self.live.epoch,
            "reset_epoch": self.live.reset_epoch,
            "fatal": self.halted,
            "startup": self.startup,
            "compile_parts": self.compile_parts,
            "cpu_s": round(time.process_time(), 3),  # the process's, every thread's
            **self.batcher.counters,
            **self.last,
            "final": final,
        }
        if self.role is not None:
            out.update(
                rank=self.role.spec.rank,
                generation=self.role.generation,
                gpu=self.role.spec.gpu,
                mps_pct=self.role.spec.mps_pct,
            )
        if self.group is not None:
            out["sync"] = self.group.strategy.value
        if final:
            out["weights_digest"] = self.learner.model.weights_digest()
        return out

    def _finishing(self) -> bool:
        return self.eos or self.retiring

    def run(self) -> None:
        """Trains until EOS or RETIRE, then trains the remainder, hands over and reports."""
        if self.resumed:
            self.publish()
        last_save = time.monotonic()
        last_recovery: float | None = None  # the first right after this GMI's first update
        last_stats = 0.0  # the first snapshot goes at once: a new GMI reports as it starts
        last_resume_try = 0.0
        while True:
            self._take_live_settings()
            if self.resumed:
                self._grant_credits()
            self._receive(0 if self.batcher.ready() else 20)
            now = time.monotonic()
            if not self.resumed:
                if now - last_resume_try >= RESUME_POLL_S:
                    last_resume_try = now
                    self._try_resume()
            elif self.group is None:
                if self.batcher.ready():
                    self._train()
                elif self._finishing():
                    break
            elif (self.batcher.ready() or self._finishing()) and self._lockstep_round():
                break
            if self.stats is not None and now - last_stats >= STATS_INTERVAL_S:
                self.stats.send(self.snapshot())
                last_stats = now
            if now - last_save >= self.cfg.checkpoint_every_s:
                last_save = now
                self._checkpoint(periodic=True)
            due = last_recovery is None or now - last_recovery >= RECOVERY_S
            if due and self.updates and self._leads() and self.resumed:
                last_recovery = now
                self._save_state(self.role.recovery_file())
        self.batcher.evict_partial()  # anything still partial at EOS lost a channel
        while self.batcher.queued_rows and self.group is None:
            self._train(self.batcher.queued_rows)
        if self.retiring and self._leads():
            self._save_state(self.role.state_file())
        else:
            self._checkpoint(periodic=False)
        if self.stats is not None:
            self.stats.send(self.snapshot(final=True))

    def _checkpoint(self, periodic: bool) -> None:
        """Saves the learner to ``cfg.checkpoint`` (rank 0, a finite learner that has the
        run's state); a periodic save only when the version moved since the last. A checkpoint
        that holds a learner further on is left as it is (``checkpoint.save``)."""
        if self.cfg.checkpoint is None or (self.role is not None and self.role.spec.rank != 0):
            return
        if not self.resumed:
            return  # not yet holding the state to go on from (a non-finite step never
            # reaches the weights, so a halted trainer's are still fine to save)
        if periodic and self.learner.version == self.saved_version:
            return
        if not checkpoint.save(self.cfg.checkpoint, self.learner.state(), self.cfg, self.env_info):
            return
        self.saved_version = self.learner.version
        logger.info(
            "%s saved the learner at version %d to %s",
            self.name,
            self.learner.version,
            self.cfg.checkpoint,
        )

    def _take_live_settings(self) -> None:
        if self.commands is None:
            return
        settings = self.live.poll(self.commands, self.malformed)
        if self.live.reset_due:
            self.live.reset_due = False
            self.batcher.reset()
            logger.warning("%s: the pipeline was restarted; credits granted again", self.name)
        if settings is not None:
            self.batcher.resize(settings["batch_size"] // self.cfg.rollout_len)
            self.learner.batch = self.batcher.batch_rows * self.cfg.rollout_len  # lr_scaling
            logger.info(
                "%s: batches of %d steps (live epoch %d)",
                self.name,
                settings["batch_size"],
                self.live.epoch,
            )

    @property
    def name(self) -> str:
        return self.role.name if self.role is not None else "trainer"

    def _lockstep_round(self) -> bool:
        """One agreed update of the group; True once every rank has finished."""
        ready = self.batcher.ready()
        if not ready:
            self.batcher.evict_partial()
        rows = self.batcher.batch_rows if ready else self.batcher.queued_rows
        if self.stats is not None:  # silent in the agreement until every rank comes to it
            self.stats.send({**self.snapshot(), "group_wait": True})
        _, all_done = self.group.agree(rows, done=rows == 0)
        if all_done:
            return True
        self._train(rows)
        return False

    def _leads(self) -> bool:
        return self.role is not None and self.role.spec.rank == 0

    def _save_state(self, path: str) -> None:
        """Writes the learner state to ``path`` whole or not at all (write, then rename): the
        hand-over file when retiring, the recovery file every ``RECOVERY_S``."""
        import torch

        with replaced(path, "wb") as f:
            torch.save(self.learner.state(), f)
        logger.info(
            "%s saved the learner at version %d to %s", self.name, self.learner.version, path
        )
