"""The backends suite's table: the raw rate read as the mean of before and after."""

from bench.suites.backends import table


def test_a_raw_rate_measured_again_is_the_mean_of_both_and_the_ratios_take_it():
    results = {
        "raw-Hopper-v5-envpool": {"steps_per_s": 100_000.0},
        "train-Hopper-v5-envpool": {"window_steps_per_s": 90_000.0, "whole_steps_per_s": 45_000.0},
        "again-Hopper-v5-envpool": {"steps_per_s": 80_000.0},
        "raw-Hopper-v5-gymnasium": {"steps_per_s": 60_000.0},
    }
    row = next(r for r in table(results).splitlines() if r.startswith("| Hopper-v5 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "60,000"  # measured once: the one figure
    assert cells[2] == "100,000 / 80,000"
    assert cells[3] == "90,000"  # the limit: the faster backend's mean
    assert cells[8] == "1.00 (0.50)"  # EnvPool's train over its mean raw rate


def test_a_backend_that_lacks_the_env_says_why_in_its_raw_cell():
    results = {
        "raw-Foo-v0-envpool": {"skipped": "not in EnvPool"},
        "raw-Foo-v0-gymnasium": {"steps_per_s": 1_000.0},
    }
    row = next(r for r in table(results).splitlines() if r.startswith("| Foo-v0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["1,000", "not in EnvPool", "1,000"]
