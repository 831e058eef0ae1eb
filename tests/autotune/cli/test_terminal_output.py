"""What `autotune train` prints: the summary, progress with and without a terminal, the
status tables at 80 columns, and child processes' output around the live line."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_summary_says_when_more_was_trained_than_asked():
    """--steps is a minimum: the drain trains what is in flight, and the summary says so."""
    from rich.console import Console

    from autotune.cli.display import summary_table

    def rendered(trained: int, width: int = 200, **extra) -> str:
        result = {
            "env": "CartPole-v1",
            "env_steps": trained,
            "sampled_steps": trained,
            "discarded_steps": 0,
            "lost_steps": 0,
            "wall_s": 5.0,
            "steps_per_s": trained / 5.0,
            "energy": {"gpu_j": 0.0, "cpu_j": 100.0, "gpu_source": "none", "cpu_source": "model"},
            "steps_per_joule": trained / 100.0,
            "return_mean": 20.0,
            "policy_lag": {"mean": 1.0, "max": 2},
            "actor_restarts": 0,
            "trainer_device": "cpu",
            "stages": {},
            "config": {"steps": 4096},
            **extra,
        }
        console = Console(record=True, width=width)
        console.print(summary_table(result))
        return console.export_text()

    assert "8,960 (4,096 asked; what was in flight then was trained too)" in rendered(8960)
    # where the actors' time went, on one line at 80 columns
    spent = {"env_s": 3.2, "policy_s": 0.6, "cpu_s": 7.3, "cpu_us_per_step": 812.4}
    assert "envs 3 s, actions 1 s, 812 us CPU/step" in rendered(8960, 80, actor_time=spent)
    # a minibatch floor that split the batch into fewer is said, with what was asked
    split = {"asked": 32, "min_samples": 512, "at_batch": 8}
    assert "8 (32 asked; --min-minibatch 512)" in rendered(8960, 80, minibatches=split)
    assert "minibatches per epoch" not in rendered(8960, minibatches={**split, "at_batch": 32})
    # where the machine's CPU went, on one line at 80 columns
    cpu = {"actors": 458.0, "compressor": 21.4, "migrator": 18.9, "trainers": 30.2}
    cpu |= {"runner": 7.6, "cores": 16, "core_s": 960.0}
    shown = rendered(8960, 80, cpu_time=cpu)
    assert (
        "CPU s (of 960 core-s)" in shown and "actors 458, stages 40, trainers 30, runner 8" in shown
    )
    # the actors' waits on the learner, before its first batch and after (2 actors, 10 s)
    columns = ["t_s", "trained_steps", "gpu_j", "cpu_j", "actor_throttle_s"]
    rows = [[0.0, 0, 0.0, 0.0, 0.0], [2.0, 512, 1.0, 9.0, 3.0], [12.0, 8960, 9.0, 99.0, 3.4]]
    waited = rendered(
        8960, config={"steps": 4096, "actors": 2}, timeline={"columns": columns, "rows": rows}
    )
    assert "3 s before the first batch, 2.0% of their time after" in waited, waited
    assert "waiting on the learner" not in rendered(8960)  # no timeline, nothing said
    assert "asked" not in rendered(4096)
    # steps a trainer restart rolled back are named among the lost
    rolled = rendered(4096, lost_steps=900, rolled_back_steps=512)
    assert "0 / 900 (512 of them trained, then rolled back by a trainer restart)" in rolled
    assert "rolled back" not in rendered(4096, rolled_back_steps=0)


NOISY_ENV = """
import sys
import gymnasium as gym
import numpy as np

class Noisy(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)
    said = False

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        if not Noisy.said:
            Noisy.said = True
            print("noisy env: a line from an actor process", file=sys.stderr, flush=True)
        self.t += 1
        return np.zeros(3, np.float32), 1.0, False, self.t >= 50, {}

gym.register("Noisy-v0", entry_point="noisyenv:Noisy")
"""


@pytest.mark.slow
def test_child_output_goes_above_the_live_line_not_onto_it(tmp_path):
    """In a terminal, a line an actor process writes to stderr is printed on its own line
    above the live progress line (children write to the terminal directly otherwise, right
    after the live line's text)."""
    import os
    import pty
    import select

    (tmp_path / "noisyenv.py").write_text(NOISY_ENV)
    flags = ["--actors", "1", "--envs-per-actor", "2", "--batch-size", "1024"]
    flags += ["--trainer-device", "cpu", "--trainers", "1", "--steps", "8192"]
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "train", "--env", "noisyenv:Noisy-v0", *flags],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200", "TERM": "xterm"},
        cwd=tmp_path,
    )
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child side closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    assert proc.wait(timeout=240) == 0, out[-3000:]
    text = out.decode(errors="replace")
    line = "noisy env: a line from an actor process"
    assert line in text, text[-3000:]
    assert all(before.endswith(("\x1b[2K", "\n")) for before in text.split(line)[:-1]), text


def test_without_a_terminal_progress_is_a_plain_line_every_few_seconds(monkeypatch):
    """A log (CI, nohup) gets a progress line every PLAIN_EVERY_S, and the last state at the
    end, instead of nothing until the summary."""
    import io

    from rich.console import Console

    from autotune.cli import display
    from runtime.config import TrainConfig
    from runtime.run_state import RunState

    clock = [1000.0]
    monkeypatch.setattr(display.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    shown = display.ProgressDisplay(Console(file=out, width=200), TrainConfig(steps=10_000))
    assert shown.plain

    def state(t: float, steps: int, draining: bool = False) -> RunState:
        learner = {"noise_scale": 1234.5, "lr": 3e-4} if steps >= 7000 else {}
        return RunState(t, steps, steps, None, 0, 0.0, 0, 0, draining, **learner)

    with shown:
        shown.update(state(1.0, 1000))
        clock[0] += 1.0
        shown.update(state(2.0, 2000))  # too soon for a line of its own
        clock[0] += display.PLAIN_EVERY_S
        shown.update(state(7.0, 7000))
        clock[0] += 1.0
        shown.update(state(8.0, 10_000, draining=True))  # the last state: printed at the end
    lines = out.getvalue().splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["training", "1,000/10,000"],
        ["training", "7,000/10,000"],
        ["draining", "10,000/10,000"],
    ]
    assert "noise" not in lines[0]  # before the learner says
    assert "noise 1,234  lr 0.0003" in lines[1]  # the learner's noise scale and rate


def test_a_rollback_does_not_show_as_a_negative_rate(monkeypatch):
    """After a trainer restart rolls steps back, the learned count drops; the rate shown is the
    training's, counting what was rolled back, never negative."""
    import io

    from rich.console import Console

    from autotune.cli import display
    from runtime.config import TrainConfig
    from runtime.run_state import RunState

    clock = [1000.0]
    monkeypatch.setattr(display.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    shown = display.ProgressDisplay(Console(file=out, width=200), TrainConfig(steps=100_000))
    with shown:
        shown.update(RunState(1.0, 8000, 8000, None, 0, 0.0, 0, 0, False))
        clock[0] += display.PLAIN_EVERY_S
        rolled = RunState(2.0, 6000, 9000, None, 0, 0.0, 0, 0, False, rolled_back_steps=3000)
        shown.update(rolled)  # 8,000 learned, 3,000 of them rolled back, 1,000 trained since
    lines = out.getvalue().splitlines()
    assert "6,000/100,000 trained" in lines[1] and "1,000 steps/s" in lines[1], lines


def test_the_trial_table_never_splits_a_number_at_80_columns():
    """Too narrow for a column per knob, the knobs share one column that wraps between its
    name=value words; every figure stays whole."""
    from rich.console import Console

    from autotune.cli.status_view import trial_table

    values = {"actors": 15, "envs_per_actor": 64, "batch_size": 65536, "chunk_bytes": 262144}
    values |= {"trainers": 2, "mps_pct": 100, "trainer_device": "cuda", "trainer_threads": 4}
    row = {"number": 7, "state": "COMPLETE", "values": values, "note": "a note " * 6}
    row |= {"steps_per_s": 102456.0, "steps_per_joule": 111.5, "objective": 111.51}
    for width in (80, 200):
        console = Console(width=width, record=True)
        console.print(trial_table([row], sorted(values), 1, width))
        text = console.export_text()
        assert all(len(line) <= width for line in text.splitlines())
        for figure in ("102,456", "65536", "256K"):
            assert figure in text, (width, text)
