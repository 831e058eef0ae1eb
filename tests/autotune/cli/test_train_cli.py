"""``autotune train`` as a user runs it: a subprocess with a tiny budget, JSON checked."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

TOP_KEYS = {
    "env",
    "env_steps",
    "sampled_steps",
    "discarded_steps",
    "lost_steps",
    "wall_s",
    "steps_per_s",
    "energy",
    "steps_per_joule",
    "return_mean",
    "policy_lag",
    "config",
    "stages",
}


def run_cli(tmp_path, *args: str) -> dict:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "train", "--quiet", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "steps per joule" in proc.stdout  # the summary table
    return json.loads(out.read_text())


def test_cartpole_json_has_the_documented_shape(tmp_path):
    r = run_cli(tmp_path, "--steps", "4096", "--actors", "1", "--envs-per-actor", "4")
    assert set(r) >= TOP_KEYS
    assert r["env"] == "CartPole-v1" and r["env_steps"] >= 4096
    assert r["sampled_steps"] == r["env_steps"] + r["discarded_steps"] + r["lost_steps"]
    assert set(r["energy"]) >= {"gpu_j", "cpu_j", "gpu_source", "cpu_source"}
    assert r["energy"]["gpu_source"] in ("nvml", "nvml-power-polling", "none")
    assert r["energy"]["cpu_source"] in ("rapl", "model")
    assert r["steps_per_joule"] is None or r["steps_per_joule"] > 0
    assert set(r["policy_lag"]) == {"mean", "max"}
    assert set(r["stages"]) == {"dispenser", "compressor", "migrator", "batcher"}
    assert all(s["messages"] > 0 and s["bytes"] > 0 for s in r["stages"].values())
    assert r["config"]["actors"] == 1


def test_pendulum_continuous_control_smoke(tmp_path):
    r = run_cli(
        tmp_path,
        "--env",
        "Pendulum-v1",
        "--steps",
        "8192",
        "--actors",
        "1",
        "--reward-scale",
        "0.1",
    )
    assert r["env_steps"] >= 8192 and r["lost_steps"] == 0
    assert r["return_mean"] is not None and math.isfinite(r["return_mean"])
    assert r["config"]["learner"]["reward_scale"] == 0.1


def test_python_api_example_runs(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "train_api.py"),
            "--env",
            "CartPole-v1",
            "--steps",
            "3000",
            "--actors",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert summary["env_steps"] >= 3000 and summary["lost_steps"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mps-pct", "half"], "comma-separated list of integers"),
        (["--mps-change", "soon:50"], "SECONDS:P"),
        (["--mps-change", "10"], "SECONDS:P"),
        (["--trainer-device", "cpu", "--mps-pct", "50"], "trainer device is cpu"),
        (["--trainers", "2", "--mps-pct", "50,50,50"], "3 values for 2 GMIs"),
        (["--grad-sync", "ring"], "invalid choice"),
        (["--inference", "gpu"], "invalid choice"),
        (["--inference-mps-pct", "50"], "applies only with inference='gmi'"),
        (["--inference", "gmi", "--inference-mps-pct", "101"], "integer in 1..100"),
    ],
)
def test_bad_gmi_flags_are_refused_with_what_is_allowed(args, message, capsys):
    from autotune.cli.main import main

    try:
        rc = main(["train", "--quiet", *args])
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()), err


def test_auto_sizing_is_stored_explicit_flags_win_and_probes_are_cached(tmp_path):
    """The defaults size the run from probes; the second run reads them from the cache."""
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "cache")}

    def train(name: str, *args: str) -> tuple[dict, str]:
        out = tmp_path / f"{name}.json"
        cmd = [sys.executable, "-m", "autotune.cli", "train", "--quiet", "--json", str(out)]
        proc = subprocess.run(
            [*cmd, "--steps", "4096", *args], capture_output=True, text=True, timeout=240, env=env
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(out.read_text()), proc.stderr

    first, said = train("first")
    sizing = first["sizing"]
    assert "sizing: actors=" in said and "probes " in said and "cached" not in said
    assert set(sizing["auto"]) >= {"actors", "envs_per_actor", "batch_size", "trainer_device"}
    for field in ("actors", "envs_per_actor", "batch_size", "trainer_device"):
        assert first["config"][field] == sizing["chosen"][field], field
    assert sizing["probes"]["env_step_s"] > 0 and not sizing["probes"]["cached"]
    assert sizing["values"]["batch_size"] == 512  # 4096 steps: the smallest batch (64 updates)
    assert len(list((tmp_path / "cache" / "probes").glob("*.json"))) == 1

    second, said = train("second", "--actors", "2")
    assert second["config"]["actors"] == 2 and "actors" not in second["sizing"]["auto"]
    assert second["sizing"]["probes"]["cached"] and "probes cached" in said
    assert second["sizing"]["probes"]["env_step_s"] == sizing["probes"]["env_step_s"]

    third, _ = train("third", "--reprobe", "--batch-size", "512")
    assert not third["sizing"]["probes"]["cached"] and third["config"]["batch_size"] == 512


def test_which_flags_are_sized_with_and_without_a_config_file(tmp_path):
    """Without --config every sizing flag left at its default is auto; with one, only those
    given `auto` on the command line (the file's values stand); a tuned run's --knob narrows
    the sized values."""
    from autotune.cli.auto_flags import tuned_space
    from autotune.cli.main import parse_args as parse
    from autotune.cli.train_config import AUTO, auto_fields

    assert auto_fields(parse(["train"])) == set(AUTO)
    assert auto_fields(parse(["train", "--actors", "3"])) == set(AUTO) - {"actors"}
    # a CPU trainer has no GPU share: with every other field given, nothing is sized
    given = ["--actors", "1", "--envs-per-actor", "4", "--batch-size", "1024", "--trainers", "1"]
    assert auto_fields(parse(["train", *given, "--trainer-device", "cpu"])) == set()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"env": "CartPole-v1", "actors": 2}))
    assert auto_fields(parse(["train", "--config", str(cfg)])) == set()
    with_auto = parse(["train", "--config", str(cfg), "--batch-size", "auto"])
    assert auto_fields(with_auto) == {"batch_size"}
    tuned = parse(["train", "--tune", "--knob", "actors=1..2", "--knob", "batch_size=512,1024"])
    assert tuned_space(tuned) == {"actors": (1, 2), "batch_size": (512, 1024)}
    assert tuned_space(parse(["train", "--knob", "actors=1..2"])) is None  # not tuning


def test_the_summary_says_when_more_was_trained_than_asked():
    """--steps is a minimum: the drain trains what is in flight, and the summary says so."""
    from rich.console import Console

    from autotune.cli.display import summary_table

    def rendered(trained: int) -> str:
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
        }
        console = Console(record=True, width=200)
        console.print(summary_table(result))
        return console.export_text()

    assert "8,960 (4,096 asked; what was in flight then was trained too)" in rendered(8960)
    assert "asked" not in rendered(4096)


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
        return RunState(t, steps, steps, None, 0, 0.0, 0, 0, draining)

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


WALK_ENV = """
import gymnasium as gym
import numpy as np

class Walk(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(3, np.float32), float(action), False, self.t >= 20, {}

gym.register("Walk-v0", entry_point=Walk)
"""


@pytest.mark.parametrize("how", ["--env-module", "module:id"])
def test_a_custom_env_module_trains_from_the_current_directory(tmp_path, how):
    """A module in the current directory that registers an env: imported in every process
    (the actors' too) with no PYTHONPATH set; one that fails to import says why, in its
    own words, with its file and line."""
    import os

    (tmp_path / "walk_envs.py").write_text(WALK_ENV)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOTUNE_ENV_MODULES")}
    which = ["--env-module", "walk_envs", "--env", "Walk-v0"]
    which = which if how == "--env-module" else ["--env", "walk_envs:Walk-v0"]
    flags = ["--actors", "1", "--envs-per-actor", "2", "--batch-size", "512"]
    flags += ["--trainer-device", "cpu", "--trainers", "1", "--steps", "2048"]
    cmd = [sys.executable, "-m", "autotune.cli", "train", "--quiet", "--json", "r.json"]
    proc = subprocess.run(
        [*cmd, *which, *flags], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["env_steps"] >= 2048 and r["lost_steps"] == 0 and r["return_mean"] > 0
    if how == "--env-module":
        assert r["config"]["env_modules"] == ["walk_envs"]
        (tmp_path / "broken_envs.py").write_text("x = 1\nraise ValueError('no such setting')\n")
        bad = ["--env-module", "broken_envs", "--env", "Walk-v0"]
        proc = subprocess.run(
            [*cmd, *bad, *flags], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        said = " ".join(proc.stderr.split())
        assert proc.returncode == 2 and "ValueError: no such setting" in said, proc.stderr
        assert "broken_envs.py, line 2" in said and "mujoco" not in said.lower()
