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


def test_ctrl_c_ends_the_stepping_processes_with_a_line_not_their_tracebacks(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the stepping processes leave it
    to the parent, which ends them and says no rate was measured (exit 130)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from autotune.workflows.progress_log import read_progress

    progress = tmp_path / "p.jsonl"
    cmd = [sys.executable, "-m", "bench.raw_env_rate", "--env", "CartPole-v1"]
    cmd += ["--processes", "2", "--seconds", "300", "--progress", str(progress)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job is
        restore_signals=True,
    )
    deadline = time.monotonic() + 120
    while not (progress.exists() and any(r["steps"] > 0 for r in read_progress(progress))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "no rate measured" in err and "Traceback" not in err, err[-2000:]
    assert out == ""
