"""Which workload a study's measurements are of: a study compares one env and one policy.

An online study (``train --tune``) records its trials' env and policy in its ``workload``
attribute, ``autotune study`` in its ``autotune`` one; a tuned run refuses a study of another
workload, or of a wrapped script's runs, saying whose trials it holds. Two spellings of one
network on one env (``auto`` and ``auto:64:64:auto``, or the sizes written out) are the same
workload (``same_network``).
"""

from __future__ import annotations

import logging
from typing import Any

from autotune.tuning.storage import StudyError, redact, sqlite_file, storage_url
from autotune.tuning.tuner_rules import objective_problem
from autotune.workflows.wrap_export import is_wrap_study
from runtime.checkpoint_fit import layers
from runtime.config import ConfigError, TrainConfig

logger = logging.getLogger(__name__)

WORKLOAD_ATTR = "workload"
"""The user attribute an online study records its trials' env and policy in (``{"env": ...,
"policy": ...}``); ``autotune study`` records them in its ``autotune`` attribute."""


def made_for(study: Any) -> dict[str, Any] | None:
    """The env and policy ``study``'s trials ran, as it records them; None where it records
    none (a study made before they were recorded, or not made yet)."""
    for key in (WORKLOAD_ATTR, "autotune"):
        made = study.user_attrs.get(key)
        if isinstance(made, dict) and "env" in made:
            return {"env": made["env"], "policy": made.get("policy", "auto")}
    return None


def workload_problem(study: Any, cfg: TrainConfig) -> str | None:
    """Why ``study`` cannot hold this run's trials (another env or policy, or a wrapped
    script's runs, measure another workload), or None."""
    name = study.study_name
    if is_wrap_study(study):  # 'autotune wrap' or 'autotune study -- CMD'
        return f"study {name!r} holds a wrapped script's runs, not --env {cfg.env}'s; give " + (
            "this run another --study name"
        )
    made = made_for(study)
    if made is None or (made["env"] == cfg.env and same_network(cfg, made["policy"])):
        return None
    return (
        f"study {name!r} holds trials of --env {made['env']} --policy {made['policy']}, not of "
        f"this run's --env {cfg.env} --policy {cfg.policy}: a study compares measurements of one "
        f"workload; give another --study name (the default is online-<env>), or run --env "
        f"{made['env']} --policy {made['policy']}"
    )


def check_workload(study: Any, cfg: TrainConfig) -> None:
    """Refuses ``study`` where it holds another workload's trials (``workload_problem``); records
    this run's env and policy where it records none. A study that has trials but records none
    (made before they were recorded) is taken as this run's, with a warning.

    Raises:
        StudyError: saying whose trials the study holds and what to do.
    """
    problem = workload_problem(study, cfg)
    if problem is not None:
        raise StudyError(problem)
    if made_for(study) is not None:
        return
    trials = len(study.get_trials(deepcopy=False))
    if trials:
        logger.warning(
            "study %r records no env or policy (it was made before they were recorded): its %d "
            "trials are taken as --env %s --policy %s's, and recorded so",
            study.study_name,
            trials,
            cfg.env,
            cfg.policy,
        )
    study.set_user_attr(WORKLOAD_ATTR, {"env": cfg.env, "policy": cfg.policy})


def refuse_other_workload(
    storage: str, name: str | None, cfg: TrainConfig, objective: str | None = None
) -> None:
    """Before a tuned run sizes itself: refuses study ``name`` (None: ``online-<env>``) in
    ``storage`` where it exists and holds another workload's trials (``workload_problem``), or
    values of another ``objective`` (``tuner_rules.objective_problem``).
    Creates nothing: a study or a SQLite file not there yet is left to
    ``autotune.workflows.tune.start_tuning``, as is a storage that cannot be opened (it says
    why).

    Raises:
        StudyError: saying whose trials the study holds and what to do.
    """
    import optuna

    storage = storage_url(storage)
    path = sqlite_file(storage)
    if path is not None and not path.is_file():
        return
    name = name or f"online-{cfg.env}"
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except Exception:  # no such study yet, or a storage start_tuning reports on
        logger.debug("no study %r in %s to check yet", name, redact(storage))
        return
    problem = workload_problem(study, cfg)
    if problem is None and objective is not None:
        problem = objective_problem(study, objective)
    if problem is not None:
        raise StudyError(problem)


def same_network(cfg: TrainConfig, policy: str) -> bool:
    """Whether ``policy`` spells the network ``cfg.policy`` does on ``cfg.env`` (their layer
    sizes once ``auto`` is resolved); False where either does not fit the env."""
    if policy == cfg.policy:
        return True
    try:
        info = cfg.check_workload()
    except ConfigError:
        return False
    sizes = layers(cfg.policy, info.obs_dim, info.act_dim)
    return sizes is not None and sizes == layers(policy, info.obs_dim, info.act_dim)
