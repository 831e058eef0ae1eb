"""A train trial's figures (``autotune.tuning.trials.run_config``) cover its measured window and
not its drain: once the window knows enough the run drains, training what is in flight with
the actors stopped, and that tail would lower its steps/s by an amount that differs from config
to config (larger batches drain longer)."""

import math

from autotune.tuning.trials import run_config
from autotune.tuning.windows import WindowRule
from runtime.config import TrainConfig


def test_a_trials_window_ends_where_its_drain_begins():
    cfg = TrainConfig(
        env="CartPole-v1",
        actors=1,
        envs_per_actor=4,
        batch_size=512,
        trainer_device="cpu",
        steps=10**9,
        max_wall_s=600.0,
    )
    rule = WindowRule(floor_s=2.0, ceiling_s=math.inf, target=0.5)
    result, rate = run_config(cfg, warmup_s=0.5, rule=rule)
    rows = result["timeline"]["rows"]
    drained = rows[-1]  # sampled once the drain is done
    assert rate["to_s"] < drained[0], (rate, rows[-3:])
    inside = [r for r in rows if rate["from_s"] <= r[0] <= rate["to_s"]]
    steps = inside[-1][1] - inside[0][1]
    assert rate["steps_per_s"] == steps / (rate["to_s"] - rate["from_s"]) > 0
    assert result["lost_steps"] == 0
