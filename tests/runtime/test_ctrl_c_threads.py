"""Only a run's main thread takes a Ctrl-C. While its children start, the runner's process
ignores SIGINT (``runtime.child_start``); a Ctrl-C the kernel handed to another thread then
would be discarded, and the run would train on as if none had come."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from conftest import wait_until

from runtime.child_start import ctrl_c_for_main_only, without_ctrl_c


def _sigint_blocked(status: str) -> bool:
    mask = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(mask.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def test_a_thread_started_without_ctrl_c_blocks_it_and_the_starter_is_as_before():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen: list[set] = []
    thread = threading.Thread(
        target=lambda: seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    )
    without_ctrl_c(thread).join(10)
    assert signal.SIGINT in seen[0]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    with ctrl_c_for_main_only():
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_every_thread_of_a_training_cli_but_its_main_one_blocks_sigint(tmp_path):
    """Checked on a run that trains (its weights forwarder, numpy's BLAS threads, libzmq's
    threads all up), then a Ctrl-C drains it."""
    out, progress = tmp_path / "r.json", tmp_path / "p.jsonl"
    proc = subprocess.Popen(
        [
            *[sys.executable, "-m", "autotune.cli", "train", "--steps", "10000000", "--quiet"],
            *["--actors", "1", "--envs-per-actor", "4", "--batch-size", "512"],
            *["--trainer-device", "cpu", "--trainers", "1", "--json", str(out)],
            *["--progress", str(progress)],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def trained() -> bool:
        lines = progress.read_text().splitlines() if progress.exists() else []
        return any(json.loads(line)["steps"] > 0 for line in lines)

    try:
        wait_until(trained, proc, what="a trained batch")
        tasks = {}
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                status = Path(f"/proc/{proc.pid}/task/{tid}/status").read_text()
                tasks[int(tid)] = _sigint_blocked(status)
            except OSError:  # a thread that ended meanwhile
                continue
        assert tasks.pop(proc.pid) is False  # the main thread takes it
        assert tasks and all(tasks.values()), tasks
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]
    assert json.loads(out.read_text())["interrupted"] is True


HELD = """
import multiprocessing as mp, signal
from runtime.child_start import ctrl_c_held

if __name__ == "__main__":
    with ctrl_c_held():
        proc = mp.get_context("spawn").Process(target=print)  # the first: the tracker starts
        proc.start()
        print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    proc.join()
"""


def test_sigint_stays_blocked_through_a_processs_first_child_start(tmp_path):
    """A first spawned child launches multiprocessing's resource tracker, which unblocks SIGINT
    in the starting thread as it goes: with SIGINT ignored meanwhile, a Ctrl-C then was lost."""
    script = tmp_path / "held.py"
    script.write_text(HELD)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "True"
