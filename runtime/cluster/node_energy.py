"""Energy of a cluster run's nodes: one small Ray actor per node (no CPU reserved) reads that
node's host.

Each ``NodeMeter`` reads its host's CPU energy the way a run reads its own machine's (RAPL
package counters where readable, else the labelled model: idle watts plus watts per busy core,
``runtime.energy.cpu``), the host's GPUs through NVML, and the busy-core joules of its own
node's processes (the node's raylet and everything under it: the run's actors there).

Nodes on one host see the same packages, so a host is counted once: the head's host is
already in the run's own energy (its meter), and each other host is counted through its first
node. Every node's entry says where its host was counted; ``processes_cpu_j`` is that node's
share at the per-core rate, also where its host was counted elsewhere (a ``local:N`` cluster's
nodes all share the head's host).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import ray

logger = logging.getLogger(__name__)

READ_EVERY_S = 5.0
"""How often each node's meter is read during the run: a node that disappears keeps the
energy of its last reading."""


def host_id() -> str:
    """An opaque id of this host (hashed: no machine id leaves it), equal on every Ray node
    that runs on it."""
    ident = socket.gethostname()
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            ident += Path(path).read_text().strip()
            break
        except OSError:
            continue
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


@ray.remote(num_cpus=0, max_restarts=0)
class NodeMeter:
    """The energy meter of one Ray node's host (see the module docstring)."""

    def __init__(self, cpu_idle_w: float | None) -> None:
        from runtime.energy import probe_cpu_energy, probe_gpu_energy
        from runtime.energy.cpu import CPUModelEnergy, tree_pids

        raylet = os.getppid()  # Ray starts a node's workers under its raylet
        self.cpu = probe_cpu_energy(idle_w=cpu_idle_w)
        self.gpu = probe_gpu_energy()
        self.processes = CPUModelEnergy(pids=lambda: tree_pids(raylet), children=False)
        self.origin = self._raw()

    def _raw(self) -> tuple[float, float, float]:
        return (
            self.cpu.read_energy_j(),
            sum(self.gpu.read_energy_j().values()),
            self.processes.read_energy_j(),
        )

    def host(self) -> str:
        return host_id()

    def read(self) -> dict[str, Any]:
        """Joules since the meter started: the host's CPU and GPUs, and this node's processes."""
        now = self._raw()
        cpu_j, gpu_j, proc_j = (a - b for a, b in zip(now, self.origin, strict=True))
        return {
            "cpu_j": cpu_j,
            "gpu_j": gpu_j,
            "processes_cpu_j": proc_j,
            "cpu_source": self.cpu.source,
            "cpu_model": self.cpu.describe(),
            "gpu_source": sorted(set(self.gpu.sources.values())) or ["none"],
        }


class NodeEnergy:
    """The run's node meters: started on every live node (and on nodes that join), read every
    ``READ_EVERY_S``, summed per host at the end (``doc``)."""

    def __init__(self, cpu_idle_w: float | None) -> None:
        self.cpu_idle_w = cpu_idle_w
        self.head_host = host_id()
        self.meters: dict[str, Any] = {}
        self.info: dict[str, dict[str, Any]] = {}
        """node id -> its ip, host, last reading, when it was lost."""
        self._pending: dict[str, Any] = {}
        self._last_read = 0.0

    def watch(self, nodes: list[Any]) -> None:
        """Starts a meter on each node of ``nodes`` that has none; marks nodes gone as lost."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = {n.node_id for n in nodes}
        for n in nodes:
            if n.node_id not in self.meters:
                where = NodeAffinitySchedulingStrategy(n.node_id, soft=False)
                meter = NodeMeter.options(scheduling_strategy=where).remote(self.cpu_idle_w)
                self.meters[n.node_id] = meter
                self.info[n.node_id] = {"ip": n.ip, "host": meter.host.remote(), "reading": None}
        for node_id, info in self.info.items():
            if node_id not in alive and info.get("lost_at") is None:
                info["lost_at"] = time.time()

    def tick(self, nodes: Any) -> None:
        """Every ``READ_EVERY_S``: takes finished readings, asks for new ones (never waits);
        ``nodes`` is called for the live nodes only then."""
        self._collect(timeout_s=0)
        if time.monotonic() - self._last_read < READ_EVERY_S:
            return
        self._last_read = time.monotonic()
        self.watch(nodes())
        for node_id, meter in self.meters.items():
            if node_id not in self._pending and self.info[node_id].get("lost_at") is None:
                self._pending[node_id] = meter.read.remote()

    def _collect(self, timeout_s: float) -> None:
        if not self._pending:
            return
        refs = list(self._pending.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for node_id, ref in list(self._pending.items()):
            if ref in ready:
                del self._pending[node_id]
                try:
                    self.info[node_id]["reading"] = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the meter failed, not the node
                    logger.warning("node %s: its energy meter failed: %s", node_id[:8], exc)
                except ray.exceptions.RayError:  # the node went away: its last reading stands
                    self.info[node_id].setdefault("lost_at", time.time())

    def final(self, nodes: Any = None, timeout_s: float = 10.0) -> None:
        """Reads every live meter once more (waiting up to ``timeout_s``); ``nodes`` (called
        for the live nodes) watches a node that joined since the last read first, so one that
        joined within ``READ_EVERY_S`` of the end is in the document too."""
        if nodes is not None:
            self.watch(nodes())
        for node_id, meter in self.meters.items():
            if node_id not in self._pending and self.info[node_id].get("lost_at") is None:
                self._pending[node_id] = meter.read.remote()
        self._collect(timeout_s)

    def _host(self, info: dict[str, Any]) -> str | None:
        if isinstance(info["host"], str):
            return info["host"]
        try:
            info["host"] = ray.get(info["host"], timeout=5)
        except (ray.exceptions.RayError, TimeoutError):
            return None
        return info["host"]

    def doc(self, actors_by_node: dict[str, int]) -> dict[str, Any]:
        """Per node: its host (``head`` for the head's), where that host's energy was counted,
        its readings and the actors placed there; and the joules of hosts other than the
        head's (``other_hosts_j``), which the run's steps per joule counts too."""
        nodes: dict[str, Any] = {}
        counted_hosts: dict[str, str] = {}
        other_j = 0.0
        for node_id, info in self.info.items():
            host = self._host(info)
            reading = info.get("reading") or {}
            if host == self.head_host:
                counted = "head"
            elif host is None or not reading:
                counted = "not measured"
            elif host in counted_hosts:
                counted = counted_hosts[host]
            else:
                counted = counted_hosts[host] = node_id
                other_j += reading["cpu_j"] + reading["gpu_j"]
            nodes[node_id] = {
                "ip": info["ip"],
                "host": "head" if host == self.head_host else host,
                "host_counted_in": counted,
                "actors": actors_by_node.get(node_id, 0),
                "lost": info.get("lost_at") is not None,
                **reading,
            }
        return {"nodes": nodes, "other_hosts_j": other_j}
