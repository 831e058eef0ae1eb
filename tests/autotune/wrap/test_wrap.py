"""``autotune wrap`` with a real script in a subprocess: knobs in, reports out, energy of its
process tree, and crashes, hangs and silent scripts failed with the best config kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc
from conftest import wait_until

from autotune import client
from autotune.tuning.knobs import KnobError
from autotune.wrap.wrapper import parse_knob, substitute

SCRIPT = """
import os, sys, time
from autotune import client
k = client.knobs({"num_envs": 1, "mode": "ok"})
env = os.environ["AUTOTUNE_NUM_ENVS"]
print(f"script says: num_envs={k['num_envs']} flag={sys.argv[1:]} env={env}")
if k["mode"] == "crash":
    sys.exit(3)
steps = 0
for i in range(4):
    x = sum(j * j for j in range(20000))        # some CPU work
    steps += 1000 * k["num_envs"]
    if k["mode"] != "silent":
        client.report(steps=steps)
    if k["mode"] == "hang" and i == 1:
        time.sleep(60)
    time.sleep(0.1)
if k["mode"] == "silent":
    time.sleep(60)
"""


def _wrap(tmp_path, *args, timeout=180, script_cmd=None):
    """``autotune wrap ARGS -- SCRIPT_CMD`` (default: ``SCRIPT`` with ``--envs={num_envs}``)."""
    if script_cmd is None:
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        script_cmd = [sys.executable, str(script), "--envs={num_envs}"]
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli",
        "wrap",
        "--storage",
        f"sqlite:///{tmp_path}/w.db",
        "--json",
        str(tmp_path / "w.json"),
        *args,
        "--",
        *script_cmd,
    ]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_restart_mode_tunes_a_real_script_and_keeps_its_output(tmp_path):
    out = _wrap(tmp_path, "--knob", "num_envs=1..4", "--knob", "mode=ok", "--trials", "5")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "w.json").read_text())
    assert len(doc["trials"]) == 5
    for row in doc["trials"]:
        n = row["values"]["num_envs"]
        assert row["error"] is None and row["steps"] == 4000 * n and row["unit"] == "steps"
        assert row["cpu_j"] > 0 and row["objective"] > 0
        # the script saw its knobs through the client, the environment and its arguments
        assert f"script says: num_envs={n} flag=['--envs={n}'] env={n}" in out.stdout
    assert doc["best"]["values"]["mode"] == "ok"


@pytest.mark.parametrize(
    ("mode", "flags", "error"),
    [
        ("crash", [], "exited with code 3"),
        ("hang", ["--report-timeout-s", "2"], "hung: no report for 2 s after"),
        ("silent", ["--trial-s", "3"], "ran past --trial-s 3 without reporting a step"),
    ],
)
def test_a_failing_script_fails_its_trial_and_the_best_is_kept(tmp_path, mode, flags, error):
    ok = _wrap(
        tmp_path, "--knob", "num_envs=2", "--knob", "mode=ok", "--trials", "1", "--study", "s"
    )
    assert ok.returncode == 0, ok.stderr
    bad = _wrap(
        tmp_path,
        "--knob",
        "num_envs=2",
        "--knob",
        f"mode={mode}",
        "--trials",
        "1",
        "--study",
        "s",
        "--resume",  # the same study, with another knob value: said to go on
        *flags,
    )
    assert bad.returncode == 0, bad.stderr  # the best so far (the ok trial) is still there
    assert error in " ".join(bad.stderr.split())
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["trials"][0]["error"].startswith(error.split(":")[0])
    assert doc["best"]["values"] == {"num_envs": 2, "mode": "ok"}
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/w.db")
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL"]


def test_knob_specs_and_placeholders():
    assert parse_knob("num_envs=2..5").choices == (2, 3, 4, 5)
    assert parse_knob("device=cpu,cuda").choices == ("cpu", "cuda")
    assert parse_knob("lr=0.001,0.0003").choices == (0.001, 0.0003)
    for bad, why in (
        ("n=5..2", "above HIGH"),
        ("n=1..1000", "spans 1000 integers"),
        ("2n=1", "Python identifier"),
        ("n=a..b", "takes integers"),
        ("n=", "expected NAME"),
        ("knobs=1,2", "AUTOTUNE_KNOBS is autotune's own variable"),
        ("Trial=1,2", "AUTOTUNE_TRIAL is autotune's own variable"),
    ):
        with pytest.raises(KnobError, match=why):
            parse_knob(bad)
    assert substitute(["--n={n}", "{other}", "{{n}}"], {"n": 4}) == ["--n=4", "{other}", "{4}"]


def test_the_client_is_harmless_outside_wrap(monkeypatch):
    from autotune.control import client as client_state  # the module behind autotune.client

    monkeypatch.delenv(client.ENV_ENDPOINT, raising=False)
    monkeypatch.delenv(client.ENV_KNOBS, raising=False)
    monkeypatch.setattr(client_state, "_defaults", {})
    assert client.knobs({"a": 1}) == {"a": 1}
    client.report(steps=5)
    assert client.poll() is None
    monkeypatch.setenv(client.ENV_KNOBS, '{"a": 2}')
    assert client.knobs({"a": 1, "b": 3}) == {"a": 2, "b": 3}
    assert client.knobs() == {"a": 2, "b": 3}  # the defaults are remembered
    monkeypatch.setenv(client.ENV_KNOBS, "[1]")
    with pytest.raises(ValueError, match="AUTOTUNE_KNOBS must be a JSON object"):
        client.knobs()


def test_bad_wrap_input_is_refused(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "wrap",
            "--knob",
            "n=1..2",
            "--storage",
            f"sqlite:///{tmp_path}/x.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "no command to wrap" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "wrap", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "give at least one --knob" in out.stderr


LIVE = """
import os, sys, time
from autotune import client
k = client.knobs({"num_envs": 1})
poll = "nopoll" not in sys.argv
if "slowstart" in sys.argv:  # imports, CUDA, envs: seconds before its first message
    time.sleep(6)
    if "earlyreport" in sys.argv:  # its first message a report; its first poll follows it
        client.report(steps=0)
stop = sys.argv[1]  # seconds to run, or a file whose existence ends the run
steps, t_end = 0, time.time() + float(stop) if stop.isdigit() else float("inf")
while time.time() < t_end and not os.path.exists(stop):
    if poll and client.poll():
        k = client.knobs()
        print("applied", k["num_envs"], flush=True)
    x = sum(j * j for j in range(3000))
    steps += 10 * k["num_envs"]
    client.report(steps=steps)
    time.sleep(0.01)
if "fail" in sys.argv:
    sys.exit(3)
"""


def test_live_mode_changes_knobs_while_the_script_runs(tmp_path):
    """The script runs until the study holds three measured trials (then the test ends it),
    however long a loaded machine takes to measure them."""
    script, stop = tmp_path / "live.py", tmp_path / "stop"
    script.write_text(LIVE)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "wrap",
            "--mode",
            "live",
            "--knob",
            "num_envs=1..4",
            "--trials",
            "4",
            "--window-s",
            "1",
            "--warmup-s",
            "0.2",
            "--storage",
            f"sqlite:///{tmp_path}/l.db",
            "--json",
            str(tmp_path / "l.json"),
            "--export",
            str(tmp_path / "export.json"),
            "--",
            sys.executable,
            str(script),
            str(stop),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def complete() -> int:
        try:
            study = optuna.load_study(study_name="wrap-live", storage=f"sqlite:///{tmp_path}/l.db")
        except (KeyError, sqlalchemy.exc.SQLAlchemyError):  # not created yet, or being created
            return 0  # (two first openers of a new SQLite file race to write its schema version)
        return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)

    wait_until(lambda: complete() >= 3, proc, what="three measured trials")
    stop.touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    doc = json.loads((tmp_path / "l.json").read_text())
    assert doc["returncode"] == 0 and doc["trials"] >= 3
    applied = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("applied")]
    assert len(set(applied)) >= 2  # the script took different knobs without restarting
    measured = [w for w in doc["windows"] if w["state"] == "trial"]
    assert measured and all(w["steps_per_s"] > 0 and w["cpu_j"] > 0 for w in measured)
    # more envs -> more steps per loop: the best has more than one env
    assert doc["best"]["values"]["num_envs"] > 1
    # exported when it ended: the knob values, in steps (live mode measures reported steps)
    export = json.loads((tmp_path / "export.json").read_text())
    assert export["kind"] == "wrap" and export["unit"] == "steps"
    assert export["recommended"]["values"]["num_envs"] in range(1, 5)
    assert export["evidence"]["recommended"]["steps_per_joule"]["median"] > 0
    # each measured trial records the command it ran, as a restart-mode trial does
    study = optuna.load_study(study_name="wrap-live", storage=f"sqlite:///{tmp_path}/l.db")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(
        t.user_attrs["cmd"] == [sys.executable, str(script), str(stop)] for t in done
    )


def test_live_mode_refuses_a_script_that_never_polls(tmp_path):
    script = tmp_path / "live.py"
    script.write_text(LIVE)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "wrap",
            "--mode",
            "live",
            "--knob",
            "num_envs=1..2",
            "--report-timeout-s",
            "4",
            "--storage",
            f"sqlite:///{tmp_path}/n.db",
            "--",
            sys.executable,
            str(script),
            "30",
            "nopoll",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 2
    assert "has not called autotune.client.poll() for 4 s" in out.stderr
    assert "use --mode restart" in out.stderr
    # a start-up longer than --report-timeout-s is not a hang: that counts from a poll (4 s,
    # so a loaded machine's pause in the script's exit is not taken for one either)
    head = [*out.args[: out.args.index("--report-timeout-s")], "--report-timeout-s", "4"]
    db, run = f"sqlite:///{tmp_path}/s.db", [sys.executable, str(script), "1", "slowstart"]
    slow = subprocess.run(  # 6 s of start-up, a 4-s timeout, then 1 s of polling
        [*head, "--storage", db, "--", *run],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert slow.returncode in (0, 1) and "has not called" not in slow.stderr, slow.stderr
    assert "script exited with code 0" in " ".join(slow.stderr.split())
    # nor when its first message is a report: the timeout counts from the first message on
    run = [sys.executable, str(script), "1", "slowstart", "earlyreport"]
    early = subprocess.run(
        [*head, "--storage", db, "--resume", "--", *run],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert early.returncode in (0, 1) and "has not called" not in early.stderr, early.stderr
    # the script's own failure is the wrap's exit code
    run = [sys.executable, str(script), "1", "fail"]
    cmd = [*head, "--storage", db, "--resume", "--", *run]
    failed = subprocess.run(cmd, capture_output=True, timeout=60)
    assert failed.returncode == 3, failed.stderr


# holds its context for about 3 s, past several of the wrapper's once-a-second GPU checks (40
# bare matmuls take a tenth of a second on an H100: a check could miss them)
CUDA_SCRIPT = """
import time
import torch
from autotune import client
x = torch.randn(4096, 4096, device="cuda")
for i in range(40):
    y = x @ x
    torch.cuda.synchronize()
    client.report(steps=(i + 1) * 100)
    time.sleep(0.075)
"""


@pytest.mark.gpu
def test_the_gpu_a_wrapped_script_uses_is_measured(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from autotune.wrap.wrapper import Wrapper

    script = tmp_path / "cuda.py"
    script.write_text(CUDA_SCRIPT)
    wrapper = Wrapper([sys.executable, str(script)])
    try:
        run = wrapper.run_trial(0, {})
    finally:
        wrapper.close()
    assert run.error is None and run.steps == 4000
    assert 0 in run.gpus and run.gpu_j > 0


def test_the_sb3_example_runs_under_wrap(tmp_path):
    pytest.importorskip("stable_baselines3", reason="the sb3 extra: pip install -e '.[sb3]'")
    example = Path(__file__).resolve().parents[3] / "examples" / "sb3_ppo.py"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "wrap",
            "--knob",
            "num_envs=2",
            "--knob",
            "n_steps=64,128",
            "--trials",
            "2",
            "--storage",
            f"sqlite:///{tmp_path}/s.db",
            "--json",
            str(tmp_path / "s.json"),
            "--",
            sys.executable,
            str(example),
            "--total-steps",
            "2048",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [r["error"] for r in doc["trials"]] == [None, None]
    assert all(r["steps"] >= 2048 and r["unit"] == "steps" for r in doc["trials"])
