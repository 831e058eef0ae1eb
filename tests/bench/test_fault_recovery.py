"""The fault benchmark's arithmetic: trained steps after a fault against the unfaulted run's
over the same span of its own timeline."""

from __future__ import annotations

import pytest

from bench.fault_recovery import compare, steps_between, table


def test_a_fault_is_compared_with_the_unfaulted_run_over_the_same_span():
    base = {"timeline": [[0.0, 0], [10.0, 1000], [20.0, 3000], [30.0, 5000]]}
    assert steps_between(base["timeline"], 15.0, 30.0) == pytest.approx(3000.0)
    faulted = {
        "kill_s": 15.0,
        "end_s": 30.0,
        "steps_at_kill": 2000,
        "trained": 4400,
        "recovery_s": 1.5,
        "lost": 64,
        "exact": True,
    }
    (row,) = compare({"none": base, "compressor": faulted, "never": {"kill_s": None}})
    assert row["role"] == "compressor" and row["after"] == 2400
    assert row["ratio"] == pytest.approx(0.8)
    text = table([row])
    assert "| compressor | 15.0 | 2,400 | 3,000 | 0.80 | 1.5 | 64 | yes |" in text
