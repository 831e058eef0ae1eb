"""The inference GMI: one process that acts for every actor in batches (SEED RL-style).

With ``inference='gmi'`` the actors do not run the policy. Each sends the observations of a
group of its environments (INFER) to this process's ROUTER and steps its other group while it
waits. This process takes every request waiting, runs them as one batch on its device (a GPU
under MPS with ``inference_mps_pct``, or the CPU), and answers each actor with its actions,
log-probs and the policy version that produced them (ACTIONS). Batching is greedy: whatever
arrived while the previous batch ran makes the next one, so batches grow with load and an
idle actor never waits for others. Newer weights come from the runner's forwarder between
batches, as they do for actors.

A malformed request is counted and dropped (its actor then times out with an error, and the
runner restarts it); nothing else is ever dropped.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from runtime import topology, wire
from runtime.commands import CommandIn
from runtime.config import TrainConfig
from runtime.envs import EnvInfo
from runtime.gmi import placement
from runtime.policy_io import WeightsReceiver
from runtime.stages.common import StatsSender, exit_requested, init_service_process

# torch, and the policy that imports it, are imported inside functions: the runner imports this
# module (for inference_main) without loading torch, and the inference GMI loads it only after
# ``placement.bind_gpu`` has set its CUDA and MPS environment.

logger = logging.getLogger(__name__)

NAME = "inference"
"""The inference GMI's process and telemetry name."""
STATS_INTERVAL_S = 0.5
POLL_MS = 50
MAX_BATCH_REQUESTS = 1024
"""At most this many requests make one batch (the rest wait for the next)."""


@dataclass(frozen=True)
class InferencePlace:
    """Where the inference GMI runs: a GPU (with an MPS percentage or none) or the CPU."""

    gpu: int | None
    mps_pct: int | None
    env: dict[str, str]
    """MPS client variables, set before CUDA starts."""
    threads: int


class InferenceServer:
    """Serves INFER requests from a ROUTER socket in batches (see the module docstring).

    Args:
        cfg: The run's configuration.
        info: The environment description.
        router: ROUTER bound to the actors' DEALERs.
        weights: SUB for the versioned weights.
        stats: Telemetry sender, or None.
        place: Where this GMI runs.
        run_key: The run's weights key (the signature every WEIGHTS message must carry).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        info: EnvInfo,
        router: zmq.Socket,
        weights: zmq.Socket,
        stats: StatsSender | None,
        place: InferencePlace,
        run_key: bytes = b"",
    ) -> None:
        import torch

        from policies.actor_critic import ActorCritic

        self.router, self.stats, self.place = router, stats, place
        self.obs_dim = info.obs_dim
        self.device = torch.device("cuda" if place.gpu is not None else "cpu")
        torch.manual_seed(cfg.seed)  # version 0: the weights the trainer starts from
        model = ActorCritic(
            info.obs_dim, info.act_dim, info.discrete, cfg.policy, cfg.learner.normalize_obs
        )
        self.model = model.to(self.device).eval()
        self.weights = WeightsReceiver(weights, self.model, NAME, run_key)
        self.sm_count = (
            torch.cuda.get_device_properties(0).multi_processor_count
            if place.gpu is not None
            else None
        )
        self.malformed = wire.MalformedCounter(NAME)
        self.counters = {
            "requests": 0,
            "rows": 0,
            "value_rows": 0,
            "batches": 0,
            "compute_s": 0.0,
            "max_batch_rows": 0,
        }
        """``rows``: observations acted on (one per env step); ``value_rows``: observations
        valued (truncated episodes)."""

    def _valid(self, msg: wire.Message) -> str:
        """The request's kind (``act`` or ``value``); raises ProtocolError if malformed."""
        if msg.type is not wire.MsgType.INFER:
            raise wire.ProtocolError(f"expected infer, got {msg.type.value}")
        kind = msg.meta.get("kind")
        if kind not in ("act", "value"):
            raise wire.ProtocolError(f"kind={kind!r}: allowed 'act' or 'value'")
        wire.meta_int(msg.meta, "tag")
        if len(msg.arrays) != 1:
            raise wire.ProtocolError(f"{len(msg.arrays)} arrays; an infer request has one")
        obs = msg.arrays[0]
        if obs.dtype != np.float32 or obs.ndim != 2 or obs.shape[1] != self.obs_dim:
            raise wire.ProtocolError(
                f"observations {obs.dtype}{list(obs.shape)}: expected float32 [n, {self.obs_dim}]"
            )
        return kind

    def take_waiting(self) -> list[tuple[bytes, str, wire.Message]]:
        """Every well-formed request waiting now (up to ``MAX_BATCH_REQUESTS``)."""
        out: list[tuple[bytes, str, wire.Message]] = []
        while len(out) < MAX_BATCH_REQUESTS:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                msg = wire.decode(frames[1:])
                out.append((frames[0].bytes, self._valid(msg), msg))
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)
        return out

    def serve(self, requests: list[tuple[bytes, str, wire.Message]]) -> None:
        """Runs one batch: every act request in one forward pass, every value request in
        another; answers each request with its slice."""
        import torch

        started = time.perf_counter()
        for kind in ("act", "value"):
            batch = [(who, msg) for who, k, msg in requests if k == kind]
            if not batch:
                continue
            obs = np.concatenate([msg.arrays[0] for _, msg in batch])
            x = torch.from_numpy(obs).to(self.device)
            if kind == "act":
                actions, logp = self.model.sample(x)
                outs = [actions.cpu().numpy(), logp.cpu().numpy()]
            else:
                with torch.no_grad():
                    outs = [self.model.values(x).cpu().numpy()]
            version = self.weights.version
            start = 0
            for who, msg in batch:
                n = msg.arrays[0].shape[0]
                meta = {"tag": msg.meta["tag"], "version": version}
                answer = [o[start : start + n] for o in outs]
                wire.send(self.router, [who, *wire.encode(wire.MsgType.ACTIONS, meta, answer)])
                start += n
            self.counters["rows" if kind == "act" else "value_rows"] += len(obs)
            if kind == "act":
                self.counters["max_batch_rows"] = max(self.counters["max_batch_rows"], len(obs))
        self.counters["requests"] += len(requests)
        self.counters["batches"] += 1
        self.counters["compute_s"] += time.perf_counter() - started

    def snapshot(self, final: bool = False) -> dict[str, Any]:
        c = self.counters
        return {
            **c,
            "rows_per_batch": c["rows"] / c["batches"] if c["batches"] else 0.0,
            "version": self.weights.version,
            "device": self.device.type,
            "gpu": self.place.gpu,
            "mps_pct": self.place.mps_pct,
            "sm_count": self.sm_count,
            "malformed": self.malformed.count + self.weights.malformed.count,
            "final": final,
        }

    def run(self, commands: CommandIn) -> None:
        """Serves until the runner's COMMAND ``exit`` (sent once every actor has exited)."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(commands.sock, zmq.POLLIN)
        last_stats = time.monotonic()
        while True:
            ready = dict(poller.poll(POLL_MS))
            self.weights.poll()
            if self.router in ready:
                requests = self.take_waiting()
                if requests:
                    self.serve(requests)
            if commands.sock in ready and exit_requested(commands, self.malformed):
                break
            if self.stats is not None and time.monotonic() - last_stats >= STATS_INTERVAL_S:
                self.stats.send(self.snapshot())
                last_stats = time.monotonic()
        if self.stats is not None:
            self.stats.send(self.snapshot(final=True))


def inference_main(
    cfg: TrainConfig, info: EnvInfo, endpoints: topology.Endpoints, place: InferencePlace
) -> None:
    """Process entry point of the inference GMI."""
    placement.bind_gpu(place.gpu, place.env)
    init_service_process(NAME)
    import torch

    torch.set_num_threads(place.threads)
    ctx = zmq.Context()
    stats = StatsSender.service(ctx, endpoints, NAME)  # its guard first, then the binds
    router, weights, commands = topology.inference_sockets(ctx, endpoints)
    server = InferenceServer(cfg, info, router, weights, stats, place, endpoints.run_key)
    logger.info(
        "inference GMI on %s (gpu %s, mps %s%%, %s SMs, pid %d)",
        server.device,
        place.gpu,
        place.mps_pct,
        server.sm_count,
        os.getpid(),
    )
    server.run(commands)
    stats.guard.stop()
    ctx.destroy(linger=0)
