"""When a steps/J window may end (``autotune.tuning.windows``): not before its floor, not past
its ceiling, and in between once one batch more or less and the watts' spread move its
estimate by at most the target share."""

from __future__ import annotations

import pytest

from autotune.tuning.counters import Counters
from autotune.tuning.windows import WindowRule, half_width, window_done


def _readings(seconds: int, steps_per_s: int, batch: int, watts: float = 300.0, wobble=0.0):
    """One reading a second; trained steps arrive a whole batch at a time; the watts alternate
    by ``wobble`` around ``watts``."""
    out, joules = [], 0.0
    for t in range(seconds + 1):
        joules += (watts + (wobble if t % 2 else -wobble)) if t else 0.0
        steps = (t * steps_per_s) // batch * batch
        out.append(Counters(float(t), steps, 0.0, joules / 2, joules / 2))
    return out


def test_a_window_of_few_big_batches_waits_past_its_floor_until_it_holds_enough():
    """The lumps: on a CPU machine a 5-s window once held three 8,192-step batches and read
    4.5x the run's rate. At 5,000 steps/s such a window is far from 3 % at its floor; at 27
    batches or so the lumps alone come within it."""
    rule = WindowRule(floor_s=5.0, ceiling_s=120.0, target=0.03)
    lumpy = _readings(60, 5_000, 8_192)
    assert half_width(lumpy[:6], 8_192) > 0.1
    assert not window_done(rule, lumpy[:6], 8_192)  # past its floor, far from the target
    done = next(i for i in range(2, len(lumpy)) if window_done(rule, lumpy[:i], 8_192))
    steps = lumpy[done - 1].trained_steps
    # ended once one batch more or less moves the estimate by 1.96 B / (sqrt(6) S) <= 3 %
    assert 1.96 * 8_192 / (6**0.5 * steps) <= 0.03 < 1.96 * 8_192 / (6**0.5 * (steps - 8_192))
    # small batches at the same rate: done at the floor
    assert window_done(rule, _readings(5, 5_000, 256), 256)
    assert not window_done(rule, _readings(4, 5_000, 256), 256)  # never before the floor


def test_a_window_whose_watts_swing_waits_for_more_readings_and_the_ceiling_ends_any():
    rule = WindowRule(floor_s=5.0, ceiling_s=30.0, target=0.03)
    steady = _readings(6, 50_000, 256)
    swinging = _readings(6, 50_000, 256, wobble=150.0)
    assert window_done(rule, steady, 256)
    assert not window_done(rule, swinging, 256)  # the power's spread alone is over 3 %
    assert half_width(swinging, 256) == pytest.approx(half_width(swinging, 0), rel=0.05)
    never = _readings(40, 1_000, 65_536)  # one batch per 65 s: never precise
    assert not window_done(rule, never[:30], 65_536)
    assert window_done(rule, never[:31], 65_536)  # 30 s: the ceiling


def test_bad_window_rules_are_refused_with_what_is_allowed():
    assert "need 0 < floor <= ceiling" in WindowRule(floor_s=10, ceiling_s=5).problems()[0]
    assert "a share in (0, 1)" in WindowRule(target=1.5).problems()[0]
    assert WindowRule().problems() == []
