"""What a tuner measures a running job by: cumulative counters read now and then, and the
``Measurement`` of a window as the difference of two readings.

A job in this process (``autotune.tuning.runner_job.RunnerJob``) reads them at the window's
edges; a job registered with the daemon (``autotune.control.daemon``) sends a reading with every
report, and the daemon measures between the reports at the window's edges. Either way, steps,
joules and time of one reading come from the same instant, so a window's figures are consistent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from policies.noise_scale import efficiency


@dataclass(frozen=True)
class Measurement:
    """One window: trained steps/s, steps per joule (GPU + CPU), joules, mean policy lag."""

    steps_per_s: float
    steps_per_joule: float | None
    gpu_j: float
    cpu_j: float
    policy_lag: float
    window_s: float
    noise_scale: float | None = None
    """The learner's gradient noise scale in samples at the window's end (``policies.
    noise_scale``; None where the job does not report one)."""
    efficiency: float | None = None
    """The statistical efficiency of the window's batch (a learner update) at that noise scale."""
    node_rates: dict[str, float] | None = None
    """On a Ray cluster: steps/s sampled by the actors on each node, by node (short id)."""


@dataclass(frozen=True)
class Counters:
    """Totals since the job started.

    Attributes:
        t_s: The job's monotonic clock, seconds.
        trained_steps: Env steps trained.
        lag_steps: Sum over trained steps of their policy lag (versions), so a window's mean
            lag is its difference over its steps.
        gpu_j: GPU joules (NVML; 0 without a GPU).
        cpu_j: CPU joules (``cpu_source`` says measured or modelled).
        cpu_source: ``rapl`` or ``model``.
    """

    t_s: float
    trained_steps: int
    lag_steps: float
    gpu_j: float
    cpu_j: float
    cpu_source: str = "model"
    return_mean: float | None = None
    """Mean return of the job's recent episodes (None before the first, or when the job does
    not say), so the tuner can record what each change did to learning."""
    noise_scale: float | None = None
    """The learner's gradient noise scale, in samples (None: not reported)."""
    step_samples: float | None = None
    """Samples in each learner update (the batch) of the job's current config, the step its
    statistical efficiency is of (``policies.noise_scale``; None: not reported)."""
    remaining_s: float | None = None
    """Seconds the job has left: its wall limit, or its step target at the rate so far,
    whichever comes first (None when neither bounds it, or the job does not say); near the
    end, a trial cannot pay back (``autotune.tuning.tuner_rules.endgame``)."""
    node_steps: dict[str, int] | None = None
    """On a Ray cluster: steps sampled so far by the actors placed on each node, by node
    (``runtime.cluster.launcher.RemoteLauncher.nodes_now``); None without one."""

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, doc: dict[str, Any]) -> Counters:
        """Raises ``ValueError`` for a malformed reading."""
        try:
            out = cls(
                float(doc["t_s"]),
                int(doc["trained_steps"]),
                float(doc["lag_steps"]),
                float(doc["gpu_j"]),
                float(doc["cpu_j"]),
                str(doc["cpu_source"]),
                None if doc.get("return_mean") is None else float(doc["return_mean"]),
                *(_opt(doc, k) for k in ("noise_scale", "step_samples", "remaining_s")),
                _node_steps(doc.get("node_steps")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed counters {doc!r}: {exc}") from None
        figures = (out.t_s, out.lag_steps, out.gpu_j, out.cpu_j, out.return_mean or 0.0)
        if not all(math.isfinite(x) for x in figures) or out.trained_steps < 0:
            raise ValueError(f"malformed counters {doc!r}: a figure is not finite, or negative")
        return out


def _node_steps(value: Any) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        raise ValueError(f"node_steps {value!r}: allowed a map of node ids to step counts")
    return dict(value)


def _opt(doc: dict[str, Any], key: str) -> float | None:
    return None if doc.get(key) is None else float(doc[key])


def measure(a: Counters, b: Counters) -> Measurement:
    """The window from reading ``a`` to reading ``b``."""
    span = b.t_s - a.t_s
    trained = b.trained_steps - a.trained_steps
    gpu_j, cpu_j = b.gpu_j - a.gpu_j, b.cpu_j - a.cpu_j
    total_j = gpu_j + cpu_j
    return Measurement(
        steps_per_s=trained / span if span > 0 else 0.0,
        steps_per_joule=trained / total_j if total_j > 0 else None,
        gpu_j=gpu_j,
        cpu_j=cpu_j,
        policy_lag=(b.lag_steps - a.lag_steps) / trained if trained else 0.0,
        window_s=span,
        noise_scale=b.noise_scale,
        efficiency=efficiency(b.noise_scale, b.step_samples or 0.0),
        node_rates=_node_rates(a.node_steps, b.node_steps, span),
    )


def _node_rates(a: dict[str, int] | None, b: dict[str, int] | None, span: float):
    """Steps/s per node between two readings (the nodes in both; None without)."""
    if not a or not b or span <= 0:
        return None
    return {node: (b[node] - a[node]) / span for node in b if node in a}
