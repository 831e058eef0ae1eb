"""Actors on a Ray cluster's nodes (``autotune train --cluster``): Ray places them, the run's
``tcp://`` links with CURVE carry their experience, and each node's energy is measured there.

    address.py       what ``--cluster`` names (auto, ray://HOST:PORT, local:N)
    ray_cluster.py   the connection (or the local cluster started for the run) and its nodes
    remote_actor.py  the Ray actor that runs one actor incarnation's rollout loop
    launcher.py      incarnations placed by node, behind a process's face for the actor pool
    node_energy.py   a meter per node, summed per host
    latency.py       what each node offers, and its round trip (the model's per-node facts)

The stages, the trainer GMIs and the tuner stay on this machine (the head). Ray is imported
only by a run that names a cluster.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

from runtime.cluster.address import ClusterAddress, parse_cluster

__all__ = ["ClusterAddress", "cluster_cpus", "cluster_nodes", "launch", "parse_cluster"]


@functools.lru_cache(maxsize=4)
def cluster_nodes(text: str) -> tuple[dict[str, Any], ...]:
    """The nodes the cluster ``text`` offers actors, each as ``{"name", "cpus", "here",
    "rtt_s"}`` (``runtime.cluster.latency.node_facts``: on this host or not, and the round
    trip a node on another host adds). A ``local:N`` cluster's nodes share this machine's
    cores and are not started for this. Connects and disconnects for it, except for
    ``local:N``; asked again in one process, gives the first answer.

    Raises:
        runtime.cluster.ray_cluster.ClusterError: Ray is missing or cannot connect.
        ValueError: ``text`` is not a cluster address.
    """
    address = parse_cluster(text)
    if address.kind == "local":
        import os

        per = max(1, len(os.sched_getaffinity(0)) // address.nodes)
        node = {"cpus": per, "here": True, "rtt_s": 0.0}
        return tuple({"name": f"local-{i}", **node} for i in range(address.nodes))
    from runtime.cluster.latency import node_facts
    from runtime.cluster.ray_cluster import RayCluster

    cluster = RayCluster(address)
    try:
        return tuple(node_facts(cluster))
    finally:
        cluster.close()


def cluster_cpus(text: str) -> tuple[int, int]:
    """The CPUs the cluster ``text`` offers for actors, and of them those on hosts other than
    this one (a ``local:N`` cluster's are all this machine's cores): ``cluster_nodes``' sums.

    Raises:
        runtime.cluster.ray_cluster.ClusterError: Ray is missing or cannot connect.
        ValueError: ``text`` is not a cluster address.
    """
    nodes = cluster_nodes(text)
    return sum(n["cpus"] for n in nodes), sum(n["cpus"] for n in nodes if not n["here"])


def launch(cfg: Any, telemetry: Any) -> Any:
    """Connects to (or starts) ``cfg.cluster`` and returns the run's ``RemoteLauncher``
    (``close()`` it at the end: it returns the per-node energy and ends the connection).

    Raises:
        runtime.cluster.ray_cluster.ClusterError: Ray is missing or cannot connect, or a node
            on another host could not reach ``cfg.bind_host``.
    """
    from runtime.cluster.ray_cluster import ClusterError, RayCluster

    cluster = RayCluster(parse_cluster(cfg.cluster))
    try:
        if ipaddress.ip_address(cfg.bind_host).is_loopback:
            head = cluster.head_ip()
            away = [n for n in cluster.nodes() if n.cpus and n.ip != head]
            if away:
                raise ClusterError(
                    f"bind host {cfg.bind_host} is loopback, but node {away[0].ip} of the "
                    "cluster is another host: give --bind-host an address of this machine "
                    f"that the nodes reach (Ray knows this one as {head})"
                )
        from runtime.cluster.launcher import RemoteLauncher

        return RemoteLauncher(cluster, telemetry, cfg.cpu_idle_w)
    except BaseException:
        cluster.close()
        raise
