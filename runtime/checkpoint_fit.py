"""Whether a run may go on from a checkpoint's learner (``runtime.checkpoint``): what
``learner.json`` records of the learner it describes (``describe``), and what a resuming run is
refused for (``problems``).

A run goes on from a checkpoint only with the learner it was saved from:

* the same environment, observation size and action size;
* the same network: the layer sizes the ``policy`` spec resolves to for those sizes
  (``policies.mlp.parse_spec``), not its spelling: ``auto``, ``auto:64:64:auto`` and
  ``4:64:64:2`` are one network for a 4-value observation and 2 actions;
* the same observation normalisation (``learner.normalize_obs``): a network trained on
  normalised observations fed raw ones, or the other way round, sees inputs of another scale
  from its first step on, and its saved statistics would be applied or ignored at will.

Saves from before ``learner.json`` recorded the layers and the normalisation are read too: the
layers from their ``policy`` spec and sizes, the normalisation from the saved observation
statistics (a normalising learner moves them at its first update; one that does not never
does). A save of a learner that never updated does not say; it is taken as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.config import TrainConfig
from runtime.envs import EnvInfo

UNTOUCHED_COUNT = 1e-4
"""The observation count a normaliser starts from (``policies.actor_critic.RunningNorm``); an
update of a normalising learner adds its batch's observations to it."""


def layers(policy: str, obs_dim: int, act_dim: int) -> list[int] | None:
    """The layer sizes ``policy`` resolves to (None where it does not parse for these sizes)."""
    from policies.mlp import PolicySpecError, parse_spec

    try:
        return parse_spec(str(policy), int(obs_dim), int(act_dim))
    except (PolicySpecError, TypeError, ValueError):
        return None


def describe(cfg: TrainConfig, info: EnvInfo) -> dict[str, Any]:
    """What ``learner.json`` records of the learner ``cfg`` builds for ``info``."""
    return {
        "env": cfg.env,
        "policy": cfg.policy,
        "layers": layers(cfg.policy, info.obs_dim, info.act_dim),
        "obs_dim": info.obs_dim,
        "act_dim": info.act_dim,
        "normalize_obs": bool(cfg.learner.normalize_obs),
    }


def saved_normalize_obs(doc: Mapping[str, Any], state: Mapping[str, Any]) -> bool | None:
    """Whether the saved learner normalised its observations: as ``learner.json`` says, else as
    its observation statistics show (None where they cannot: a learner that never updated)."""
    if isinstance(doc.get("normalize_obs"), bool):
        return doc["normalize_obs"]
    count = state.get("model", {}).get("obs_norm.count")
    if count is None or int(state.get("version", 0)) == 0:
        return None
    return float(count) > UNTOUCHED_COUNT * 1.5


def _saved_layers(doc: Mapping[str, Any]) -> list[int] | None:
    saved = doc.get("layers")
    if isinstance(saved, list) and all(isinstance(n, int) for n in saved):
        return saved
    return layers(doc.get("policy", ""), doc.get("obs_dim", 0), doc.get("act_dim", 0))


def _spelled(policy: Any, sizes: list[int] | None) -> str:
    shown = ":".join(str(n) for n in sizes) if sizes else "unresolved"
    return f"policy={policy!r} (layers {shown})"


def problems(
    directory: str,
    doc: Mapping[str, Any],
    state: Mapping[str, Any],
    cfg: TrainConfig,
    info: EnvInfo,
) -> list[str]:
    """Why the run ``cfg`` cannot go on from the learner of ``directory`` (``doc``, its
    ``learner.json``, and ``state``, its ``learner.pt``), each said with what would be allowed;
    empty where it can."""
    where = f"checkpoint={directory!r}"
    out = []
    for name, ours in (("env", cfg.env), ("obs_dim", info.obs_dim), ("act_dim", info.act_dim)):
        if doc.get(name) != ours:
            out.append(
                f"{where}: saved with {name}={doc.get(name)!r}, this run has {ours!r}; resume "
                "with the same env, or give another directory"
            )
    if out:
        return out  # the layers' ends differ too: nothing more to say of the network
    saved, ours = _saved_layers(doc), layers(cfg.policy, info.obs_dim, info.act_dim)
    if saved != ours:
        out.append(
            f"{where}: saved with {_spelled(doc.get('policy'), saved)}, this run has "
            f"{_spelled(cfg.policy, ours)}; resume with a policy of the same layers, or give "
            "another directory"
        )
    norm = saved_normalize_obs(doc, state)
    if norm is not None and norm != cfg.learner.normalize_obs:
        mine = cfg.learner.normalize_obs
        out.append(
            f"{where}: saved with normalize_obs={norm} ({_inputs(norm)}), this run has "
            f"normalize_obs={mine} ({_inputs(mine)}); resume with normalize_obs={norm}, or give "
            "another directory to start a new checkpoint"
        )
    return out


def _inputs(normalize_obs: bool) -> str:
    return "normalised observations" if normalize_obs else "raw observations"
