"""``bench.thread_sched``: per-thread CPU and waits of a command's processes over a window."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from bench.thread_sched import main, snapshot, window_split

pytestmark = pytest.mark.skipif(
    not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"),
    reason="the kernel keeps no per-thread schedstat here",
)


def test_a_busy_thread_counts_as_other_and_its_cpu_falls_in_the_window():
    go, done, spun = threading.Event(), threading.Event(), []

    def spin() -> None:
        go.wait()
        start = time.thread_time()
        while time.thread_time() - start < 0.3:  # 0.3 s of this thread's own CPU
            pass
        spun.append(True)
        done.wait()

    worker = threading.Thread(target=spin)
    worker.start()
    before, t0 = snapshot(os.getpid()), time.monotonic()
    go.set()
    while not spun:
        time.sleep(0.01)
    after, seconds = snapshot(os.getpid()), time.monotonic() - t0
    done.set()
    worker.join()
    groups = window_split(before, after, seconds, steps=1000)
    assert groups["command/main"]["threads"] == 1
    other = groups["command/other"]
    assert other["threads"] >= 1  # the spinning thread, and any pool an import started
    assert 0.29 <= other["cpu_us_per_step"] * 1000 / 1e6 <= 0.5, other
    assert other["cores"] > 0


def test_a_raw_stepping_command_is_split_by_role(tmp_path, capsys):
    out = tmp_path / "raw.json"
    cmd = [sys.executable, "-m", "bench.raw_env_rate", "--env", "CartPole-v1"]
    cmd += ["--processes", "1", "--envs-per-process", "4", "--seconds", "120"]
    assert main(["--window-s", "1.5", "--warmup-s", "0.5", "--json", str(out), "--", *cmd]) == 0
    doc = __import__("json").loads(out.read_text())
    assert doc["steps"] > 0 and doc["steps_per_s"] > 0
    worker = doc["groups"]["worker/main"]  # the stepping process (multiprocessing's child)
    assert worker["threads"] == 1 and worker["cores"] > 0.05
    assert worker["cpu_us_per_step"] > 0
    assert "| worker/main |" in capsys.readouterr().out


def test_no_command_is_refused():
    with pytest.raises(SystemExit):
        main(["--window-s", "1"])
