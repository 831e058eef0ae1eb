"""The Ray cluster a run places its actors on: connected to (``auto``, ``ray://``) or started
for the run (``local:N``), its live nodes, and its end."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from runtime.cluster.address import ClusterAddress
from runtime.config import ConfigError

logger = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 96 * 2**20
"""Object store of each node of a ``local:N`` cluster: actors pass their start-up arguments
through it, nothing more (experience goes over ZeroMQ), and /dev/shm may be small."""


class ClusterError(ConfigError):
    """The Ray cluster could not be reached or started (the message says why)."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


@dataclass(frozen=True)
class Node:
    """A live Ray node: its id, its address and the CPUs it offers."""

    node_id: str
    ip: str
    cpus: int


class RayCluster:
    """A connection to a Ray cluster for one run (``close`` ends it, and stops a ``local:N``
    cluster it started)."""

    def __init__(self, address: ClusterAddress) -> None:
        self.address = address
        self._local: Any = None
        try:
            import ray
        except ImportError:
            raise ClusterError(
                f"--cluster {address} needs Ray: pip install 'rl-autotune[cluster]'"
            ) from None
        self.ray = ray
        opts: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
        try:
            if address.kind == "local":
                self._start_local(address.nodes)
                ray.init(address=self._local.address, **opts)
                self._local.wait_for_nodes()
            else:
                target = "auto" if address.kind == "auto" else address.target
                ray.init(address=target, **opts)
        except ClusterError:
            raise
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
            self.close()
            raise ClusterError(f"--cluster {address}: Ray could not connect ({exc})") from None
        logger.info("Ray cluster %s: %d live nodes", address, len(self.nodes()))

    def _start_local(self, nodes: int) -> None:
        from ray.cluster_utils import Cluster

        per_node = max(1, (len(os.sched_getaffinity(0)) or 1) // nodes)
        store = {"object_store_memory": LOCAL_OBJECT_STORE_BYTES}
        # the head node offers no CPUs: the run's own processes live on this machine already
        self._local = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False, **store},
        )
        for _ in range(nodes):
            self._local.add_node(num_cpus=per_node, **store)

    @property
    def local(self) -> Any:
        """The ``ray.cluster_utils.Cluster`` of a ``local:N`` cluster (tests remove nodes
        from it), else None."""
        return self._local

    def nodes(self) -> list[Node]:
        """The live nodes, in Ray's order."""
        out = []
        for n in self.ray.nodes():
            if n.get("Alive"):
                cpus = int(n.get("Resources", {}).get("CPU", 0))
                out.append(Node(n["NodeID"], n.get("NodeManagerAddress", ""), cpus))
        return out

    def head_ip(self) -> str:
        """The address Ray knows this machine by."""
        return str(self.ray.util.get_node_ip_address())

    def close(self) -> None:
        try:
            self.ray.shutdown()
        finally:
            if self._local is not None:
                self._local.shutdown()
                self._local = None
