"""Actors on a Ray cluster's nodes in the throughput model (``autotune.tuning.perf_model``).

With ``autotune train --cluster`` every actor is a Ray actor, placed on the node with the most
CPUs the run's actors leave free (``runtime.cluster.launcher``); actors beyond the nodes' CPUs
wait until a node joins. For ``A`` actors the model places ``a_i`` on node ``i`` the same way,
taken as continuous: it fills the nodes' CPUs from the top, so that every node used keeps the
same number free. Each node's actors then sample at that node's own rate:

* **cores**: a node on this host (the head) shares the run's cores with the trainers and the
  stages (the head's ``squeeze``, as without a cluster); a node on another host gives its CPUs
  to its actors alone, and its actor round moves toward the loaded round as they fill up;
* **speed**: a node's env steps relative to the probe's, which ran here (1 until windows say
  otherwise: ``fit_node_speeds``, from each window's per-node sampled steps);
* **latency**: a node's round trip to the head, ``rtt_i`` (``runtime.cluster.cluster_nodes``
  measures it when the run is sized), delays the receipts its actors wait on. An actor with
  ``n`` rollouts in flight, each ``L * round`` seconds of stepping, keeps
  ``1 / (1 + rtt_i / (n * L * round))`` of its rate, and the steps it has on the wire,
  ``rate_i * rtt_i``, add to the policy lag.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SPEED_PRIOR_N = 1.0
"""Windows' worth of weight the prior speed of 1 keeps in ``fit_node_speeds``."""


@dataclass(frozen=True)
class NodeModel:
    """One Ray node that can hold the run's actors."""

    name: str
    """Its short id (``runtime.cluster.launcher.RemoteLauncher.nodes_now``' ``node``)."""
    cpus: float
    """CPUs Ray offers there (one per actor)."""
    here: bool
    """On this host (the head): its CPUs are the run's own cores."""
    rtt_s: float = 0.0
    """Its round trip to the head beyond the head's own (0 on this host)."""

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> NodeModel:
        return cls(str(doc["name"]), float(doc["cpus"]), bool(doc["here"]), float(doc["rtt_s"]))


@dataclass
class NodeRates:
    """The model's actor side on the nodes, per config (rows) and node (columns)."""

    placed: np.ndarray
    """Actors on each node."""
    sample: np.ndarray
    """Steps/s each node's actors sample, alone (before the pipeline backs them up)."""
    head_actors: np.ndarray
    """Actors on this host, per config."""
    wire_steps: np.ndarray
    """Steps on the wire from other hosts at the sampling rate (the lag's latency term)."""

    @property
    def total(self) -> np.ndarray:
        return self.sample.sum(axis=1)

    @property
    def running(self) -> np.ndarray:
        """Actors placed (those beyond the nodes' CPUs wait), per config."""
        return self.placed.sum(axis=1)


def place(actors: np.ndarray, cpus: np.ndarray) -> np.ndarray:
    """Actors per node (configs x nodes): the launcher's rule taken as continuous, i.e. the
    nodes filled from the top down to a common level of free CPUs; at most every CPU."""
    cpus = np.asarray(cpus, float)
    want = np.minimum(np.asarray(actors, float), cpus.sum())
    lo, hi = np.zeros_like(want), np.full_like(want, cpus.max(initial=0.0))
    for _ in range(50):  # the free level: sum(max(0, cpus - level)) == want
        mid = (lo + hi) / 2
        over = np.maximum(0.0, cpus[None, :] - mid[:, None]).sum(axis=1) > want
        lo, hi = np.where(over, mid, lo), np.where(over, hi, mid)
    return np.maximum(0.0, cpus[None, :] - hi[:, None])


def node_rates(
    nodes: Sequence[NodeModel],
    speeds: dict[str, float],
    actors: np.ndarray,
    envs: np.ndarray,
    round_s: Callable[[np.ndarray], np.ndarray],
    head_squeeze: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    rollouts: np.ndarray,
    rollout_len: int,
) -> NodeRates:
    """Each node's actors' sampling rate (see the module docstring). ``round_s(busy_share)``
    is an actor's round at a node's busy share; ``head_squeeze(head_actors)`` gives the head's
    (squeeze, busy share) with that many actors beside the trainers and the stages;
    ``rollouts`` the rollouts an actor may have in flight."""
    cpus = np.array([n.cpus for n in nodes], float)
    placed = place(actors, cpus)
    here = np.array([n.here for n in nodes], bool)
    head_actors = placed[:, here].sum(axis=1)
    squeeze, busy_head = head_squeeze(head_actors)
    sample = np.zeros_like(placed)
    wire = np.zeros(len(actors))
    for i, node in enumerate(nodes):
        if node.here:
            busy, share = busy_head, squeeze
        else:
            busy, share = placed[:, i] / max(node.cpus, 1e-9), 1.0
        rnd = round_s(busy) / speeds.get(node.name, 1.0)
        latency = 1.0 / (1.0 + node.rtt_s / (rollouts * rollout_len * rnd))
        sample[:, i] = placed[:, i] * envs / rnd * share * latency
        wire += sample[:, i] * node.rtt_s
    return NodeRates(placed, sample, head_actors, wire)


def fit_node_speeds(
    nodes: Sequence[NodeModel],
    predicted: np.ndarray,
    measured: list[dict[str, float] | None],
    prior: dict[str, float],
) -> dict[str, float]:
    """Each node's speed, from windows' per-node sampled steps/s (``measured``, one dict per
    window, by node name) against the model's per-node rates for those windows
    (``predicted``, windows x nodes, at the ``prior`` speeds): a node's share of the sampling
    measured over its share predicted, as a geometric mean over windows, kept toward the
    prior by ``SPEED_PRIOR_N``. Nodes no window saw keep their prior."""
    names = [n.name for n in nodes]
    logs: dict[str, list[float]] = {}
    for row, seen in zip(predicted, measured, strict=True):
        if not seen:
            continue
        common = [j for j, n in enumerate(names) if n in seen and row[j] > 0]
        total_p = sum(row[j] for j in common)
        total_m = sum(seen[names[j]] for j in common)
        if len(common) < 2 or total_p <= 0 or total_m <= 0:
            continue  # one node alone says nothing about the nodes' relative speeds
        for j in common:
            if seen[names[j]] > 0:
                share = (seen[names[j]] / total_m) / (row[j] / total_p)
                logs.setdefault(names[j], []).append(math.log(share))
    out = dict(prior)
    for name, values in logs.items():
        shift = sum(values) / (len(values) + SPEED_PRIOR_N)
        out[name] = prior.get(name, 1.0) * math.exp(shift)
    return out
