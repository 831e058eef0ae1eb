"""The trainer GMI process: batcher -> APPO learner -> versioned weights back to the actors.

A GMI (GPU multiplexing instance) is one trainer process bound to a slice of one GPU; in this
version there is one, on CUDA when present, else on the CPU. It pulls chunk channels from the
migrator with credits, trains as soon as a full batch is queued, and publishes its weights
after every update. On the migrator's EOS it trains what is left (a last, smaller batch) so a
clean drain loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import zmq

from runtime import topology, wire
from runtime.config import TrainConfig
from runtime.envs import EnvInfo
from runtime.stages.batcher import Batcher
from runtime.stages.common import StatsSender, init_service_process

logger = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
WINDOW_CHUNKS = 4
REPUBLISH_S = 0.2
"""Received-step counts are re-sent this often while no update happens."""


def init_trainer_process(threads: int) -> None:
    """Process set-up: signals and logging, torch threads."""
    init_service_process("trainer")
    import torch

    torch.set_num_threads(threads)


def resolve_device(name: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible to torch, else ``cpu``."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class Trainer:
    """Owns the batcher, the learner and the trainer's sockets."""

    def __init__(self, cfg: TrainConfig, info: EnvInfo, dealer: zmq.Socket,
                 weights: zmq.Socket | None, stats: StatsSender | None) -> None:  # fmt: skip
        import torch

        from policies.actor_critic import ActorCritic
        from policies.appo import APPOLearner

        self.cfg = cfg
        self.dealer, self.weights, self.stats = dealer, weights, stats
        self.device = resolve_device(cfg.trainer_device)
        torch.manual_seed(cfg.seed)  # the actors build the same version-0 weights
        model = ActorCritic(info.obs_dim, info.act_dim, info.discrete, cfg.policy,
                            cfg.learner.normalize_obs)  # fmt: skip
        self.learner = APPOLearner(model, cfg.learner, torch.device(self.device), cfg.steps)
        self.batcher = Batcher(cfg.batch_size // cfg.rollout_len, WINDOW_CHUNKS)
        self.malformed = wire.MalformedCounter("trainer")
        self.eos = False
        self.trained_steps = 0
        self.discarded_steps = 0
        self.lag_sum = 0.0
        self.lag_max = 0
        self.last: dict[str, float] = {}
        self.last_publish = 0.0

    def publish(self, with_weights: bool = True) -> None:
        """Sends the version and received-step counts, and the weights unless told not to.

        Actors keep only the newest weights; the counts let them throttle (back-pressure).
        """
        if self.weights is None:
            return
        names, arrays = self.learner.model.state_arrays() if with_weights else ([], [])
        meta = {"version": self.learner.version, "names": names,
                "received": self.batcher.received_steps}  # fmt: skip
        with contextlib.suppress(zmq.Again):  # no room for a subscriber: it gets a newer one
            wire.send_msg(self.weights, wire.MsgType.WEIGHTS, meta, arrays, zmq.NOBLOCK)
        self.last_publish = time.monotonic()

    def _grant_credits(self) -> None:
        n = self.batcher.credits_to_grant()
        if n:
            meta = {"n": n, "queued_steps": self.batcher.queued_steps}
            wire.send_msg(self.dealer, wire.MsgType.CREDIT, meta)

    def _receive(self, timeout_ms: int) -> None:
        if not self.dealer.poll(timeout_ms):
            return
        for msg in wire.recv_waiting(self.dealer, self.malformed):
            if msg.type is wire.MsgType.EOS:
                self.eos = True
                continue
            try:
                self.batcher.add(msg)
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)

    def _train(self, rows: int | None = None) -> None:
        taken = self.batcher.take(self.learner.version, self.cfg.learner.max_policy_lag, rows)
        self.discarded_steps += taken.discarded_steps
        if taken.rows == 0:
            return
        result = self.learner.update(taken.batch)
        self.trained_steps += result.steps
        self.lag_sum += result.policy_lag_mean * result.steps
        self.lag_max = max(self.lag_max, result.policy_lag_max)
        self.last = {"loss_pi": result.loss_pi, "loss_v": result.loss_v,
                     "entropy": result.entropy}  # fmt: skip
        self.publish()

    def snapshot(self, final: bool = False) -> dict[str, object]:
        lag_mean = self.lag_sum / self.trained_steps if self.trained_steps else 0.0
        discarded = self.discarded_steps + self.batcher.dropped_steps
        return {"trained_steps": self.trained_steps, "discarded_steps": discarded,
                "version": self.learner.version, "policy_lag_mean": lag_mean,
                "policy_lag_max": self.lag_max, "queued_steps": self.batcher.queued_steps,
                "device": self.device, "malformed": self.malformed.count,
                **self.batcher.counters, **self.last, "final": final}  # fmt: skip

    def run(self) -> None:
        """Trains until the migrator's EOS, then trains the remainder and reports."""
        self.publish()
        last_stats = time.monotonic()
        while True:
            self._grant_credits()
            self._receive(0 if self.batcher.ready() else 20)
            if self.batcher.ready():
                self._train()
            elif self.eos:
                break
            now = time.monotonic()
            if now - self.last_publish >= REPUBLISH_S:
                self.publish(with_weights=False)  # refreshes the actors' view of what arrived
            if self.stats is not None and now - last_stats >= STATS_INTERVAL_S:
                self.stats.send(self.snapshot())
                last_stats = now
        self.batcher.evict_partial()  # anything still partial at EOS lost a channel
        while self.batcher.queued_rows:
            self._train(self.batcher.queued_rows)
        if self.stats is not None:
            self.stats.send(self.snapshot(final=True))


def trainer_main(cfg: TrainConfig, info: EnvInfo, endpoints: topology.Endpoints,
                 rank: int = 0) -> None:  # fmt: skip
    """Process entry point of trainer GMI ``rank``."""
    init_trainer_process(cfg.trainer_threads)
    ctx = zmq.Context()
    dealer = topology.trainer_experience_in(ctx, endpoints, rank)
    weights = topology.trainer_weights_out(ctx, endpoints) if rank == 0 else None
    stats = StatsSender(topology.telemetry_out(ctx, endpoints), f"trainer-{rank}")
    logger.info("trainer %d on %s (pid %d)", rank, resolve_device(cfg.trainer_device), os.getpid())
    Trainer(cfg, info, dealer, weights, stats).run()
    ctx.destroy(linger=topology.LINGER_MS)
