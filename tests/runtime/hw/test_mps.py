"""MPS control: refusals where MPS is absent, and a real daemon where one can start."""

from __future__ import annotations

import pytest

from runtime.hw.gpus import sm_counts
from runtime.hw.mps import MPSControl, MPSUnavailable


def test_without_the_control_binary_start_says_why_and_state_is_shared(tmp_path):
    control = MPSControl(pipe_dir=str(tmp_path), binary=None)
    control.binary = None
    with pytest.raises(MPSUnavailable, match="not on PATH"):
        control.start()
    assert control.state().mode == "shared" and not control.state().running
    control.stop()  # stopping what was never started is a no-op


def test_a_control_binary_that_fails_is_reported_not_hidden(tmp_path):
    control = MPSControl(pipe_dir=str(tmp_path / "pipe"), binary="/bin/false")
    assert not control.running()
    with pytest.raises(MPSUnavailable, match="did not start the daemon"):
        control.start()
    assert not control.started_by_us


@pytest.mark.parametrize("pct", [0, 101, -5])
def test_client_percentage_outside_1_to_100_is_refused(pct):
    with pytest.raises(ValueError, match=r"allowed 1\.\.100"):
        MPSControl(binary=None).client_env(pct)


@pytest.mark.gpu
def test_real_daemon_grants_fewer_sms_to_a_quarter_client_and_is_stopped():
    full = sm_counts()
    assert full, "CUDA must see the GPU"
    control = MPSControl(pipe_dir="/nonexistent-autotune-test-pipe")
    try:
        state = control.start()
    except MPSUnavailable as exc:
        pytest.skip(f"MPS cannot start here: {exc}")
    try:
        assert state.running and state.started_by_us
        quarter = sm_counts(env=control.client_env(25))
        assert quarter and quarter[0] < full[0], (quarter, full)
    finally:
        control.stop()
    assert not control.running()
