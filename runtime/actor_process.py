"""An actor's process: its set-up, its sockets and its entry point, around the rollout loop
(``runtime.actor.Actor``). A local actor starts in ``actor_main``; an actor on a Ray node runs
``run_actor`` in its task (``runtime.cluster.remote_actor``)."""

from __future__ import annotations

import logging
import multiprocessing.sharedctypes
import os
import sys
from typing import Any

import numpy as np
import zmq

from policies.numpy_policy import NumpyPolicy
from runtime import initial_weights, topology
from runtime.actor import NONFINITE_EXIT, Actor, NonFiniteEnv
from runtime.config import TrainConfig
from runtime.envs import EnvInfo
from runtime.policy_io import LocalPolicy, RemotePolicy, WeightsReceiver
from runtime.receipts import Receipts
from runtime.stages.common import StatsSender, init_service_process
from runtime.stages.dispenser import Dispenser

logger = logging.getLogger(__name__)

FIRST_WEIGHTS_WAIT_S = 2.0
"""A restarted actor waits this long for current weights before acting with version 0."""


def init_actor_process(actor: int, nice: int = 0) -> None:
    """Process set-up: signals, logging and ``nice`` added to the process's niceness. An actor
    owns its cores: it acts with a numpy copy of the policy (no torch), the pool starts it with
    one BLAS thread (``runtime.actor_placement.one_blas_thread``) and pins it from outside, right
    after its start and before it starts a thread (``ActorPool.pin``), so its env engine's and
    ZeroMQ's threads inherit the cores, and a budget that changes while it starts is not
    undone by cores it was handed at its start."""
    init_service_process(f"actor-{actor}")
    if nice:
        os.nice(nice)


def actor_main(
    cfg: TrainConfig,
    info: EnvInfo,
    endpoints: topology.Endpoints,
    actor: int,
    incarnation: int,
    stepped: multiprocessing.sharedctypes.Synchronized,
    stop: Any,
    initial: initial_weights.Weights | str | None,
    threads: int | None = None,
) -> None:
    """Process entry point of actor slot ``actor`` (its ``incarnation``-th start), with
    ``threads`` EnvPool threads (None: its share of the cores); see ``run_actor``. Exits
    with ``NONFINITE_EXIT`` where its env returned a non-finite value."""
    init_actor_process(actor, cfg.actor_nice)
    code = run_actor(cfg, info, endpoints, actor, incarnation, stepped, stop, initial, threads)
    if code:
        sys.exit(code)


def run_actor(
    cfg: TrainConfig,
    info: EnvInfo,
    endpoints: topology.Endpoints,
    actor: int,
    incarnation: int,
    stepped: Any,
    stop: Any,
    initial: initial_weights.Weights | str | None,
    threads: int | None = None,
) -> int:
    """Runs actor slot ``actor``'s rollout loop (``threads`` EnvPool threads; None: its share
    of this process's cores) until ``stop`` is set; returns 0, or
    ``NONFINITE_EXIT`` (not a crash to restart: the run stops, saying why). ``stepped`` is a
    counter with a ``value`` it bumps per env step (shared with the runner, or a remote actor's
    own: ``runtime.cluster``). ``initial`` holds the run's version-0 weights
    (``policies.actor_critic.initial_state_arrays``) for ``inference='actor'``, or the path of
    their file (``runtime.initial_weights``); None with an inference GMI.
    """
    ctx = zmq.Context()
    policy: LocalPolicy | RemotePolicy
    if cfg.inference == "gmi":
        policy = RemotePolicy(topology.actor_inference_out(ctx, endpoints))
    else:
        if initial is None:
            raise ValueError("inference='actor' needs the version-0 weights")
        seed = np.random.SeedSequence([cfg.seed & (2**64 - 1), actor, incarnation])
        arrays = initial_weights.load(initial)  # a local actor's come as a file
        model = NumpyPolicy(info.discrete, cfg.learner.normalize_obs, *arrays, seed=seed)
        weights = WeightsReceiver(
            topology.actor_weights_in(ctx, endpoints), model, "actor", endpoints.run_key
        )
        if incarnation > 0:
            weights.poll(int(FIRST_WEIGHTS_WAIT_S * 1000))
        policy = LocalPolicy(weights)
    receipts = Receipts(
        topology.actor_receipts_in(ctx, endpoints), f"{actor}:{incarnation}", endpoints.run_key
    )
    dispenser = Dispenser(
        topology.actor_experience_out(ctx, endpoints), actor, incarnation, endpoints.run_key
    )
    stats = StatsSender(
        topology.telemetry_out(ctx, endpoints), f"actor-{actor}.{incarnation}", endpoints.run_key
    )
    logger.debug(
        "actor %d.%d stepping %d x %s (pid %d)",
        actor,
        incarnation,
        cfg.envs_per_actor,
        cfg.env,
        os.getpid(),
    )
    commands = topology.command_in(ctx, endpoints)
    try:
        Actor(
            cfg,
            info,
            actor,
            incarnation,
            dispenser,
            policy,
            receipts,
            stats,
            stepped,
            commands,
            threads,
        ).run(stop)
    except NonFiniteEnv as exc:
        logger.error("%s", exc)
        stats.send({"fatal": str(exc)})
        ctx.destroy(linger=topology.LINGER_MS)
        return NONFINITE_EXIT
    ctx.destroy(linger=topology.LINGER_MS)
    return 0
