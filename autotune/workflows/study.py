"""``autotune study``: an offline study from its options, run here or by workers.

``StudyOptions`` is what the ``study`` flags say; ``resolve_options`` checks them and fills in
the env, policy and seed (the flags given win over a ``--from`` config's, the file's over the
defaults); ``make_study`` opens the ``OfflineStudy`` they describe (a worker passes its core
count and GPU: ``autotune.workflows.study_workers``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.tuning.knobs import KnobError, Machine, build_space, knob_value
from autotune.tuning.offline_study import OBJECTIVES, OfflineStudy
from autotune.tuning.storage import StudyError, check_choices, open_study
from autotune.tuning.study_best import best_trial, pareto_front
from autotune.tuning.trials import ScriptTrials, TrainTrials
from autotune.workflows.export import ExportError, load_config
from autotune.workflows.study_workload import same_network
from autotune.workflows.worker_meter import worker_meter
from autotune.wrap.wrapper import Wrapper, parse_knob, script_name
from runtime.config import ConfigError, TrainConfig


@dataclass(frozen=True)
class StudyOptions:
    """An offline study's settings (the flags of ``autotune study``)."""

    env: str | None = None
    """The gymnasium env id (None: the ``from_config``'s, else CartPole-v1)."""
    policy: str | None = None
    """The MLP spec (None: the ``from_config``'s, else auto)."""
    seed: int | None = None
    """Sampler and run seed (None: the ``from_config``'s, else 0)."""
    from_config: str | None = None
    """A file whose config every trial starts from."""
    base: dict[str, Any] | None = None
    """The ``from_config`` config as a mapping (set by ``resolve_options``)."""
    trials: int = 20
    trial_s: float = 30.0
    warmup_s: float = 10.0
    knobs: tuple[str, ...] = ()
    """``NAME=SPEC`` knob overrides (for a script, its knobs)."""
    objective: str = "steps_per_joule"
    target_return: float | None = None
    """With ``objective`` ``joules_to_target``: the 100-episode mean return each trial runs to."""
    confirm: int = 0
    reference_every: int = 0
    profile: bool = True
    workers: int = 1
    cluster: str | None = None
    """Run the workers as Ray tasks on this cluster (``autotune.workflows.study_cluster``)."""
    worker_cpus: int = 0
    """With ``cluster``: the CPUs each worker asks Ray for (its actor knob ranges over them)."""
    worker_gpus: int = 0
    """With ``cluster``: 1 gives each worker a GPU of its own."""
    report_timeout_s: float = 60.0
    storage: str = "sqlite:///autotune.db"
    study: str | None = None
    """The study's name (None: ``study-<env>`` or ``study-<script name>``)."""
    cmd: tuple[str, ...] = ()
    """A wrapped script's command (empty: train trials)."""


def resolve_options(options: StudyOptions) -> StudyOptions:
    """The options checked, with ``env``, ``policy``, ``seed`` and ``base`` filled in.

    Raises:
        ValueError: saying which settings are wrong and what is allowed, or a ``from_config``
            file that holds no valid config.
    """
    o = options
    cmd = o.cmd[1:] if o.cmd[:1] == ("--",) else o.cmd
    if o.trials < 1 or not o.trial_s > o.warmup_s >= 0:
        raise ValueError(
            f"--trials {o.trials}, --trial-s {o.trial_s}, --warmup-s "
            f"{o.warmup_s}: need trials >= 1, trial-s > warmup-s >= 0"
        )
    if o.reference_every < 0:
        raise ValueError(
            f"--reference-every {o.reference_every}: allowed 0 (never) or K "
            ">= 1 (a reference run after every K trials)"
        )
    if o.reference_every and o.workers > 1:
        raise ValueError(
            f"--reference-every with --workers {o.workers}: each worker runs on "
            "its own slice of the machine, which one reference cannot scale; run "
            "the study in one process (--workers 1)"
        )
    if not 0 <= o.confirm <= o.trials:
        raise ValueError(f"--confirm {o.confirm}: allowed 0..--trials ({o.trials})")
    if o.workers < 1 or o.workers > o.trials:
        raise ValueError(f"--workers {o.workers}: allowed 1..--trials ({o.trials})")
    _check_cluster(o)
    _check_target(o, bool(cmd))
    if cmd and not o.knobs:
        raise ValueError("-- CMD: give at least one --knob NAME=SPEC for the script")
    env, policy, seed, base = o.env, o.policy, o.seed, None
    if o.from_config is not None:
        if cmd:
            raise ValueError(
                "--from: a train config; a wrapped script (-- CMD) takes its settings from --knob"
            )
        try:
            cfg = load_config(o.from_config, flag="--from")
        except ExportError as exc:
            raise ValueError(str(exc)) from None
        except ConfigError as exc:
            raise ValueError(f"--from {o.from_config}: {exc}") from None
        env, policy = env or cfg.env, policy or cfg.policy
        seed = cfg.seed if seed is None else seed
        base = cfg.to_dict()
    return dataclasses.replace(
        o,
        cmd=tuple(cmd),
        env=env or "CartPole-v1",
        policy=policy or "auto",
        seed=0 if seed is None else seed,
        base=base,
    )


def _check_target(o: StudyOptions, script: bool) -> None:
    if (o.objective == "joules_to_target") != (o.target_return is not None):
        raise ValueError(
            "--objective joules_to_target and --target-return R go together: each trial runs "
            "until its 100-episode mean return reaches R (or --trial-s), and the study ranks "
            "configs by the joules that took"
        )
    if script and (o.target_return is not None or o.objective == "goodput_per_joule"):
        raise ValueError(
            f"--objective {o.objective}: train trials only (a wrapped script's returns and "
            "gradients are its own); allowed for a script: steps_per_joule, steps_per_s, both"
        )
    if o.target_return is not None and o.reference_every:
        raise ValueError(
            "--reference-every with --target-return: joules to a target count whole runs, "
            "which reference runs do not scale; leave --reference-every out"
        )


def _check_cluster(o: StudyOptions) -> None:
    if o.worker_cpus < 0 or o.worker_gpus not in (0, 1):
        raise ValueError(
            f"--worker-cpus {o.worker_cpus}, --worker-gpus {o.worker_gpus}: allowed CPUs >= 1 "
            "and GPUs 0 or 1"
        )
    if o.cluster is None:
        if o.worker_cpus or o.worker_gpus:
            raise ValueError("--worker-cpus and --worker-gpus take effect with --cluster only")
        return
    from runtime.cluster import parse_cluster

    if o.reference_every:
        raise ValueError(
            "--reference-every: not with --cluster (one reference cannot scale "
            "workers on other nodes)"
        )
    kind = parse_cluster(o.cluster).kind  # ValueError says what is allowed
    if o.worker_cpus < 1:
        raise ValueError(
            f"--cluster {o.cluster}: give --worker-cpus K, the CPUs each worker "
            "asks Ray for (its trials' actors run on them)"
        )
    if kind != "local" and o.storage.startswith("sqlite"):
        raise ValueError(
            f"--cluster {o.cluster} with --storage {o.storage.split('://')[0]}://...: workers "
            "on other hosts cannot reach a SQLite file; give a database server they all "
            "reach, e.g. postgresql://USER:PASSWORD@HOST/DB"
        )


def study_name(options: StudyOptions) -> str:
    if options.study:
        return options.study
    if options.cmd:
        return f"study-{script_name(list(options.cmd))}"
    return f"study-{options.env}"


def make_study(
    options: StudyOptions, cores: int | None = None, gpu: int | None = None
) -> OfflineStudy:
    """The ``OfflineStudy`` that resolved ``options`` describe; a worker passes its core count
    and GPU.

    Raises:
        KnobError, StudyError, ValueError: bad knobs, storage or settings.
    """
    o = options
    meta: dict[str, Any] = {"objective": o.objective, "trial_s": o.trial_s}
    changed: dict[str, tuple[Any, Any]] = {}
    if o.cmd:
        space = [parse_knob(k) for k in o.knobs]
        if len({k.name.upper() for k in space}) != len(space):  # one AUTOTUNE_<NAME> each
            raise KnobError(
                f"a knob is given twice (names differing only in case share one "
                f"AUTOTUNE_<NAME> variable): {[k.name for k in space]}"
            )
        wrapper = Wrapper(list(o.cmd), o.trial_s, o.report_timeout_s)
        trials: TrainTrials | ScriptTrials = ScriptTrials(wrapper, space)
        meta.update(kind="script", cmd=list(o.cmd), knobs=list(o.knobs))
    else:
        here = Machine.here()
        machine = Machine(cores or here.cores, here.gpus if gpu is None else 1)
        base = _base_config(o)
        knobs = build_space(
            machine, list(o.knobs), base.learner.minibatches, None, base.learner.min_minibatch
        )
        _check_workload(base)
        share = (machine.cores / here.cores, base.cpu_idle_w)  # of the packages' idle draw
        meter = worker_meter(gpu, *share) if o.workers > 1 or o.cluster else None
        trials = TrainTrials(knobs, base, o.warmup_s, meter=meter)
        if o.from_config is not None:
            changed = fixed_changes(trials, machine.gpus > 0)
        meta.update(
            kind="train",
            env=o.env,
            policy=o.policy,
            warmup_s=o.warmup_s,
            base=base.to_dict(),
            fixed=trials.fixed,
            machine={
                "cores": os.cpu_count(),
                "gpus": here.gpus,
                "worker_cores": machine.cores,
                "sm_count": _sm_count(here),
            },
        )
    study = open_study(o.storage, study_name(o), seed=o.seed, metrics=OBJECTIVES[o.objective])
    _check_same_kind(study, o.objective)  # before OfflineStudy fails any orphan trial of it
    offline = OfflineStudy(
        study,
        trials,
        o.objective,
        profile=o.profile,
        reference_every=o.reference_every,
        from_config=o.from_config is not None,
    )
    check_choices(study, {k.name: k.choices for k in offline.knobs})
    if "autotune" not in study.user_attrs:
        study.set_user_attr("autotune", {**meta, "default": offline.default()})
    elif "base" in meta:
        _check_same_base(study, meta["base"])
    offline.changed = changed
    return offline


def fixed_changes(trials: TrainTrials, gpu: bool) -> dict[str, tuple[Any, Any]]:
    """The knobs whose base config value no trial runs, as (that value, the value they run):
    the knobs with one value here (fixed by ``--knob``, or the only one this machine, or a
    worker's share of it, allows), and an MPS share a CPU trainer drops."""
    base, fixed = trials.base, trials.fixed
    out = {}
    for name, used in fixed.items():
        given = knob_value(base, name, cuda=gpu)
        if given != used:
            out[name] = (given, used)
    if fixed.get("trainer_device") == "cpu" and base.mps_pct is not None:
        out["mps_pct"] = (knob_value(base, "mps_pct", cuda=gpu), None)
    return out


def from_notes(options: StudyOptions, offline: OfflineStudy) -> list[str]:
    """What a study made ``--from`` a config says of it: the values its first trial runs as
    given (outside their knob's choices, which the sampler keeps to), and those no trial runs."""
    path, notes = options.from_config, []
    if path is None:
        return notes
    if offline.given:
        shown = ", ".join(f"{k}={v}" for k, v in offline.given.items())
        notes.append(
            f"--from {path}: the first trial runs it as it is; {shown} lie outside the "
            "knobs' choices, which the other trials keep to"
        )
    if offline.changed:
        shown = ", ".join(f"{k} {g} -> {u}" for k, (g, u) in offline.changed.items())
        notes.append(
            f"--from {path}: every trial, the first too, runs {shown}: a knob with one "
            "value (given by --knob, or the only one this machine or a worker's share of "
            "its cores allows) runs at it"
        )
    return notes


def _check_same_kind(study: optuna.Study, objective: str) -> None:
    """Refuses a study of a wrapped script or of a tuned run, or one made for another
    objective: its values would sit beside this session's in other units."""
    whose = "a wrapped script's runs ('autotune wrap')" if "wrap" in study.user_attrs else None
    if "autotune" not in study.user_attrs and study.get_trials(deepcopy=False):
        whose = whose or "a tuned run's windows ('autotune train --tune')"
    if whose is not None:
        raise StudyError(f"study {study.study_name!r} holds {whose}; give another --study name")
    made = (study.user_attrs.get("autotune") or {}).get("objective")
    if made is not None and made != objective:
        raise StudyError(
            f"study {study.study_name!r} was made for --objective {made}, not {objective}; "
            "give the same objective, or a new --study name"
        )


def _check_same_base(study: optuna.Study, base: dict[str, Any]) -> None:
    """Raises ValueError if a resumed study's trials would start from another config than its
    first session's (``export`` builds its config from that one)."""
    stored = study.user_attrs["autotune"].get("base") or {}
    now = json.loads(json.dumps(base))  # tuples as the storage keeps them: lists
    differ = sorted(k for k in stored if k != "max_wall_s" and stored[k] != now.get(k))
    if "policy" in differ and same_network(TrainConfig.from_dict(now), stored["policy"]):
        differ.remove("policy")  # one network spelled two ways ("auto", "auto:64:64:auto")
    if differ:
        changes = ", ".join(f"{k}: {stored[k]!r} -> {now.get(k)!r}" for k in differ)
        raise ValueError(
            f"study {study.study_name!r} was started from another config ({changes}); "
            "its trials and export assume that one: give the same --from, --env, "
            "--policy and --seed, or a new --study"
        )


def _check_workload(base: TrainConfig) -> None:
    """Raises ValueError, before any trial, for an env or a policy spec that cannot run."""
    try:
        base.check_workload()
    except ConfigError as exc:
        raise ValueError(
            f"--env {base.env} --policy {base.policy}: {'; '.join(exc.problems)}"
        ) from None


def _base_config(options: StudyOptions) -> TrainConfig:
    """The config every trial starts from: the ``--from`` one (or the defaults) on this
    study's env, policy and seed, running for ``--trial-s`` with no checkpoint."""
    doc = dict(options.base or {})
    doc.update(
        env=options.env,
        policy=options.policy,
        seed=options.seed,
        steps=10**12,
        max_wall_s=options.trial_s,
        checkpoint=None,
    )
    if options.target_return is not None:
        doc["target_return"] = options.target_return
    return TrainConfig.from_dict(doc)


def _sm_count(machine: Machine) -> int | None:
    if not machine.gpus:
        return None
    import torch  # heavy: only on a GPU machine

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


def run_here(
    offline: OfflineStudy, trials: int, confirm: int, done: Callable[[dict[str, Any]], None]
) -> bool:
    """Runs ``trials`` trials in this process, the last ``confirm`` of them confirmations;
    True if Ctrl-C cut them."""
    try:
        for i in range(trials):
            done(offline.step(confirm=i >= trials - confirm).__dict__)
    except KeyboardInterrupt:
        return True
    return False


def summary(study: optuna.Study, objective: str) -> dict[str, Any]:
    """The best trial (by steps/J for ``both``) and the Pareto front, for ``--json``."""

    def trial_doc(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
        # values: every knob's value the trial ran with (older trials: their parameters)
        values = t.user_attrs.get("values", t.params)
        return {"number": t.number, "objective": t.values, **t.user_attrs, "values": values}

    best = best_trial(study, metric=1 if objective == "both" else 0)
    return {
        "best": None if best is None else trial_doc(best),
        "pareto_front": [trial_doc(t) for t in pareto_front(study)],
    }
