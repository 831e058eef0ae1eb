"""The raw-stepping limit's processes: a rate from every process, and a failure, not a hang,
where a process cannot make its env."""

from __future__ import annotations

import pytest

from bench.raw_env_rate import raw_step_rate


def test_two_processes_step_cartpole_and_report_their_summed_rate():
    assert raw_step_rate("CartPole-v1", 2, 4, 0.5) > 100


def test_a_process_that_cannot_make_its_env_fails_the_measurement_instead_of_hanging():
    with pytest.raises(RuntimeError, match="raw stepping: a process exited 1"):
        raw_step_rate("NoSuchEnv-v0", 2, 4, 0.5)
