"""What the workload probes measured (``runtime.probes``), as the probe cache keeps them and
sizing reads them (``autotune.workflows.auto_size``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from runtime.env_probes import ProbeError
from runtime.learner_probe import GROUP_LEARNER


@dataclass(frozen=True)
class LearnerCost:
    """Seconds per learner update (every epoch and minibatch) at each probed batch size."""

    device: str
    seconds: dict[int, float]

    def fit(self) -> tuple[float, float]:
        """(fixed seconds per update, seconds per sample)."""
        return line(self.seconds, min_slope=1e-12)


SHARED_GPU_PCT = 5.0
"""A GPU busier than this (NVML utilisation) while the probes read it idle was in use by
another process."""


@dataclass(frozen=True)
class Probes:
    """What the probes measured (see the module docstring)."""

    env: str
    policy: str
    env_step_s: float
    """CPU seconds per env step (random actions), one thread, the machine otherwise idle; on
    EnvPool per env step of a pool of ``runtime.env_probes.POOL_ENVS`` on its worker thread."""
    forward_s: dict[int, float]
    """Seconds per policy forward on one core, by env count."""
    learners: dict[str, LearnerCost] = field(default_factory=dict)
    sms: list[int] = field(default_factory=list)
    """SMs per CUDA GPU (empty without one)."""
    probe_s: float = 0.0
    """Wall seconds the probes took, child start-up included."""
    measured_at: float = 0.0
    """Unix time the probes ran."""
    cached: bool = False
    """Read back from the probe cache (``runtime.probe_cache``), not measured now."""
    gpu_power: dict[str, float] = field(default_factory=dict)
    """The probed GPU's watts (NVML; ``runtime.hw.gpus.nvml_index``) with no context
    (``idle_w``), with the learner's context open and nothing running (``context_w``), and
    with the learner updating back to back (``busy_w``); empty without a GPU NVML reads."""
    round_loaded_s: dict[int, float] = field(default_factory=dict)
    """CPU seconds per actor round (``k`` envs stepped, one forward of the policy) by ``k``, with
    one such actor on every usable core at once (shared caches, memory bandwidth, the clock
    under load): what an actor pays in a full run. Empty where it was not measured."""
    stage_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds each probe took (``env``: the env made, its backend imported and one step
    timed; ``env_loaded``, ``torch``, ``forward``,
    ``learner_<device>``, ``gpu_power``): where a first run's start-up goes. Parts of one,
    not added to the sum: ``learner_cuda.build`` (the learner made, its CUDA context opened)
    and ``learner_cuda.first`` (each size's first update: a compile, a graph's capture)."""
    backend: str = ""
    """The env backend ``env_step_s`` and ``round_loaded_s`` are of (empty: read from a cache
    entry written before it was kept)."""
    other_backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The same env figures on the other backends timed (``env_step_s``, ``round_loaded_s``),
    by backend: where ``auto`` could run either, sizing sizes the run on each
    (``on_backend``) and keeps the one it predicts better."""
    gpu_busy_pct: float | None = None
    """The probed GPU's utilisation (NVML: % of a sample period in which a kernel ran), the
    most of the readings over its idle reading, before this probe opened a context; None
    without one. Over ``SHARED_GPU_PCT`` another process used the GPU meanwhile
    (``gpu_shared``)."""

    def gpu_shared(self) -> bool:
        """Whether another process used the GPU while these probes read it idle: its idle
        watts, and the GPU learner's time, are not the GPU's own (``runtime.probe_cache`` does
        not keep them)."""
        return self.gpu_busy_pct is not None and self.gpu_busy_pct > SHARED_GPU_PCT

    def on_backend(self, backend: str) -> Probes:
        """These probes with ``backend``'s env figures (this one's own, or one of
        ``other_backends``)."""
        if backend == self.backend:
            return self
        alt = self.other_backends[backend]
        return replace(
            self,
            env_step_s=float(alt["env_step_s"]),
            round_loaded_s=dict(alt["round_loaded_s"]),
            backend=backend,
            other_backends={},
        )

    def narrowed(self, devices: list[str], also: tuple[str, ...]) -> Probes:
        """These probes with only the learners of ``devices`` (a CUDA trainer group's line
        with ``cuda``) and the other backends ``also`` names: what a workload that asked for
        those alone would have measured, so that its sizing weighs nothing it did not ask."""
        keep = set(devices) | ({GROUP_LEARNER} if "cuda" in devices else set())
        return replace(
            self,
            learners={d: c for d, c in self.learners.items() if d in keep},
            other_backends={b: o for b, o in self.other_backends.items() if b in also},
        )

    def load_factor(self) -> float:
        """How much slower an actor's per-env work (an env step and its share of the forward)
        runs with every core busy than alone (at least 1)."""
        per_env = self.loaded_round_fit()[1]
        if per_env <= 0.0:
            return 1.0
        return max(per_env / (self.env_step_s + self.forward_fit()[1]), 1.0)

    def forward_fit(self) -> tuple[float, float]:
        """(fixed seconds per forward, seconds per env)."""
        return line(self.forward_s)

    def loaded_round_fit(self) -> tuple[float, float]:
        """(fixed seconds per actor round, seconds per env) with every core busy; (0, 0) where
        not measured."""
        return line(self.round_loaded_s) if self.round_loaded_s else (0.0, 0.0)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["learners"] = {
            d: {"seconds": {str(b): s for b, s in c.seconds.items()}}
            for d, c in self.learners.items()
        }
        doc["forward_s"] = {str(k): v for k, v in self.forward_s.items()}
        doc["round_loaded_s"] = {str(k): v for k, v in self.round_loaded_s.items()}
        doc["other_backends"] = {
            b: {**o, "round_loaded_s": {str(k): v for k, v in o["round_loaded_s"].items()}}
            for b, o in self.other_backends.items()
        }
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Probes:
        """Raises ``ProbeError`` for a malformed document: a field missing or of the wrong
        type, or a cost that is not a finite number above 0 (``_check``)."""
        found = cls._parse(doc)
        found._check()
        return found

    def _check(self) -> None:
        """Raises ``ProbeError`` unless every cost the sizing fits lines to is a finite number
        above 0 at sizes above 0, with at least one forward and one size per learner."""
        fits = {"forward_s": self.forward_s, "round_loaded_s": self.round_loaded_s}
        fits.update({f"learner {d}": c.seconds for d, c in self.learners.items()})
        fits.update(
            {f"{b} round_loaded_s": o["round_loaded_s"] for b, o in self.other_backends.items()}
        )
        steps = {"env_step_s": self.env_step_s}
        steps.update({f"{b} env_step_s": o["env_step_s"] for b, o in self.other_backends.items()})
        bad = [k for k, v in steps.items() if not (math.isfinite(v) and v > 0)]
        bad += [
            k
            for k, points in fits.items()
            if any(not (s > 0 and math.isfinite(v) and v > 0) for s, v in points.items())
        ]
        bad += [k for k in ("forward_s", *(f"learner {d}" for d in self.learners)) if not fits[k]]
        if bad:
            raise ProbeError(f"malformed probe results: {', '.join(bad)} not above 0 (or empty)")

    @classmethod
    def _parse(cls, doc: dict[str, Any]) -> Probes:
        try:
            learners = {
                d: LearnerCost(d, {int(b): float(s) for b, s in c["seconds"].items()})
                for d, c in doc.get("learners", {}).items()
            }
            return cls(
                str(doc["env"]),
                str(doc["policy"]),
                float(doc["env_step_s"]),
                {int(k): float(v) for k, v in doc["forward_s"].items()},
                learners,
                [int(s) for s in doc.get("sms", [])],
                float(doc.get("probe_s", 0.0)),
                float(doc.get("measured_at", 0.0)),
                bool(doc.get("cached", False)),
                {str(k): float(v) for k, v in doc.get("gpu_power", {}).items()},
                {int(k): float(v) for k, v in doc.get("round_loaded_s", {}).items()},
                {str(k): float(v) for k, v in doc.get("stage_s", {}).items()},
                str(doc.get("backend", "")),
                {
                    str(b): {
                        "env_step_s": float(o["env_step_s"]),
                        "round_loaded_s": {
                            int(k): float(v) for k, v in o["round_loaded_s"].items()
                        },
                    }
                    for b, o in doc.get("other_backends", {}).items()
                },
                None if doc.get("gpu_busy_pct") is None else float(doc["gpu_busy_pct"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProbeError(f"malformed probe results: {exc}") from None


def line(points: dict[int, float], min_slope: float = 0.0) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through ``size -> seconds``, both >= 0;
    through the origin for a single point."""
    xs = np.array(sorted(points), float)
    ys = np.array([points[int(x)] for x in xs])
    if len(xs) < 2:
        return 0.0, max(float(ys[0] / xs[0]), min_slope)
    slope, icpt = np.polyfit(xs, ys, 1)
    return max(float(icpt), 0.0), max(float(slope), min_slope)
