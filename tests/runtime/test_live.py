"""Live changes of a running job (``Runner.reconfigure``): nothing lost, bad changes refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.config import ConfigError, TrainConfig
from runtime.runner import Runner


def _cfg(**over) -> TrainConfig:
    base = {"steps": 16_000, "actors": 2, "envs_per_actor": 4, "rollout_len": 16, "batch_size": 512}
    return TrainConfig(**{**base, **over})


@pytest.mark.slow
def test_actors_added_removed_and_respawned_and_sizes_changed_mid_run_lose_nothing():
    cfg = _cfg()
    steps = [
        (2_000, {"actors": 4}),
        (5_000, {"envs_per_actor": 2, "batch_size": 1024, "chunk_bytes": 64 * 1024}),
        (8_000, {"actors": 1, "trainers": 2}),
    ]
    runner: Runner

    def drive(state):
        if steps and state.trained_steps >= steps[0][0] and not state.draining:
            runner.reconfigure(**steps.pop(0)[1])

    runner = Runner(cfg, cfg.validate(), on_progress=drive)
    result = runner.run()
    assert not steps, "every change was asked for"
    assert [c["changed"] for c in result["changes"]] == [
        {"actors": 4},
        {"envs_per_actor": 2, "batch_size": 1024, "chunk_bytes": 64 * 1024},
        {"actors": 1, "trainers": 2},
    ]
    assert result["sampled_steps"] == result["env_steps"] + result["discarded_steps"]
    assert result["lost_steps"] == 0 and result["actor_restarts"] == 0
    ended = runner.ended
    assert not ended.died and set(ended.clean) == set(ended.stepped)
    # 2 first actors, 2 added, 4 respawned with 2 envs: 8 incarnations, all ended cleanly
    assert len(ended.stepped) == 8
    assert result["config"]["actors"] == 1 and result["config"]["batch_size"] == 1024
    tel = runner.telemetry
    assert tel.source("compressor")["chunk_bytes"] == 64 * 1024
    assert tel.source("compressor")["live_epoch"] >= 1
    current = [tel.source(n) for n in runner.trainer_names()]
    assert len(current) == 2 and all(t["batch_size"] == 1024 for t in current)
    assert result["weights_identical"] and len(result["phases"]) == 2


def test_changes_that_need_a_new_run_or_are_invalid_are_refused_and_change_nothing():
    cfg = _cfg()
    runner = Runner(cfg, cfg.validate())
    with pytest.raises(ConfigError, match="rollout_len cannot change in a running job"):
        runner.reconfigure(rollout_len=8)
    with pytest.raises(ConfigError, match="must be a multiple of rollout_len"):
        runner.reconfigure(batch_size=100)
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['actor'\]; live settings"):
        runner.reconfigure(actor=3)
    with pytest.raises(ConfigError, match="must be an integer >= 1"):
        runner.reconfigure(actors=0)
    # nothing changed: the run's config is the one given, its env backend resolved
    assert runner._pending_cfg is None
    assert runner.cfg == replace(cfg, env_backend=cfg.resolved_backend())
    plan = runner.reconfigure(actors=3, batch_size=1024)
    assert plan.actors and plan.services and not plan.handover and not plan.respawn_actors


def test_actor_niceness_changes_by_respawning_the_actors():
    from runtime import live

    cfg = TrainConfig(actors=2)
    plan = live.plan(cfg, replace(cfg, actor_nice=5))
    assert plan.changed == ("actor_nice",) and plan.respawn_actors and not plan.handover


def test_a_backend_change_that_would_change_the_envs_spaces_is_refused():
    """Blackjack-v1's observation is 3 numbers on EnvPool and a 45-value one-hot on
    gymnasium: a running job cannot move between them (its policy was made for one); CartPole
    can."""
    pytest.importorskip("envpool")
    from runtime import live

    cfg = TrainConfig(env="Blackjack-v1", env_backend="envpool")
    info = cfg.check_workload()
    with pytest.raises(ConfigError, match=r"there has 45 observation values .* the run's policy 3"):
        live.plan(cfg, replace(cfg, env_backend="gymnasium"), info)
    cart = TrainConfig(env="CartPole-v1", env_backend="envpool")
    assert live.plan(cart, replace(cart, env_backend="gymnasium"), cart.check_workload()).changed
