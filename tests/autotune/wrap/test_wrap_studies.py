"""A wrap study's identity and its first trial: a study made for another command or knobs is
refused unless resumed, and trial one runs the script's own defaults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from test_wrap import _wrap


def test_a_study_made_for_another_command_or_knobs_is_refused_unless_resumed(tmp_path):
    first = _wrap(tmp_path, "--knob", "num_envs=2", "--knob", "mode=ok", "--trials", "1")
    assert first.returncode == 0, first.stderr
    other = _wrap(tmp_path, "--knob", "num_envs=1..2", "--knob", "mode=ok", "--trials", "1")
    said = " ".join(other.stderr.split())
    assert other.returncode == 2, other.stderr
    assert "was made for another run (knobs: ['num_envs=2', 'mode=ok'] then," in said
    assert "give --resume to go on with it, or a new --study name" in said
    study = optuna.load_study(study_name="wrap-train", storage=f"sqlite:///{tmp_path}/w.db")
    assert len(study.trials) == 1  # nothing ran
    again = _wrap(
        tmp_path, "--knob", "num_envs=1..2", "--knob", "mode=ok", "--trials", "1", "--resume"
    )
    assert again.returncode == 0, again.stderr
    study = optuna.load_study(study_name="wrap-train", storage=f"sqlite:///{tmp_path}/w.db")
    assert study.user_attrs["wrap"]["knobs"] == ["num_envs=1..2", "mode=ok"]


def test_a_study_resumed_with_another_command_exports_the_command_its_best_config_ran(tmp_path):
    """Each trial records the command it ran. A study resumed with another command holds
    trials of both: the export says so, never pools one config's runs of two commands, and
    recommends the command the best config's trials ran, not whichever command the study was
    resumed with last."""
    from autotune.workflows.wrap_export import wrap_export_doc

    script = tmp_path / "train.py"
    # 16 envs: the best by 16x the steps of 1 env in the same time (timing noise on a loaded
    # machine had once made a 4-env trial, only 4x the better, lose to a 1-env one)
    first = _wrap(tmp_path, "--knob", "num_envs=16", "--trials", "1")
    assert first.returncode == 0, first.stderr
    other = [sys.executable, str(script), "--envs={num_envs}", "--other"]
    for envs in ("16", "1"):  # the same config again, and a worse one, under the other command
        again = _wrap(
            tmp_path, "--knob", f"num_envs={envs}", "--trials", "1", "--resume", script_cmd=other
        )
        assert again.returncode == 0, again.stderr
    study = optuna.load_study(study_name="wrap-train", storage=f"sqlite:///{tmp_path}/w.db")
    ran = [t.user_attrs["cmd"] for t in study.trials]
    assert ran == [[sys.executable, str(script), "--envs={num_envs}"], other, other]
    assert study.user_attrs["wrap"]["cmd"] == other  # the study's latest command
    doc = wrap_export_doc(study)
    assert doc["recommended"]["values"] == {"num_envs": 16}
    (number,) = doc["evidence"]["recommended"]["trials"]  # one command's run, not both
    best_ran = [a.replace("{num_envs}", "16") for a in ran[number]]
    assert doc["recommended"]["command"] == best_ran
    assert doc["evidence"]["trials"]["configs"] == 3  # (command, config) pairs
    assert sorted(map(tuple, doc["workload"]["commands"])) == sorted({tuple(c) for c in ran})
    assert "ran 2 commands" in doc["workload"]["note"]
    said = json.loads((tmp_path / "w.json").read_text())["best"]  # the wrap's own best agrees
    assert said["number"] in doc["evidence"]["recommended"]["trials"]
    assert said["values"] == doc["recommended"]["values"]


def test_a_study_resumed_with_another_objective_is_refused_even_with_resume(tmp_path):
    """Its values would sit beside the study's in other units: the wrap's best, the sampler
    and the export would compare steps/s with steps/J."""
    first = _wrap(tmp_path, "--knob", "num_envs=4", "--trials", "1", "--objective", "steps_per_s")
    assert first.returncode == 0, first.stderr
    other = _wrap(
        tmp_path,
        "--knob",
        "num_envs=1",
        "--trials",
        "1",
        "--resume",
        "--objective",
        "steps_per_joule",
    )
    said = " ".join(other.stderr.split())
    assert other.returncode == 2, other.stderr
    assert "holds steps_per_s values and this run's objective is steps_per_joule" in said
    assert "give --objective steps_per_s to go on with it, or a new --study name" in said
    study = optuna.load_study(study_name="wrap-train", storage=f"sqlite:///{tmp_path}/w.db")
    assert len(study.trials) == 1  # nothing ran


def test_trial_one_runs_the_scripts_own_defaults(tmp_path):
    out = _wrap(tmp_path, "--knob", "num_envs=1..4", "--default", "num_envs=3", "--trials", "2")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["trials"][0]["values"] == {"num_envs": 3}
    bad = _wrap(tmp_path, "--knob", "num_envs=1..4", "--default", "num_envs=9", "--study", "x")
    said = " ".join(bad.stderr.split())
    assert bad.returncode == 2 and "--default 'num_envs=9': 9 is not among [1, 2, 3, 4]" in said


FLAKY = """
import os, sys
from autotune import client
if not os.path.exists(sys.argv[1]):   # the first run fails (a busy machine, say)
    open(sys.argv[1], "w").close()
    sys.exit(5)
if sys.argv[2] == "always":
    sys.exit(6)
client.report(steps=100)
client.report(steps=200)
"""


def test_a_failed_config_is_tried_once_more_before_it_is_given_up(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)

    def wrap(study: str, how: str, trials: str):
        marker = tmp_path / f"{study}.ran"
        cmd = ["--knob", "x=1,2", "--default", "x=1", "--trials", trials, "--study", study]
        script_cmd = [sys.executable, str(script), str(marker), how]
        return _wrap(tmp_path, *cmd, script_cmd=script_cmd)

    once = wrap("once", "then-ok", "2")
    assert once.returncode == 0, once.stderr
    study = optuna.load_study(study_name="once", storage=f"sqlite:///{tmp_path}/w.db")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    assert [t.params for t in study.trials] == [{"x": 1}, {"x": 1}]  # the retry came next
    assert "it is tried once more" in " ".join(once.stderr.split())

    never = wrap("never", "always", "3")
    said = " ".join(never.stderr.split())
    assert never.returncode == 1 and "no trial completed" in said
    assert "failed 2x: exited with code 6" in said  # the reason, kept and shown
    study = optuna.load_study(study_name="never", storage=f"sqlite:///{tmp_path}/w.db")
    errors = [t.user_attrs.get("error") for t in study.trials if t.params == {"x": 1}]
    assert errors[:2] == ["exited with code 5", "exited with code 6"]
    # a third time it is not run: skipped, saying why
    skipped = [t for t in study.trials[2:] if t.params == {"x": 1}]
    assert all("failed before" in t.user_attrs["skipped"] for t in skipped)


def test_the_scripts_defaults_come_from_its_command_line_where_not_given():
    from autotune.wrap.wrapper import parse_knob, script_defaults

    space = [parse_knob("num_envs=4,8,16"), parse_knob("batch_size=256,512"), parse_knob("lr=1,2")]
    cmd = ["python", "t.py", "--num-envs", "8", "--batch_size=512", "--lr", "3"]
    # flags without placeholders give the script's values; one not among the choices does not
    assert script_defaults([], space, cmd) == {"num_envs": 8, "batch_size": 512, "lr": 1}
    assert script_defaults(["num_envs=16"], space, cmd)["num_envs"] == 16  # --default wins
    assert script_defaults([], space, ["python", "t.py", "--num-envs", "{num_envs}"]) == {
        "num_envs": 4,
        "batch_size": 256,
        "lr": 1,
    }


def test_a_study_is_not_mixed_up_or_touched_by_a_refused_run(tmp_path):
    db = f"sqlite:///{tmp_path}/w.db"
    first = _wrap(tmp_path, "--knob", "num_envs=1,2", "--trials", "1")
    assert first.returncode == 0, first.stderr
    # another objective: its values would sit beside the others' in other units
    other = _wrap(tmp_path, "--knob", "num_envs=1,2", "--trials", "1", "--objective", "steps_per_s")
    said = " ".join(other.stderr.split())
    assert other.returncode == 2 and "holds steps_per_joule values" in said
    # even resumed, a tuned knob keeps the values its trials were drawn from (not a traceback)
    wider = _wrap(tmp_path, "--knob", "num_envs=1,2,4", "--trials", "1", "--resume")
    said = " ".join(wider.stderr.split())
    assert wider.returncode == 2 and "Traceback" not in wider.stderr, wider.stderr
    assert "knob num_envs: its trials in study 'wrap-train' drew from [1, 2], not [1, 2, 4]" in (
        said
    )
    # a refused --default leaves the study's settings as they were
    bad = _wrap(tmp_path, "--knob", "num_envs=1,2", "--default", "num_envs=9", "--resume")
    assert bad.returncode == 2
    study = optuna.load_study(study_name="wrap-train", storage=db)
    assert len(study.trials) == 1 and study.user_attrs["wrap"]["objective"] == "steps_per_joule"
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    # a study of autotune's own runtime is not taken over
    own = optuna.create_study(study_name="study-CartPole-v1", storage=db)
    own.set_user_attr("autotune", {"env": "CartPole-v1"})
    taken = _wrap(tmp_path, "--knob", "num_envs=1,2", "--study", "study-CartPole-v1")
    assert taken.returncode == 2 and "holds runs of autotune's own runtime" in taken.stderr
    assert "wrap" not in optuna.load_study(study_name="study-CartPole-v1", storage=db).user_attrs
    # no command: refused before a study is made
    out = subprocess.run(
        [*CLI, "wrap", "--storage", f"sqlite:///{tmp_path}/n.db", "--knob", "n=1,2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "no command to wrap" in out.stderr
    assert not (tmp_path / "n.db").exists()
    # an output path that cannot be written is refused before any trial runs
    (tmp_path / "adir").mkdir()
    cmd = ["--knob", "num_envs=1,2", "--study", "outs", "--export", str(tmp_path / "adir")]
    refused = _wrap(tmp_path, *cmd)
    assert refused.returncode == 2 and "is a directory; give a file path" in refused.stderr
    assert "outs" not in optuna.get_all_study_names(db)


CLI = [sys.executable, "-m", "autotune.cli"]
SLEEPER = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone
        return f.read().split(")")[-1].split()[0] != "Z"


def _wait_for(path, proc):
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    while not path.read_text():
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.parametrize("mode", ["restart", "live"])
def test_a_stopped_wrap_stops_its_script(tmp_path, mode):
    """SIGTERM to the wrap (a scheduler's stop, a kill) stops the script it runs, as Ctrl-C
    does: a script left running would hold its GPU and cores with no one measuring it."""
    script, pid_file = tmp_path / "sleeper.py", tmp_path / "pid"
    script.write_text(SLEEPER)
    cmd = [*CLI, "wrap", "--storage", f"sqlite:///{tmp_path}/s.db"]
    cmd += ["--mode", mode, "--knob", "n=1,2", "--", sys.executable, str(script), str(pid_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = _wait_for(pid_file, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130  # stopped, as a shell says it: not a run that finished
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_a_live_wrap_refused_for_its_settings_leaves_no_script_running(tmp_path):
    script, pid_file = tmp_path / "sleeper.py", tmp_path / "pid"
    script.write_text(SLEEPER)
    cmd = [*CLI, "wrap", "--storage", f"sqlite:///{tmp_path}/s.db"]
    cmd += ["--mode", "live", "--knob", "n=1,2", "--warmup-s", "0"]
    cmd += ["--", sys.executable, str(script), str(pid_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "warmup_s=0.0: must be > 0" in out.stderr, out.stderr
    if pid_file.exists() and pid_file.read_text():
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    missing = subprocess.run(
        [*cmd[: cmd.index("--warmup-s")], "--", "no-such-program-here"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "cannot start 'no-such-program-here'" in missing.stderr
    assert "Traceback" not in missing.stderr


STUBBORN = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_process_of_the_scripts_tree_that_ignores_sigterm_is_killed_with_it(monkeypatch):
    """The script goes at SIGTERM; a child of it that ignores SIGTERM (re-parented once the
    script is gone) is killed when the grace period ends, not left running."""
    from autotune.wrap import process_tree

    monkeypatch.setattr(process_tree, "TERM_GRACE_S", 1.0)
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    deadline = time.monotonic() + 30
    while _alive(child) and len(process_tree.tree_pids(proc.pid)) < 2:  # the child's own start
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # its handler in place
    process_tree.stop_tree(proc)
    assert proc.returncode is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


LEAVER = """
import subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
print(child.pid, flush=True)
while not Path(sys.argv[1]).exists():  # until the test has seen its child in its tree
    time.sleep(0.05)
"""


def test_a_process_that_outlives_a_script_that_exited_itself_is_ended(tmp_path, monkeypatch):
    """A script exits on its own (code 0) and leaves a child running, re-parented: it would
    draw CPU through the next trial's measurement. The wrapper's tree remembers it from
    while the script ran, and ends it, SIGKILL where it ignores SIGTERM."""
    from autotune.wrap import process_tree

    monkeypatch.setattr(process_tree, "TERM_GRACE_S", 1.0)
    go = tmp_path / "go"
    cmd = [sys.executable, "-c", LEAVER, str(go)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    tree = process_tree.Tree(proc)
    deadline = time.monotonic() + 60
    while child not in tree.pids():  # as the wrapper's CPU model reads it, while it runs
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    go.touch()
    assert proc.wait(timeout=60) == 0
    assert _alive(child)  # the script is gone; its child runs on
    assert tree.end_outliving() == 1
    deadline = time.monotonic() + 10  # SIGKILL is delivered on its own time
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    assert tree.end_outliving() == 0  # nothing left
