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


ANT_DIP = [  # (episodes, mean return of the last 100, updates of 4,096 steps): a real run's
    (131, -36.7, 1),  # first seconds (Ant-v5, 15 actors x 8 envs, an H200 host)
    (516, -63.6, 9),
    (948, -43.0, 13),
    (1239, -41.3, 20),
    (1465, -53.8, 27),
    (1771, -90.6, 34),
    (2073, -100.8, 42),
    (2324, -69.8, 50),
    (2615, -46.0, 58),
    (2860, -33.4, 65),
    (3400, 88.0, 108),
]


def test_a_real_early_dip_over_many_short_episodes_is_not_reported():
    """Episodes alone called this dip a divergence (below the floor from 1,771 episodes on,
    still below 300 episodes later); the learner's updates say it did not last."""
    watch = DivergenceWatch(act_dim=8)
    for episodes, mean, updates in ANT_DIP:
        watch.check(episodes, mean, None, updates)
    assert watch.found is None
    episodes_only = DivergenceWatch(act_dim=8)
    for episodes, mean, _ in ANT_DIP:
        episodes_only.check(episodes, mean, None)
    assert episodes_only.found is not None  # as before the updates were counted


def test_a_dip_within_the_first_episodes_spread_is_not_reported_a_collapse_is():
    """Ant-v5's first episodes return about -25 with a spread of about 35: a learning policy's
    mean at -50 for many updates is a dip, not a divergence (half the mean's size called it
    one); a fall by hundreds is reported, spread or not."""
    for fallen, reported in ((-50.0, False), (-400.0, True)):
        watch = DivergenceWatch(act_dim=8)
        watch.check(131, -25.0, None, 1, spread=35.0)
        for update in range(2, 60):
            watch.check(131 + 300 * update, fallen, None, update, spread=35.0)
        assert (watch.found is not None) is reported, fallen
    assert watch.first_spread == 35.0  # read once, where the starting level was taken


def test_the_telemetry_gives_the_watch_the_first_episodes_spread():
    tel = RunTelemetry(act_dim=2)
    returns = [-25.0 + 35.0 * (1 if i % 2 else -1) for i in range(FIRST_EPISODES)]  # std 35
    counters = {"episodes": [[r, 50] for r in returns]}
    tel.handle(wire.Message(wire.MsgType.STATS, {"src": "actor-0", "c": counters}))
    assert tel.divergence.first_return == -25.0
    assert math.isclose(tel.divergence.first_spread, 35.0)


def test_a_fall_that_outlasts_as_many_updates_again_is_reported():
    watch = DivergenceWatch(act_dim=8)
    for update in range(40):  # 300 episodes per update; below from update 1 on
        watch.check(131 + 300 * update, -37.0 if update == 0 else -90.0, None, update)
    assert watch.found is not None and watch.found["sign"] == "return"
    assert watch.found["episodes"] == 131 + 300 * 11  # first below at 1: 10 updates more


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


def test_the_telemetry_counts_a_drop_in_the_lead_trainers_updates():
    tel = RunTelemetry(act_dim=2)

    def stats(src: str, counters: dict) -> wire.Message:
        return wire.Message(wire.MsgType.STATS, {"src": src, "c": counters})

    def episodes(mean: float, n: int) -> dict:
        return {"episodes": [[mean, 50]] * n}

    tel.handle(stats("trainer-0.g0", {"trained_steps": 4096, "version": 1}))
    tel.handle(stats("actor-0", episodes(-37.0, FIRST_EPISODES)))
    tel.handle(stats("actor-0", episodes(-90.0, AFTER_EPISODES + FIRST_EPISODES)))
    assert tel.divergence.below_updates == 1 and tel.divergence.found is None
    tel.handle(stats("trainer-0.g0", {"trained_steps": 40960, "version": 10}))
    tel.handle(stats("actor-0", episodes(-90.0, FIRST_EPISODES)))
    assert tel.divergence.found is None  # 100 episodes later, but 9 updates: not yet
    tel.handle(stats("trainer-0.g0", {"trained_steps": 45056, "version": 11}))
    assert tel.divergence.found["sign"] == "return"
