"""``max_wall_s`` is when a run ends, not when it begins to drain: the drain starts early
enough to train what can be in flight at the rate trained so far."""

from __future__ import annotations

import time

import pytest

from runtime.config import TrainConfig
from runtime.drain import DRAIN_EXIT_S, wall_due, wall_reserve_s


def test_the_reserve_is_the_in_flight_steps_at_the_rate_so_far_and_at_most_half_the_limit():
    cfg = TrainConfig(actors=2, envs_per_actor=8, rollout_len=32, batch_size=4096, max_wall_s=60)
    inflight = 2.0 * 4096 + 2 * 8 * 32  # the actors' budget (two batches) and a rollout each
    assert wall_reserve_s(cfg, 10_000, 1.0) == pytest.approx(inflight / 10_000 + DRAIN_EXIT_S)
    assert wall_reserve_s(cfg, 0, 5.0) == DRAIN_EXIT_S  # nothing trained yet: no rate to go by
    assert wall_reserve_s(cfg, 100, 10.0) == 30.0  # a crawl: half the limit, not more


def test_the_drain_is_due_once_the_time_left_is_the_reserve():
    cfg = TrainConfig(actors=1, envs_per_actor=1, rollout_len=32, batch_size=1024, max_wall_s=10)
    now = time.monotonic()
    reserve = wall_reserve_s(cfg, 20_000, 5.0)  # 2,080 steps in flight at 4,000/s, + 1 s
    assert not wall_due(cfg, since=now - (9.9 - reserve), started=now - 5.0, trained=20_000)
    assert wall_due(cfg, since=now - (10.0 - reserve), started=now - 5.0, trained=20_000)
    assert not wall_due(TrainConfig(), since=now - 1e6, started=now - 1e6, trained=1)
