"""``--lr-scaling``: the learning rate follows the batch size when it changes during a run."""

from __future__ import annotations

import dataclasses

import pytest

from policies.appo_config import APPOConfig
from runtime.config import TrainConfig


def test_the_learning_rate_scales_with_the_batch_as_asked():
    for rule, factor in (("none", 1.0), ("sqrt", 2.0), ("linear", 4.0)):
        cfg = APPOConfig(lr=1e-3, lr_scaling=rule, lr_batch=1024)
        assert cfg.lr_for(4096) == pytest.approx(1e-3 * factor)
        assert cfg.lr_for(None) == 1e-3
    assert "lr_scaling='cube'" in " ".join(APPOConfig(lr_scaling="cube").problems())
    assert "lr_batch=0" in " ".join(APPOConfig(lr_batch=0).problems())


def test_a_run_takes_its_starting_batch_as_the_one_its_learning_rate_is_for():
    cfg = TrainConfig(batch_size=2048, learner=APPOConfig(lr_scaling="sqrt"))
    assert cfg.as_run().learner.lr_batch == 2048
    given = dataclasses.replace(cfg, learner=APPOConfig(lr_scaling="sqrt", lr_batch=512))
    assert given.as_run().learner.lr_batch == 512
    assert TrainConfig().as_run().learner.lr_batch is None  # no scaling: nothing pinned


@pytest.mark.slow
def test_a_live_batch_change_scales_the_trainers_learning_rate():
    from runtime.runner import Runner

    lr = 1e-3
    learner = APPOConfig(lr=lr, lr_schedule="constant", lr_scaling="sqrt")
    cfg = TrainConfig(
        steps=10_000_000,
        max_wall_s=240,  # a stall ends in the assertions below, saying what was seen
        actors=1,
        envs_per_actor=8,
        rollout_len=32,
        batch_size=512,
        trainer_device="cpu",
        trainers=1,
        learner=learner,
    )
    runner: Runner
    asked: list[int] = []

    seen: dict[str, int] = {}

    def change(state) -> None:
        trainer = runner.telemetry.source(runner.trainer_names()[0])
        if not asked and state.trained_steps >= 2048:
            runner.reconfigure(batch_size=2048)
            asked.append(state.trained_steps)
        elif asked and trainer.get("batch_size") == 2048:
            version = int(trainer.get("version", 0))
            if version > seen.setdefault("version", version):
                runner.stop_requested = True  # an update at the new batch size: drains
        seen.update(trained=state.trained_steps, batch=trainer.get("batch_size"))
        if asked and state.trained_steps > asked[0] + 50_000:
            runner.stop_requested = True  # the change never took: the assertions say so

    runner = Runner(cfg, cfg.validate(), on_progress=change)
    r = runner.run()
    assert asked and not r.get("failure"), (asked, seen, r.get("failure"))
    assert "version" in seen, f"no update at the new batch size was seen: {asked}, {seen}"
    kl = r["learning_rate"].pop("last_kl")
    assert isinstance(kl, float) and kl >= 0.0  # the last update's KL divergence
    assert r["learning_rate"] == {
        "schedule": "constant",
        "kl_target": APPOConfig.kl_target,
        "scaling": "sqrt",
        "for_batch": 512,
        "last": pytest.approx(2 * lr),
    }
