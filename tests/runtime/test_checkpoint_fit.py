"""A run goes on from a checkpoint only with the learner it was saved from: the same network
(the layer sizes its policy spec resolves to, however the spec is spelled) and the same
observation normalisation; anything else is refused before the run, naming both."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from policies.actor_critic import ActorCritic
from runtime import checkpoint
from runtime.config import ConfigError, TrainConfig


def cfg_for(directory, policy: str = "auto", normalize_obs: bool = True) -> TrainConfig:
    cfg = TrainConfig(
        env="CartPole-v1", steps=100_000, policy=policy, checkpoint=str(directory)
    )  # CartPole: 4 observation values, 2 actions
    return dataclasses.replace(
        cfg, learner=dataclasses.replace(cfg.learner, normalize_obs=normalize_obs)
    )


def learner_state(cfg: TrainConfig, info, updates: int = 3) -> dict:
    """A learner ``state()`` of ``cfg``'s model after ``updates`` updates' observations."""
    torch.manual_seed(0)
    norm = cfg.learner.normalize_obs
    model = ActorCritic(info.obs_dim, info.act_dim, info.discrete, cfg.policy, norm)
    for _ in range(updates):
        model.obs_norm.update(torch.randn(512, info.obs_dim) * 3.0 + 1.0)
    return {
        "model": model.state_dict(),
        "optimizer": {"state": {}, "param_groups": []},
        "version": updates,
        "trained_steps": 512 * updates,
    }


def as_saved_before_layers_were_kept(directory) -> None:
    """``learner.json`` as saves wrote it before it recorded layers and normalisation."""
    path = directory / checkpoint.INFO_NAME
    doc = json.loads(path.read_text())
    doc.pop("layers", None), doc.pop("normalize_obs", None)
    doc["format"] = 2
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("old_format", [False, True])
@pytest.mark.parametrize("saved_norm", [True, False])
def test_a_checkpoint_of_the_other_observation_normalisation_is_refused(
    tmp_path, saved_norm, old_format
):
    ck = tmp_path / "ck"
    saved_cfg = cfg_for(ck, normalize_obs=saved_norm)
    info = saved_cfg.validate()
    assert checkpoint.save(str(ck), learner_state(saved_cfg, info), saved_cfg, info)
    if old_format:  # told by the saved statistics: a normalising learner moved them
        as_saved_before_layers_were_kept(ck)
    other = cfg_for(ck, normalize_obs=not saved_norm)
    with pytest.raises(ConfigError) as err:
        checkpoint.check(other, info)
    said = {True: "normalised observations", False: "raw observations"}
    (problem,) = err.value.problems
    assert problem == (
        f"checkpoint={str(ck)!r}: saved with normalize_obs={saved_norm} ({said[saved_norm]}), "
        f"this run has normalize_obs={not saved_norm} ({said[not saved_norm]}); resume with "
        f"normalize_obs={saved_norm}, or give another directory to start a new checkpoint"
    )
    resume = checkpoint.check(saved_cfg, info)  # the same setting goes on
    assert (resume.version, resume.trained_steps) == (3, 1536)


def test_a_learner_saved_before_any_update_resumes_with_either_normalisation(tmp_path):
    """Saved without ``normalize_obs`` and never updated: its statistics say nothing (both
    settings leave them as they started), and nothing normalised was learned."""
    ck = tmp_path / "ck"
    cfg = cfg_for(ck, normalize_obs=False)
    info = cfg.validate()
    checkpoint.save(str(ck), learner_state(cfg, info, updates=0), cfg, info)
    as_saved_before_layers_were_kept(ck)
    assert checkpoint.check(cfg_for(ck, normalize_obs=True), info) is not None


EQUIVALENT = [
    ("auto:256:128:64:auto", "4:256:128:64:2"),
    ("4:256:128:64:2", "auto:256:128:64:auto"),
    ("auto:256:128:64:auto", " auto:256:128:64:auto "),
    ("auto", "auto:64:64:auto"),
    ("4:64:64:2", "auto"),
]


@pytest.mark.parametrize("old_format", [False, True])
@pytest.mark.parametrize(("saved", "resumed"), EQUIVALENT)
def test_a_policy_spelled_another_way_for_the_same_network_resumes(
    tmp_path, saved, resumed, old_format
):
    ck = tmp_path / "ck"
    saved_cfg = cfg_for(ck, policy=saved)
    info = saved_cfg.validate()
    state = learner_state(saved_cfg, info)
    checkpoint.save(str(ck), state, saved_cfg, info)
    if old_format:  # the layers are resolved from the saved spec and sizes
        as_saved_before_layers_were_kept(ck)
    resume = checkpoint.check(cfg_for(ck, policy=resumed), info)
    assert (resume.version, resume.trained_steps) == (3, 1536)
    # the resuming run's learner takes the saved one as it is (what a trainer does with it)
    model = ActorCritic(info.obs_dim, info.act_dim, info.discrete, resumed)
    model.load_state_dict(checkpoint.load_state(resume.state_file)["model"], strict=True)


@pytest.mark.parametrize("old_format", [False, True])
def test_a_policy_of_another_network_is_refused_naming_both(tmp_path, old_format):
    ck = tmp_path / "ck"
    saved_cfg = cfg_for(ck, policy="auto:256:128:64:auto")
    info = saved_cfg.validate()
    checkpoint.save(str(ck), learner_state(saved_cfg, info), saved_cfg, info)
    if old_format:
        as_saved_before_layers_were_kept(ck)
    for resumed, layers in (("4:256:128:2", "4:256:128:2"), ("auto", "4:64:64:2")):
        with pytest.raises(ConfigError) as err:
            checkpoint.check(cfg_for(ck, policy=resumed), info)
        assert err.value.problems == [
            f"checkpoint={str(ck)!r}: saved with policy='auto:256:128:64:auto' (layers "
            f"4:256:128:64:2), this run has policy={resumed!r} (layers {layers}); resume with "
            "a policy of the same layers, or give another directory"
        ]


def test_a_checkpoint_of_another_env_names_the_env_not_the_network(tmp_path):
    ck = tmp_path / "ck"
    cfg = cfg_for(ck)
    info = cfg.validate()
    checkpoint.save(str(ck), learner_state(cfg, info), cfg, info)
    other = dataclasses.replace(cfg, env="Acrobot-v1")  # 6 observation values, 3 actions
    with pytest.raises(ConfigError) as err:
        checkpoint.check(other, other.validate())
    problems = err.value.problems
    assert [p.split(": saved with ")[1].split("=")[0] for p in problems] == [
        "env",
        "obs_dim",
        "act_dim",
    ]
    assert all(p.endswith("resume with the same env, or give another directory") for p in problems)
