"""What each node of a Ray cluster offers a run's actors, and its round trip to this machine:
the throughput model's per-node facts (``autotune.tuning.node_model``).

A node's round trip is the median time of a no-op Ray task pinned to it (after one that starts
a worker there), less the same on this machine's own node: Ray's fixed cost of a call cancels,
and what is left is what the network adds. It is measured once, when the run is sized.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

logger = logging.getLogger(__name__)

TRIES = 5
TIMEOUT_S = 60.0
"""A node that does not answer in this long is left out (a warning says so)."""


@ray.remote(num_cpus=0)
def _echo() -> None:
    return None


def round_trip_s(node_id: str, tries: int = TRIES) -> float | None:
    """The median seconds of a no-op task on ``node_id`` (None: it did not answer)."""
    fn = _echo.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    try:
        ray.get(fn.remote(), timeout=TIMEOUT_S)  # starts a worker there
        times = []
        for _ in range(tries):
            start = time.perf_counter()
            ray.get(fn.remote(), timeout=TIMEOUT_S)
            times.append(time.perf_counter() - start)
    except (ray.exceptions.RayError, TimeoutError) as exc:
        logger.warning("node %s did not answer a round trip: %s", node_id[:12], exc)
        return None
    return statistics.median(times)


def node_facts(cluster: Any) -> list[dict[str, Any]]:
    """The live nodes that offer CPUs, as ``autotune.tuning.node_model.NodeModel`` documents:
    ``name`` (short id), ``cpus``, ``here`` (on this host) and ``rtt_s`` (its round trip beyond
    this machine's own node's; 0 on this host). ``cluster``: a connected ``RayCluster``."""
    head_ip = cluster.head_ip()
    base = round_trip_s(ray.get_runtime_context().get_node_id()) or 0.0
    out = []
    for node in cluster.nodes():
        if node.cpus < 1:
            continue
        here = node.ip == head_ip
        trip = 0.0 if here else round_trip_s(node.node_id)
        if trip is None:
            continue
        out.append(
            {
                "name": node.node_id[:12],
                "cpus": node.cpus,
                "here": here,
                "rtt_s": max(0.0, trip - base) if not here else 0.0,
            }
        )
    return out
