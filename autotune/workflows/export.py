"""``autotune export``: a study's recommended runtime config and hardware sizing, with evidence.

From the completed trials of an ``autotune study`` (train trials), grouped by config:

* **recommended**: the config, as its trials ran it (their ``values``: every knob's value,
  the fixed ones too, which a worker on a share of the cores may fix otherwise), with the best
  median objective (``autotune.tuning.study_best.pick_config``; evidence ``confirm`` says so
  where it rests on one trial) (steps/J, or steps/s with
  ``pick="steps_per_s"``; a multi-objective study picks on one of its two; a study to a target
  return, the fewest joules to it, ``TARGET_METRIC``), as the knob values,
  the runtime view (actors, envs per actor, GMIs per GPU, MPS % per GMI, batch sizes, trainer
  device) and a full ``TrainConfig`` that ``autotune train --config`` runs as is;
* **sizing**: the CPU threads per GPU SM the recommendation runs at (actor processes per SM
  granted by the GMIs' MPS shares; the seed paper's CPU/GPU ratio), actors per GPU, and, for a
  target machine (``target_gpus``, ``target_cores``), the actors and cores it would need and
  whether its cores can feed its GPUs at that ratio; for a recommendation that trains on the
  CPU, the GPU figures are null and it counts the cores it needs (``cpu_sizing``);
* **evidence**: trial counts, and the recommendation's measured steps/J and steps/s (median,
  range, trial numbers; raw and scaled by the study's reference runs, ``autotune.tuning.reference``)
  beside the default config's, with their ratio (scaled), and the reference runs' spread.

The figures are the study's own short-run measurements on the machine it ran on; ``autotune
train --config`` re-measures the recommendation at full length.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import yaml
from optuna.trial import TrialState

from autotune.tuning.offline_study import tuned_values
from autotune.tuning.reference import (
    GOODPUT_METRIC,
    REFERENCE_ROLES,
    TARGET_METRIC,
    reference_runs,
    score,
)
from autotune.tuning.runner_job import config_changes
from autotune.tuning.storage import config_key
from autotune.tuning.study_best import pick_config
from autotune.workflows.export_evidence import measured, steps_to_run
from runtime.config import TrainConfig

_NOTE = (
    "medians of the study's short runs (each measured from warmup_s after its first trained "
    "step to the start of its drain, once measured or at trial_s), picked and compared by the "
    "scaled figures (raw x first reference / "
    "latest reference; equal to the raw ones in a study without --reference-every); "
    "re-measure with autotune train --config"
)
_NOTE_TARGET = (
    "medians of the study's runs to the target return, whole runs from their start; picked "
    f"by {TARGET_METRIC} (1e6 / joules to the target; 0 for a run that did not reach it in "
    "trial_s); re-measure with autotune train --config --target-return"
)
_ONCE = (
    "the recommended config was measured in one trial: a lucky window can put it first; "
    "measure the leaders again with autotune study --confirm K, then export again"
)
FORMAT_VERSION = 1
SERVICE_PROCESSES = 2
"""CPU processes besides actors and trainers in every run: the compressor and the migrator."""


class ExportError(ValueError):
    """A study that cannot be exported; the message says why and what to do."""


def runtime_view(cfg: Any) -> dict[str, Any]:
    """What the runtime will run: the GMIs, their MPS shares, batching and placement (a CPU
    trainer has no GPU, GMIs or MPS shares: those are null)."""
    gmis = cfg.trainers  # per GPU
    cuda = cfg.trainer_device == "cuda"
    every = cfg.gmi_count() if cuda else gmis  # every GMI, GPU by GPU
    pct = list(cfg.mps_pct or ()) * (every if cfg.mps_pct and len(cfg.mps_pct) == 1 else 1)
    return {
        "actors": cfg.actors,
        "envs_per_actor": cfg.envs_per_actor,
        "envs": cfg.actors * cfg.envs_per_actor,
        "trainer_device": cfg.trainer_device,
        "trainers": gmis,
        "gpus": list(cfg.gpu_list()) if cuda else [],
        "gmis_per_gpu": gmis if cuda else None,
        "mps_pct_per_gmi": (pct if cfg.mps_pct else [100] * every) if cuda else None,
        "batch_size": cfg.batch_size,
        "rollout_len": cfg.rollout_len,
        "inference": cfg.inference,
        "trainer_threads": cfg.trainer_threads,
        "trainer_precision": cfg.trainer_precision,
        "actor_nice": cfg.actor_nice,
        "chunk_bytes": cfg.chunk_bytes,
    }


def sizing(
    runtime: dict[str, Any], sm_count: int | None, target_gpus: int | None, target_cores: int | None
) -> dict[str, Any]:
    """The CPU/GPU ratio of ``runtime`` and what a target machine would need at it
    (``cpu_sizing`` for a trainer on the CPU)."""
    if runtime["trainer_device"] != "cuda":
        return cpu_sizing(runtime, target_gpus, target_cores)
    gpus = max(1, len(runtime["gpus"]))
    actors_per_gpu = runtime["actors"] / gpus
    share = sum(runtime["mps_pct_per_gmi"]) / gpus / 100.0  # of one GPU, on average
    sms = sm_count * min(1.0, share) if sm_count else None
    per_gpu_procs = actors_per_gpu + runtime["gmis_per_gpu"] + SERVICE_PROCESSES / gpus
    out: dict[str, Any] = {
        "actors_per_gpu": actors_per_gpu,
        "sm_count": sm_count,
        "sms_granted_per_gpu": sms,
        "cpu_threads_per_sm": None if not sms else actors_per_gpu / sms,
        "cpu_processes_per_gpu": per_gpu_procs,
        "note": (
            "cpu_threads_per_sm = actor processes per GPU / SMs the GMIs' MPS shares "
            "grant (capped at the GPU's SMs); the trainer GMIs and the 2 service processes "
            "share the actors' cores (about 0.3 and 0.25 of a core), as auto sizing counts them"
        ),
    }
    if target_gpus is not None or target_cores is not None:
        g = target_gpus if target_gpus is not None else gpus
        actors = round(g * actors_per_gpu)
        need = actors  # cores: an actor each (the GMIs share them, as auto sizing counts)
        target: dict[str, Any] = {
            "gpus": g,
            "cores": target_cores,
            "actors": actors,
            "cores_needed": need,
            "cpu_processes_needed": actors + g * runtime["gmis_per_gpu"] + SERVICE_PROCESSES,
        }
        if target_cores is not None:
            target["fits"] = need <= target_cores
            feedable = int(target_cores // max(actors_per_gpu, 1e-9))
            target["gpus_the_cores_can_feed"] = max(0, feedable)
            if not target["fits"]:
                target["note"] = (
                    f"{target_cores} cores feed {max(0, feedable)} GPU(s) at "
                    f"{actors_per_gpu:g} actors per GPU; give more cores or "
                    "expect the GPUs to wait on the actors"
                )
        out["target"] = target
    return out


def cpu_sizing(
    runtime: dict[str, Any], target_gpus: int | None, target_cores: int | None
) -> dict[str, Any]:
    """The sizing of a recommendation that trains on the CPU: no GPU figures (null), and the
    cores it needs, an actor each and its trainers' threads (what auto sizing keeps apart),
    on a target machine as here: it does not scale with GPUs."""
    trainers = runtime["trainers"]
    need = runtime["actors"] + trainers * runtime["trainer_threads"]
    procs = runtime["actors"] + trainers + SERVICE_PROCESSES
    out: dict[str, Any] = {
        "actors_per_gpu": None,
        "sm_count": None,
        "sms_granted_per_gpu": None,
        "cpu_threads_per_sm": None,
        "cpu_processes_per_gpu": None,
        "cores_needed": need,
        "cpu_processes": procs,
        "note": (
            "the trainer runs on the CPU (trainer_device cpu): no GPU, GMI, MPS or SM figures; "
            "cores_needed = an actor each + trainers x trainer_threads; the 2 service "
            "processes share those cores"
        ),
    }
    if target_gpus is not None or target_cores is not None:
        target: dict[str, Any] = {
            "gpus": None,
            "cores": target_cores,
            "actors": runtime["actors"],
            "cores_needed": need,
            "cpu_processes_needed": procs,
        }
        notes = []
        if target_cores is not None:
            target["fits"] = need <= target_cores
            if not target["fits"]:
                notes.append(
                    f"{target_cores} cores are fewer than the {need} it ran on; give more "
                    "cores, or expect its actors and trainers to wait on each other"
                )
        if target_gpus is not None:
            notes.append(
                f"target_gpus {target_gpus} not used: the recommended config trains on the "
                "CPU and needs no GPU; its cores are counted as measured here"
            )
        if notes:
            target["note"] = "; ".join(notes)
        out["target"] = target
    return out


def run_values(trial: Any, fixed: dict[str, Any]) -> dict[str, Any]:
    """Every knob's value ``trial`` ran with: its ``values`` attribute, else (trials that do
    not record it) the study's fixed knobs and its tuned values (``tuned_values``)."""
    values = trial.user_attrs.get("values")
    return dict(values) if isinstance(values, dict) else {**fixed, **tuned_values(trial)}


def default_key(done: list[Any], values_of: Any, default: dict[str, Any]) -> str:
    """The config key of the default config: that of its first completed trial (role
    ``default`` or ``reference``; ``values_of`` gives a trial's values), else of ``default``."""
    first = next((t for t in done if t.user_attrs.get("role") in REFERENCE_ROLES), None)
    return config_key(default if first is None else values_of(first))


def by_config(
    study: Any, values_of: Any, command: str
) -> tuple[list[Any], list[Any], dict[str, list[Any]]]:
    """Every trial of ``study``, its completed ones, and those grouped by config (the key of
    ``values_of(trial)``).

    Raises:
        ExportError: no completed trial (run ``command`` first).
    """
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    if not done:
        raise ExportError(
            f"study {study.study_name!r} has no completed trial yet; run {command} first"
        )
    groups: dict[str, list[Any]] = {}
    for t in done:
        groups.setdefault(config_key(values_of(t)), []).append(t)
    return trials, done, groups


def export_doc(
    study: Any,
    pick: str | None = None,
    target_gpus: int | None = None,
    target_cores: int | None = None,
    sm_count: int | None = None,
) -> dict[str, Any]:
    """The export document of ``study`` (see the module docstring).

    Raises:
        ExportError: not a train study of ``autotune study``, or no completed trial.
    """
    meta = study.user_attrs.get("autotune")
    if not meta or meta.get("kind") != "train":
        raise ExportError(
            f"study {study.study_name!r} is neither an 'autotune study --env' study nor an "
            "'autotune wrap' or 'autotune study -- CMD' study: it holds no config to export"
        )
    to_target = meta["objective"] == "joules_to_target"
    own = {"joules_to_target": TARGET_METRIC, "goodput_per_joule": GOODPUT_METRIC}
    metric = pick or own.get(
        meta["objective"],
        "steps_per_joule" if meta["objective"] in ("both", "steps_per_joule") else "steps_per_s",
    )
    allowed = ("steps_per_joule", "steps_per_s", *own.values())
    if metric not in allowed:
        raise ExportError(f"pick={pick!r}: allowed {', '.join(allowed)}")
    fixed = meta.get("fixed", {})
    trials, done, groups = by_config(study, lambda t: run_values(t, fixed), "autotune study")
    if not any(score(t, metric) is not None for t in done):
        raise ExportError(
            f"pick={pick!r}: no trial of study {study.study_name!r} was measured by {metric} "
            f"(its objective is {meta['objective']}); allowed steps_per_joule, steps_per_s, "
            "or the figure its objective records"
        )

    def median(ts: list[Any]) -> float:
        return statistics.median(score(t, metric) or 0.0 for t in ts)

    best = pick_config(groups, lambda t: score(t, metric) or 0.0)
    values = run_values(best[0], fixed)
    base = TrainConfig.from_dict(meta["base"])
    steps = steps_to_run(best) if to_target else TrainConfig().steps
    cfg = dataclasses.replace(base, **config_changes(values), steps=steps, max_wall_s=None)
    if cfg.trainer_device == "auto":  # as it resolved where the study ran
        gpus_there = meta.get("machine", {}).get("gpus")
        cfg = dataclasses.replace(cfg, trainer_device="cuda" if gpus_there else "cpu")
    runtime = runtime_view(cfg)
    dkey = default_key(done, lambda t: run_values(t, fixed), {**fixed, **meta.get("default", {})})
    default = groups.get(dkey, [])
    rec, dflt = measured(best), measured(default)
    ratio = median(best) / median(default) if default and median(default) else None
    sms = sm_count or meta.get("machine", {}).get("sm_count")
    return {
        "autotune_export": FORMAT_VERSION,
        "study": study.study_name,
        "workload": {"env": meta.get("env"), "policy": meta.get("policy")},
        "picked_by": metric,
        "recommended": {"values": values, "runtime": runtime, "config": cfg.to_dict()},
        "sizing": sizing(runtime, sms, target_gpus, target_cores),
        "evidence": {
            "machine": meta.get("machine"),
            "trial_s": meta.get("trial_s"),
            "warmup_s": meta.get("warmup_s"),
            "trials": {
                "complete": len(done),
                "failed": sum(t.state == TrialState.FAIL for t in trials),
                "configs": len(groups),
            },
            "recommended": rec,
            "confirm": _ONCE if len(best) == 1 and len(done) > 1 else None,
            "default": {"values": meta.get("default"), **dflt},
            f"{metric}_vs_default": ratio,
            "reference_runs": reference_runs(trials, metric),
            "note": _NOTE_TARGET if to_target else _NOTE,
        },
    }


def dump(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "yaml":
        return yaml.safe_dump(doc, sort_keys=False)
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    raise ExportError(f"format {fmt!r}: allowed json, yaml")


def load_config(path: str, flag: str = "--config") -> Any:
    """A ``TrainConfig`` from an export document, a ``train --json`` result, or a bare config
    (JSON or YAML); ``flag`` names the option that gave ``path`` in the messages.

    Raises:
        ExportError: the file cannot be read or holds no config.
        runtime.config.ConfigError: the config has unknown or invalid fields.
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ExportError(f"{flag} {path}: cannot read it: {exc}") from None
    if path.endswith(".json") or text.lstrip().startswith(("{", "[")):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:  # in JSON's words, with its line and column
            raise ExportError(
                f"{flag} {path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
            ) from None
    else:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ExportError(f"{flag} {path}: not valid YAML: {exc}") from None
    if isinstance(doc, dict) and isinstance(doc.get("recommended"), dict):
        doc = doc["recommended"].get("config")
    elif isinstance(doc, dict) and isinstance(doc.get("config"), dict):
        doc = doc["config"]
    if not isinstance(doc, dict):
        raise ExportError(
            f"{flag} {path}: no config in it; give an 'autotune export' file, "
            "a 'train --json' result or a mapping of TrainConfig fields"
        )
    return TrainConfig.from_dict(doc)
