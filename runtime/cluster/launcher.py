"""Actor incarnations started on a Ray cluster's nodes, each as a ``RemoteActor`` that needs one
CPU, and seen by ``runtime.actor_pool.ActorPool`` through the same face as a local process.

Placement is by node: each new incarnation goes to the live node with the most CPUs the run's
actors leave free there (ties: Ray's node order), pinned to it. Where no node has a CPU free,
it is left to Ray, which starts it when a node with one joins. A node that disappears takes
its actors with it: their incarnations end as died, and the pool restarts their slots on the
nodes left.

Step counts: a remote actor's steps are read from its telemetry (``stepped``, every half
second) and from the compressor's count of its whole rollouts, whichever is higher, and its
exact count comes back with its clean exit. An incarnation that died counts as sampled what
either had seen; what it stepped after its last report and never sent is unknown to the run.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from runtime.actor_pool import ActorSlot
from runtime.cluster.node_energy import NodeEnergy
from runtime.cluster.ray_cluster import RayCluster
from runtime.cluster.remote_actor import RemoteActor

logger = logging.getLogger(__name__)

NODES_EVERY_S = 2.0
"""``nodes_now`` asks Ray for the live nodes at most this often (reports come every 0.5 s)."""
DIED = -9
"""The exit code of a remote incarnation that was killed or whose node went away."""


class RayProcess:
    """A ``RemoteActor`` incarnation behind a process's face: ``is_alive``, ``exitcode``,
    ``kill``, ``join``."""

    def __init__(self, handle: Any, run_ref: Any) -> None:
        self.handle, self.run_ref = handle, run_ref
        self.node_ref = handle.node.remote()
        self.node_id: str | None = None
        self.planned: str | None = None
        """The node it was pinned to (None: left to Ray)."""
        self.stepped: RemoteStepped | None = None
        self.final_steps: int | None = None
        self._code: int | None = None

    def started(self) -> bool:
        """Whether Ray has placed it and it answers (its node is then known)."""
        if self.node_id is None and ray.wait([self.node_ref], timeout=0)[0]:
            try:
                self.node_id = ray.get(self.node_ref)
            except ray.exceptions.RayError:
                return False
        return self.node_id is not None

    def is_alive(self) -> bool:
        return self._code is None and not ray.wait([self.run_ref], timeout=0)[0]

    @property
    def exitcode(self) -> int | None:
        if self._code is None and ray.wait([self.run_ref], timeout=0)[0]:
            try:
                code, steps = ray.get(self.run_ref)
                self._code, self.final_steps = int(code), int(steps)
            except ray.exceptions.RayError as exc:
                self._code = DIED
                logger.warning("remote actor ended: %s", str(exc).splitlines()[0])
        return self._code

    def kill(self) -> None:
        ray.kill(self.handle, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        ray.wait([self.run_ref], timeout=timeout)
        _ = self.exitcode


class RemoteStop:
    """The incarnation's stop: through Ray once it runs; one never placed is killed (it has
    stepped nothing)."""

    def __init__(self, proc: RayProcess) -> None:
        self.proc = proc
        self._set = False

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        if self.proc.started():
            self.proc.handle.stop.remote()
        else:
            self.proc.kill()

    def is_set(self) -> bool:
        return self._set


class RemoteStepped:
    """The incarnation's steps as the run knows them (see the module docstring)."""

    def __init__(self, telemetry: Any, proc: RayProcess, index: int, incarnation: int) -> None:
        self.telemetry, self.proc = telemetry, proc
        self.source, self.key = f"actor-{index}.{incarnation}", f"{index}:{incarnation}"

    @property
    def value(self) -> int:
        if self.proc.final_steps is not None:
            return self.proc.final_steps
        reported = int(self.telemetry.source(self.source).get("stepped", 0))
        whole = self.telemetry.source("compressor").get("complete_steps", {})
        return max(reported, int(whole.get(self.key, 0)) if isinstance(whole, dict) else 0)


class RemoteLauncher:
    """Starts actor incarnations on ``cluster``'s nodes (see the module docstring), and keeps
    the nodes' energy meters (``runtime.cluster.node_energy``)."""

    def __init__(self, cluster: RayCluster, telemetry: Any, cpu_idle_w: float | None) -> None:
        self.cluster, self.telemetry = cluster, telemetry
        self.procs: list[RayProcess] = []
        """Incarnations that may still run (placement counts them)."""
        self.placed: list[RayProcess] = []
        """Every incarnation started (the result's per-node ``actors``: those that ran there)."""
        self.energy = NodeEnergy(cpu_idle_w)
        self.energy.watch(cluster.nodes())
        self._alive: dict[str, Any] = {}
        self._alive_at = -math.inf

    def _node(self) -> str | None:
        self.procs = [p for p in self.procs if p.is_alive()]
        used = collections.Counter(p.node_id or p.planned for p in self.procs)
        nodes = self.cluster.nodes()
        free = [(n.cpus - used[n.node_id], -i, n.node_id) for i, n in enumerate(nodes)]
        free = [f for f in free if f[0] >= 1]
        return max(free)[2] if free else None

    def start(self, cfg: Any, info: Any, ep: Any, index: int, incarnation: int, initial: Any):
        """Starts incarnation ``incarnation`` of slot ``index``; returns its ``ActorSlot``."""
        node = self._node()
        opts: dict[str, Any] = {}
        if node is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        else:
            logger.warning(
                "actor %d.%d: no node has a CPU free; Ray starts it when one does",
                index,
                incarnation,
            )
        handle = RemoteActor.options(**opts).remote()
        ref = handle.run.remote(cfg, info, ep.for_clients(), index, incarnation, initial)
        proc = RayProcess(handle, ref)
        proc.planned = node
        self.procs.append(proc)
        self.placed.append(proc)
        stepped = proc.stepped = RemoteStepped(self.telemetry, proc, index, incarnation)
        return ActorSlot(index, incarnation, proc, stepped, RemoteStop(proc), cfg)

    def stepped_by_node(self) -> collections.Counter:
        """Steps sampled so far by the incarnations placed on each node, by node id."""
        out: collections.Counter = collections.Counter()
        for p in self.placed:
            if p.node_id is not None and p.stepped is not None:
                out[p.node_id] += p.stepped.value
        return out

    def nodes_now(self) -> list[dict[str, Any]]:
        """Every node seen: its id (short), address, CPUs, the run's actors running there now,
        the steps its actors sampled, and whether it was lost (``autotune status`` shows them;
        the tuner's windows take each node's sampling rate from them)."""
        now = time.monotonic()
        if now - self._alive_at > NODES_EVERY_S:  # membership: asked of Ray now and then
            self._alive, self._alive_at = {n.node_id: n for n in self.cluster.nodes()}, now
        alive = self._alive
        running = collections.Counter(p.node_id for p in self.procs if p.started() and p.is_alive())
        stepped = self.stepped_by_node()
        out = []
        for node_id, info in self.energy.info.items():
            node = alive.get(node_id)
            out.append(
                {
                    "node": node_id[:12],
                    "ip": info["ip"],
                    "cpus": node.cpus if node else 0,
                    "actors": running.get(node_id, 0),
                    "stepped": stepped.get(node_id, 0),
                    "lost": node is None,
                }
            )
        return out

    def tick(self) -> None:
        """Called every pool check: where new incarnations were placed, and the node meters'
        readings."""
        for p in self.procs:
            p.started()
        self.energy.tick(self.cluster.nodes)

    def close(self) -> dict[str, Any]:
        """Ends the connection (and a local cluster); returns the per-node energy document
        (``NodeEnergy.doc``) after a last reading."""
        try:
            self.energy.final(self.cluster.nodes)
            ran = collections.Counter(p.node_id for p in self.placed if p.started())
            doc = self.energy.doc(dict(ran))
            stepped = self.stepped_by_node()
            for node_id, node in doc["nodes"].items():
                node["stepped"] = stepped.get(node_id, 0)
            return doc
        finally:
            self.cluster.close()
