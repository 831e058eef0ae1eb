"""The divergence warning: a return that falls well below where it started and stays there,
or a policy std that runs away, is reported once, in the log and in the telemetry's result."""

from __future__ import annotations

import logging
import math

from runtime import wire
from runtime.divergence import AFTER_EPISODES, FIRST_EPISODES, GAUSSIAN_ENTROPY_0, DivergenceWatch
from runtime.telemetry import RunTelemetry


def feed(watch: DivergenceWatch, returns: list[float], entropy: float | None = None) -> None:
    """One check per episode; the mean is over the last 100 as the runner keeps it."""
    for n in range(1, len(returns) + 1):
        window = returns[max(0, n - 100) : n]
        watch.check(n, sum(window) / len(window), entropy)


def test_a_return_that_falls_well_below_its_start_and_stays_is_reported_once(caplog):
    start = [-3600.0] * FIRST_EPISODES
    falling = [-5600.0] * (AFTER_EPISODES + 2 * FIRST_EPISODES)
    watch = DivergenceWatch(act_dim=20)
    with caplog.at_level(logging.WARNING):
        feed(watch, start + falling)
    assert watch.found is not None and watch.found["sign"] == "return"
    assert watch.found["first_return"] == -3600.0 and watch.found["return_mean"] < -5400
    warned = [r for r in caplog.records if "may be diverging" in r.getMessage()]
    assert len(warned) == 1  # once


def test_learning_an_early_dip_and_noise_are_not_reported():
    learning = [-1200.0 + 5 * n for n in range(600)]  # Pendulum-like: it rises
    dip = [20.0] * 100 + [8.0] * 250 + [200.0] * 300  # below the floor, then recovers
    for returns in (learning, dip):
        watch = DivergenceWatch(act_dim=1)
        feed(watch, returns)
        assert watch.found is None, returns[:3]


def test_a_policy_std_that_runs_away_is_reported():
    watch = DivergenceWatch(act_dim=4)
    unit = 4 * GAUSSIAN_ENTROPY_0  # the entropy of a unit-std Gaussian in 4 dimensions
    watch.check(0, None, unit)
    watch.check(0, None, unit + 4 * math.log(3.0))  # three times wider: not yet
    assert watch.found is None
    watch.check(0, None, unit + 4 * math.log(12.0))
    assert watch.found["sign"] == "action_std"
    assert round(watch.found["first_std"], 6) == 1.0 and round(watch.found["std"], 6) == 12.0
    discrete = DivergenceWatch(act_dim=None)  # a categorical policy has no std to watch
    discrete.check(0, None, 1.0)
    discrete.check(0, None, 50.0)
    assert discrete.found is None


def test_the_telemetry_watches_the_episodes_and_the_learners_entropy():
    tel = RunTelemetry(act_dim=2)

    def stats(src: str, counters: dict) -> wire.Message:
        return wire.Message(wire.MsgType.STATS, {"src": src, "c": counters})

    tel.handle(stats("trainer-0.g0", {"trained_steps": 512, "entropy": 2 * GAUSSIAN_ENTROPY_0}))
    wide = 2 * (GAUSSIAN_ENTROPY_0 + math.log(20.0))
    tel.handle(stats("trainer-0.g0", {"trained_steps": 1024, "entropy": wide}))
    assert tel.divergence.found["sign"] == "action_std"
