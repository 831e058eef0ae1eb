"""``auto`` sizing of ``autotune train``: the workload probed in a child process
(``runtime.probes``), the machine read (cores in the affinity mask, GPUs, their idle draw and
power limit, the CPU's idle watts), and ``autotune.tuning.sizing.size_run`` picking the values
the user left ``auto``.

The result's ``sizing`` section holds the values chosen, what the model predicts for them, the
rules, and every measurement they came from; ``train`` prints them at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from autotune.tuning.knobs import to_config_value, usable_cores
from autotune.tuning.node_model import NodeModel
from autotune.tuning.perf_model import MachineModel, charged_share
from autotune.tuning.sizing import SIZED, Sizing, size_run
from runtime import probe_cache
from runtime.config import TrainConfig
from runtime.energy.cpu import DEFAULT_WATTS_PER_BUSY_CORE
from runtime.energy.cpu_idle import estimate_idle_w
from runtime.hw.gpus import list_gpus, nvml_index
from runtime.probes import Probes

AUTO_FIELDS = (*SIZED, "trainer_threads")


def cluster_model_nodes(cfg: TrainConfig) -> tuple[NodeModel, ...]:
    """With ``cfg.cluster``, the nodes its actors go to, for the model: what each offers, on
    this host or not, and its round trip (``runtime.cluster.cluster_nodes``); else none."""
    if cfg.cluster is None:
        return ()
    from runtime.cluster import cluster_nodes

    return tuple(NodeModel.from_doc(n) for n in cluster_nodes(cfg.cluster))


def machine_model(cfg: TrainConfig, probes: Probes, cores: int) -> tuple[MachineModel, dict]:
    """The model's fixed facts, and the hardware readings they came from; ``cores``: this
    machine's (a cluster's nodes come from ``cluster_model_nodes``)."""
    nodes = cluster_model_nodes(cfg)
    index = nvml_index()  # the GPU the probes ran on (a daemon's budget may name one)
    gpus = [g for g in list_gpus() if g.index == index] if probes.sms else []
    gpu_idle = sum(g.power_w or 0.0 for g in gpus[:1])
    power = probes.gpu_power
    if power:  # measured over a second each by the probes, before and with a context
        gpu_idle = power["idle_w"]
    limit = sum(g.power_limit_w or 0.0 for g in gpus[:1])
    idle = estimate_idle_w(cfg.cpu_idle_w)
    f0, f1 = probes.forward_fit()
    g0, g1 = probes.loaded_round_fit()
    learner = {d: c.fit() for d, c in probes.learners.items()}
    m = MachineModel(
        cores=cores,
        rollout_len=cfg.rollout_len,
        t_env=probes.env_step_s,
        f0=f0,
        f1=f1,
        learner=learner,
        gpu_idle_w=gpu_idle,
        gpu_limit_w=limit,
        cpu_idle_w=idle.idle_w,
        w_core=DEFAULT_WATTS_PER_BUSY_CORE,
        gpu_ctx_w=max(power["context_w"] - power["idle_w"], 1.0) if power else 0.0,
        gpu_busy_w=max(power["busy_w"] - power["context_w"], 1.0) if power else 0.0,
        load=probes.load_factor(),
        g0=g0,
        g1=g1,
        nodes=nodes,
        inflight_batches=cfg.max_inflight_batches,
    )
    hardware = {
        "cores": cores,
        "cluster_nodes": [dataclasses.asdict(n) for n in nodes] if nodes else None,
        "gpus": [
            {"name": g.name, "idle_w": g.power_w, "power_limit_w": g.power_limit_w}
            for g in gpus[:1]
        ],
        "sms": probes.sms,
        "cpu_load_factor": round(probes.load_factor(), 3),
        "gpu_power": power,
        "mig": [g.mig_mode for g in gpus[:1]],
        "cpu_idle_w": idle.idle_w,
        "cpu_idle_source": idle.source,
    }
    return m, hardware


def probed_model(cfg: TrainConfig) -> MachineModel:
    """The machine model of ``cfg``'s workload, probed now (raises ``ProbeError``)."""
    devices = ["cpu", "cuda"] if cfg.resolved_device() == "cuda" else ["cpu"]
    probes = probe_cache.probes(
        cfg.env,
        cfg.policy,
        cfg.rollout_len,
        cfg.learner.to_dict(),
        devices,
        backend=cfg.resolved_backend(),
    )
    return machine_model(cfg, probes, usable_cores())[0]


def size_config(
    cfg: TrainConfig,
    auto: set[str],
    objective: str = "steps_per_joule",
    allowed: dict[str, tuple[Any, ...]] | None = None,
    reprobe: bool = False,
    shares: dict[str, float] | None = None,
    on_gpu_learner: Callable[[], None] | None = None,
) -> tuple[TrainConfig, dict[str, Any]]:
    """``cfg`` with the fields in ``auto`` sized (within ``allowed``, where it names a field);
    and the result's ``sizing`` section. The probes come from the probe cache unless
    ``reprobe`` (``runtime.probe_cache``; ``on_gpu_learner``: called where they are measured,
    as the GPU learner's timing begins). Under a daemon's budget, ``shares`` (``gpu_share``,
    ``cpu_share``) are the machine's idle draw the job is charged; the model sizes with them,
    and the section keeps the whole machine's model (the daemon charges each budget itself).

    Raises:
        runtime.probes.ProbeError: the workload could not be probed.
        ValueError: no config satisfies the sizing rules around the fixed values.
    """
    cores = usable_cores()
    if "trainer_device" in auto or cfg.trainer_device == "auto":
        devices = list((allowed or {}).get("trainer_device", ("cpu", "cuda")))
    else:
        devices = [cfg.trainer_device]
    backend = cfg.resolved_backend()
    probes = probe_cache.probes(
        cfg.env,
        cfg.policy,
        cfg.rollout_len,
        cfg.learner.to_dict(),
        devices,
        reprobe,
        backend=backend,
        on_gpu_learner=on_gpu_learner,
        also=("gymnasium",) if cfg.env_backend == "auto" and backend == "envpool" else (),
    )
    fixed = {f: _knob(cfg, f) for f in AUTO_FIELDS if f not in auto}
    if fixed.get("trainer_device") == "auto":
        fixed.pop("trainer_device")
    given_gpu = ("mps_pct" not in auto and cfg.mps_pct is not None) or cfg.gpus is not None
    if "trainer_device" in auto and (given_gpu or cfg.inference_mps_pct is not None):
        fixed["trainer_device"] = "cuda"  # a GPU setting given: the trainer is on a GPU
    moved = {}  # a held value outside the space a tuned run's --knob pins: its nearest there
    for name, values in (allowed or {}).items():
        held = fixed.get(name)
        if isinstance(held, int) and values and held not in values:
            fixed[name] = moved[name] = min(values, key=lambda v: (abs(v - held), v))

    def sized_on(on: Probes) -> tuple[Probes, MachineModel, dict, Sizing]:
        model, hardware = machine_model(cfg, on, cores)
        charged = (
            model if not shares else charged_share(model, shares["gpu_share"], shares["cpu_share"])
        )
        sizing = size_run(
            charged,
            len(on.sms),
            fixed,
            cfg.learner.minibatches,
            objective=objective,
            steps=cfg.steps,
            allowed=allowed,
            min_minibatch=cfg.learner.min_minibatch,
        )
        return on, model, hardware, sizing

    by_backend = {backend: sized_on(probes)}
    for other in probes.other_backends:
        with contextlib.suppress(ValueError):  # no config fits there: the resolved one stands
            by_backend[other] = sized_on(probes.on_backend(other))
    predicted = {b: r[3].predicted for b, r in by_backend.items()}
    chosen = pick_backend(backend, predicted, objective)
    probes, model, hardware, sizing = by_backend[chosen]
    changes = {f: to_config_value(f, v) for f, v in sizing.values.items() if f in auto}
    changes |= {f: to_config_value(f, v) for f, v in moved.items()}
    if changes.get("trainer_device") == "cpu":
        changes["mps_pct"] = None
    sized = dataclasses.replace(cfg, **changes, env_backend=chosen)
    doc = {
        "auto": sorted(auto),
        "chosen": {  # a CPU trainer has no MPS share: none is said to be chosen
            f: sizing.values[f]
            for f in sorted(auto)
            if f in sizing.values and not (f == "mps_pct" and changes.get("mps_pct", 0) is None)
        },
        **sizing.to_dict(),
        "probes": probes.to_dict(),
        "machine": hardware,
        "model": dataclasses.asdict(model),
        "energy_shares": shares,
        "env_backend": {
            "chosen": chosen,
            "predicted": predicted,
        },
    }
    return sized, doc


BACKEND_MARGIN = 1.10
"""Where ``auto`` could run either backend, the other is chosen over the one
``runtime.env_backends`` resolved (EnvPool) only when the sizing predicts it this much better:
the same loaded rounds, taken twice within minutes on an H200 host, differed by 4-10 %."""


def pick_backend(resolved: str, predicted: dict[str, dict[str, float]], objective: str) -> str:
    """The env backend a sized run steps on: ``resolved``, or another of ``predicted`` (the
    sizing's prediction on each) predicted over ``BACKEND_MARGIN`` times better at
    ``objective`` (steps/s, else steps/J)."""
    key = "steps_per_s" if objective == "steps_per_s" else "steps_per_joule"
    best = max(predicted, key=lambda b: predicted[b][key])
    return best if predicted[best][key] > BACKEND_MARGIN * predicted[resolved][key] else resolved


def _knob(cfg: TrainConfig, name: str) -> Any:
    value = getattr(cfg, name)
    if name == "mps_pct":
        return 100 if value is None else value[0]
    return value
