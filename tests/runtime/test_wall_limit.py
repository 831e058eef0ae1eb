"""``max_wall_s`` is when a run ends, not when it begins to drain: the drain starts early
enough to train what can be in flight at the rate trained since the first trained step."""

from __future__ import annotations

import dataclasses
import time

import pytest

from runtime.config import TrainConfig
from runtime.drain import DRAIN_EXIT_S, SETTLE_S, TrainedRate, wall_due, wall_reserve_s


def test_the_reserve_is_the_in_flight_steps_at_the_rate_and_at_most_half_the_limit():
    cfg = TrainConfig(actors=2, envs_per_actor=8, rollout_len=32, batch_size=4096, max_wall_s=60)
    inflight = 2.0 * 4096 + 2 * 8 * 32  # the actors' budget (two batches) and a rollout each
    assert wall_reserve_s(cfg, 10_000.0) == pytest.approx(inflight / 10_000 + DRAIN_EXIT_S)
    assert wall_reserve_s(cfg, 0.0) == DRAIN_EXIT_S  # no rate known yet
    assert wall_reserve_s(cfg, 10.0) == 30.0  # a crawl: half the limit, not more


def test_the_rate_leaves_out_the_start_up_before_the_first_trained_step():
    pace = TrainedRate()
    assert pace.observe(0, started=0.0, now=5.0) == 0.0  # nothing trained
    assert pace.observe(16_384, started=0.0, now=12.5) == 0.0  # one count: no rate to go by yet
    assert pace.observe(16_384, started=0.0, now=12.9) == 0.0  # the same count again
    # two more batches 1.2 s later: 27.3k/s, where counting from the start would say 3.9k/s
    assert pace.observe(49_152, started=0.0, now=13.7) == pytest.approx(32_768 / 1.2)
    assert pace.observe(65_536, started=0.0, now=14.3) == pytest.approx(49_152 / 1.8)


def test_a_learner_too_slow_for_a_second_batch_falls_back_on_the_start_up_rate():
    """A CPU learner that takes a minute per 65,536-sample update: 5 s after its first batch
    with no second one, the reserve goes by the rate from the run's start, so the run drains
    instead of waiting for a batch it cannot train before the limit."""
    cfg = TrainConfig(actors=2, envs_per_actor=8, rollout_len=32, batch_size=65_536)
    cfg = dataclasses.replace(cfg, max_wall_s=75.0)
    pace = TrainedRate()
    start = time.monotonic() - 60.0
    assert pace.observe(65_536, started=start, now=start + 60.0) == 0.0
    assert pace.observe(65_536, started=start, now=start + 60.0 + SETTLE_S - 0.1) == 0.0
    late = start + 60.0 + SETTLE_S
    rate = pace.observe(65_536, started=start, now=late)
    assert rate == pytest.approx(65_536 / (60.0 + SETTLE_S))
    assert wall_reserve_s(cfg, rate) == 37.5  # its cap, half the limit: due now
    assert wall_due(cfg, since=time.monotonic() - (60.0 + SETTLE_S), rate=rate)


def test_a_first_batch_after_a_long_start_up_does_not_start_the_drain():
    """A 75-s run whose probes and start-up took 46 s, and whose first 16,384-step batch
    landed then: counted from the start, its rate would reserve 37.5 s and drain at once."""
    cfg = TrainConfig(
        actors=15, envs_per_actor=32, rollout_len=32, batch_size=16_384, max_wall_s=75.0
    )
    now = time.monotonic()
    pace = TrainedRate()
    started = now - 12.5  # the runtime began 12.5 s before its first batch
    assert not wall_due(cfg, since=now - 46.5, rate=pace.observe(16_384, started, now=now))
    rate = pace.observe(16_384 * 3, started, now=now + 1.2)  # 27.3k/s: 48k in flight take 1.8 s
    assert not wall_due(cfg, since=now - 46.5, rate=rate)
    assert wall_due(cfg, since=now - 75.0 + wall_reserve_s(cfg, rate) - 0.01, rate=rate)


def test_the_drain_is_due_once_the_time_left_is_the_reserve():
    cfg = TrainConfig(actors=1, envs_per_actor=1, rollout_len=32, batch_size=1024, max_wall_s=10)
    now = time.monotonic()
    reserve = wall_reserve_s(cfg, 4_000.0)  # 2,080 steps in flight at 4,000/s, + 1 s
    assert not wall_due(cfg, since=now - (9.9 - reserve), rate=4_000.0)
    assert wall_due(cfg, since=now - (10.0 - reserve), rate=4_000.0)
    assert not wall_due(TrainConfig(), since=now - 1e6, rate=1.0)
