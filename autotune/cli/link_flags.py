"""``autotune train``'s flags for the run's links and where its actors run: ``--transport``,
``--bind-host`` and ``--cluster`` (which makes the links tcp unless ``--transport`` is given);
how much experience the links hold in flight: ``--max-inflight-batches`` and
``--chunk-timeout-s``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from runtime.config import TrainConfig


def add_link_args(train: argparse.ArgumentParser) -> None:
    train.add_argument(
        "--transport",
        choices=("ipc", "tcp"),
        default="ipc",
        help="the run's links between its processes: ipc (Unix sockets in a private "
        "directory) or tcp (on --bind-host, encrypted and authenticated with CURVE keys made "
        "for the run; a connection with another key is refused and counted as auth_refused) "
        "(default ipc; tcp with --cluster)",
    )
    train.add_argument(
        "--bind-host",
        default="127.0.0.1",
        metavar="IP",
        help="with --transport tcp: the address of this machine the links bind; 0.0.0.0 or :: "
        "listens on every interface, only when named; with --cluster on several hosts, an "
        "address the nodes reach (default 127.0.0.1)",
    )
    train.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="place the actors on a Ray cluster's nodes (pip install 'rl-autotune[cluster]'): "
        "auto (the cluster this machine is in), ray://HOST:PORT, or local:N (N nodes started "
        "here for the run); the stages and trainers stay on this machine; --actors auto is one "
        "actor per CPU the nodes offer (default: actors are local processes)",
    )
    add_flow_args(train)


def add_flow_args(train: argparse.ArgumentParser) -> None:
    d = TrainConfig
    train.add_argument(
        "--max-inflight-batches",
        type=float,
        default=d.max_inflight_batches,
        metavar="N",
        help="experience the actors may have sent that no trainer has taken yet, in batches, "
        "shared among the actors (each keeps at least one rollout in flight); more keeps a "
        "fast learner fed across the links' latency, at more policy lag "
        f"(default {d.max_inflight_batches:g})",
    )
    train.add_argument(
        "--chunk-timeout-s",
        type=float,
        default=d.chunk_timeout_s,
        metavar="S",
        help="the compressor sends a chunk once it holds --chunk-bytes or its oldest rollout "
        f"has waited this long (default {d.chunk_timeout_s:g})",
    )


def link_settings(args: argparse.Namespace) -> dict[str, object]:
    """The config's link fields from the flags (``--cluster`` makes the transport tcp unless
    ``--transport`` was given; a config file's values stand for flags not given)."""
    cluster = getattr(args, "cluster", None)
    transport = getattr(args, "transport", "ipc")
    if cluster is not None and "transport" not in getattr(args, "explicit", set()):
        transport = "tcp"
    return {
        "max_inflight_batches": getattr(
            args, "max_inflight_batches", TrainConfig.max_inflight_batches
        ),
        "chunk_timeout_s": getattr(args, "chunk_timeout_s", TrainConfig.chunk_timeout_s),
        "transport": transport,
        "bind_host": getattr(args, "bind_host", "127.0.0.1"),
        "cluster": cluster,
    }


def cluster_actors(console: Any, cfg: Any) -> Any:
    """``cfg`` with ``actors`` set to the CPUs ``cfg.cluster``'s nodes offer (``--actors auto``
    with ``--cluster``), said on ``console``.

    Raises:
        runtime.config.ConfigError: a setting is out of range (a malformed ``--cluster``
            among them), the cluster cannot be reached, or it offers no CPU.
    """
    from runtime.cluster import cluster_cpus
    from runtime.config import ConfigError

    problems = cfg.problems()  # a malformed --cluster before any node is asked
    if problems:
        raise ConfigError(problems)
    cpus, away = cluster_cpus(cfg.cluster)
    if cpus < 1:
        raise ConfigError([f"--cluster {cfg.cluster}: its nodes offer no CPU for actors"])
    console.print(
        f"actors: {cpus}, one per CPU the nodes of {cfg.cluster} offer ({away} on other hosts)"
    )
    return dataclasses.replace(cfg, actors=cpus)
