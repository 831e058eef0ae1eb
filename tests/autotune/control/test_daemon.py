"""The tuning daemon: control-socket rules, a real job registered with a real daemon, and a
daemon killed with SIGKILL and started again that resumes the same study with no trial lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import msgpack
import optuna
import pytest
from conftest import kill_daemon, wait_until

from autotune.control import protocol
from autotune.control.status import live_rates
from autotune.tuning.counters import Counters
from autotune.workflows.progress_log import latest_steps

CLI = [sys.executable, "-m", "autotune.cli"]


def test_control_endpoints_are_private_or_loopback(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_CONTROL", raising=False)
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))
    assert protocol.resolve_endpoint() == f"ipc://{tmp_path}/home/control.sock"
    assert (tmp_path / "home").stat().st_mode & 0o777 == 0o700
    assert protocol.resolve_endpoint("tcp://localhost:5999") == "tcp://127.0.0.1:5999"
    with pytest.raises(protocol.ControlError, match="IPv6 is not served; use tcp://127"):
        protocol.resolve_endpoint("tcp://[::1]:5999")
    for bad in (
        "tcp://0.0.0.0:5999",
        "tcp://10.1.2.3:5999",
        "tcp://127.0.0.1",
        "http://x",
        "ipc://",
    ):
        with pytest.raises(protocol.ControlError, match="not allowed: use ipc://PATH or tcp://127"):
            protocol.resolve_endpoint(bad)
    (tmp_path / "shared").mkdir(mode=0o777)
    (tmp_path / "shared").chmod(0o777)
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "shared"))
    with pytest.raises(protocol.ControlError, match="is not private"):
        protocol.resolve_endpoint()


def test_a_daemon_started_with_relative_paths_answers_from_where_it_was_started(tmp_path):
    # The daemon runs from "/": a relative AUTOTUNE_HOME or ipc:// path must mean the
    # directory the command was given in, for the daemon and for the client alike.
    env = {**_env(tmp_path), "AUTOTUNE_HOME": "rel/home"}

    def run(extra, *args):
        cmd = [*CLI, *args, *extra]
        return subprocess.run(
            cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )

    for extra in ([], ["--control", "ipc://rel/other.sock"]):
        start = run(extra, "daemon", "start")
        assert start.returncode == 0, start.stdout + start.stderr
        try:
            status = run(extra, "status")
            assert status.returncode == 0 and "no daemon running" not in status.stdout, status
        finally:
            assert run(extra, "daemon", "stop").returncode == 0
    assert (tmp_path / "rel" / "home" / "daemon.log").is_file()
    assert not os.path.exists("/rel")


def test_control_messages_are_versioned_maps():
    assert protocol.decode(protocol.encode("PING"))["type"] == "PING"
    with pytest.raises(ValueError, match="undecodable"):
        protocol.decode(b"\xc1")
    with pytest.raises(ValueError, match="not a map with a 'type'"):
        protocol.decode(msgpack.packb([1, 2]))
    with pytest.raises(ValueError, match="protocol version 99"):
        protocol.decode(msgpack.packb({"v": 99, "type": "PING"}))
    # an older job (no session token) meets a newer daemon: the versions are named
    with pytest.raises(ValueError, match=r"version 1; this side speaks 2 \(run the same autotune"):
        protocol.decode(msgpack.packb({"v": 1, "type": "HELLO", "job": "j"}))
    with pytest.raises(ValueError, match="malformed counters"):
        Counters.from_wire({"t_s": 1.0})
    good = {"t_s": 1.0, "trained_steps": 5, "lag_steps": 0.0, "gpu_j": 1.0, "cpu_j": 2.0}
    good["cpu_source"] = "model"
    assert Counters.from_wire(good).trained_steps == 5
    for bad in ({"gpu_j": float("nan")}, {"cpu_j": float("inf")}, {"trained_steps": -1}):
        with pytest.raises(ValueError, match="not finite, or negative"):  # status JSON stays JSON
            Counters.from_wire({**good, **bad})


def test_live_rates_split_gpu_and_cpu_watts():
    readings = [
        Counters(0.0, 0, 0.0, 0.0, 0.0, "rapl"),
        Counters(5.0, 5000, 0.0, 1000.0, 250.0, "rapl"),
    ]
    rates = live_rates(readings, 10.0)
    assert rates["steps_per_s"] == 1000.0 and rates["gpu_w"] == 200.0 and rates["cpu_w"] == 50.0
    assert rates["steps_per_joule"] == 4.0 and rates["cpu_source"] == "rapl"
    assert live_rates(readings[:1], 10.0) is None


def _env(tmp_path):
    home = tmp_path / "h"
    return {**os.environ, "AUTOTUNE_HOME": str(home), "AUTOTUNE_CONTROL": "", "COLUMNS": "250"}


def _cli(env, *args, timeout=60):
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _daemon_pid(env):
    out = _cli(env, "daemon", "start")
    assert out.returncode == 0, out.stderr
    return int(out.stderr.split("(pid ")[1].split(")")[0])


def _trials(db, study):
    s = optuna.load_study(study_name=study, storage=f"sqlite:///{db}")
    return {t.number: (t.state.name, t.params, t.value) for t in s.get_trials()}


def _complete(db, study):
    try:
        return sum(s == "COMPLETE" for s, _, _ in _trials(db, study).values())
    except KeyError:  # the study is not created yet
        return 0


def test_sigkilled_daemon_restarts_and_resumes_the_study_with_no_trial_lost(tmp_path):
    env = _env(tmp_path)
    db, study = tmp_path / "s.db", "killed"
    progress = tmp_path / "p.jsonl"
    pid = _daemon_pid(env)
    job = subprocess.Popen(
        [
            *CLI,
            "train",
            "--tune",
            "--quiet",
            "--actors",
            "2",
            "--storage",
            f"sqlite:///{db}",
            "--study",
            study,
            "--tune-window-s",
            "1",
            "--tune-window-max-s",
            "2",  # what is checked is the study across the kill, not how precise a window is
            "--tune-warmup-s",
            "0.5",
            "--knob",
            "actors=1..3",
            "--knob",
            "envs_per_actor=4,8",
            "--knob",
            "trainers=1",
            "--knob",
            "trainer_threads=1",
            "--knob",
            "batch_size=512,1024,2048",
            "--max-wall-s",
            "900",  # a safety net only: the test ends the job once the trials it waits for came
            "--steps",
            "10000000",
            "--json",
            str(tmp_path / "r.json"),
            "--progress",
            str(progress),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: _complete(db, study) >= 2, job, what="2 trials under the first daemon")
        # status from the running daemon: the job, its live rates and its trials
        out = _cli(env, "status", "--json", str(tmp_path / "st.json"))
        assert out.returncode == 0, out.stdout
        st = json.loads((tmp_path / "st.json").read_text())
        assert [j["study"] for j in st["jobs"]] == [study]
        assert st["jobs"][0]["live"]["steps_per_s"] > 0
        assert "mps_pct" in out.stdout and "not on this machine" in out.stdout
        os.kill(pid, signal.SIGKILL)
        before = _trials(db, study)
        trained = latest_steps(progress)
        wait_until(
            lambda: latest_steps(progress) > trained, job, what="training on without a daemon"
        )
        assert job.poll() is None, "the job must keep training without its daemon"
        pid = _daemon_pid(env)
        done = sum(s == "COMPLETE" for s, _, _ in before.values())
        wait_until(
            lambda: _complete(db, study) >= done + 1, job, what="a trial under the new daemon"
        )
        after = _trials(db, study)
    finally:
        job.send_signal(signal.SIGINT)  # a clean drain, then the result with the tuning section
        out, _ = job.communicate(timeout=120)
        kill_daemon(env["AUTOTUNE_HOME"])
    assert job.returncode == 0, out
    # every trial told before the kill is there unchanged; the one being measured is failed
    for number, (state, params, value) in before.items():
        if state == "RUNNING":
            assert after[number][0] == "FAIL"
        else:
            assert after[number] == (state, params, value)
    assert sorted(after) == list(range(len(after)))  # one study, numbers never reused
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["tuning"]["registrations"] == 2
    assert result["tuning"]["study"] == study
    assert result["lost_steps"] == 0


def test_a_second_daemon_and_a_storage_the_daemon_cannot_open_are_refused(tmp_path):
    """One daemon: a second one on the same socket, or on another state dir (it would hand out
    the same cores), is refused, naming the first; a job whose storage it cannot open is
    refused and does not start; then it stops."""
    env = _env(tmp_path)
    pid = _daemon_pid(env)
    try:
        again = _cli(env, "daemon", "run")
        assert again.returncode == 2 and "already runs on ipc://" in again.stderr
        assert f"(pid {pid})" in again.stderr
        elsewhere = _cli({**env, "AUTOTUNE_HOME": str(tmp_path / "h2")}, "daemon", "run")
        assert elsewhere.returncode == 2, elsewhere.stderr  # its cores are handed out already
        assert "another daemon already hands out core" in elsewhere.stderr
        assert f"pid {pid} (state dir {env['AUTOTUNE_HOME']})" in elsewhere.stderr
        out = _cli(env, "train", "--tune", "--quiet", "--storage", "nosuch://x")
        st = _cli(env, "status")
    finally:
        stop = _cli(env, "daemon", "stop")
    assert out.returncode == 2
    assert "the daemon refused this job: cannot tune job" in out.stderr
    assert "cannot open study 'online-CartPole-v1' in storage 'nosuch://x'" in out.stderr
    assert "0 job(s)" in st.stdout
    assert stop.returncode == 0 and "stopped" in stop.stderr
    assert "no daemon running" in _cli(env, "status").stdout


def test_a_job_refuses_malformed_or_invalid_configs_without_changing(monkeypatch):
    from autotune.control.job_link import DaemonLink
    from runtime.config import ConfigError as CE

    class Runner:
        def __init__(self):
            self.changes = []

        def reconfigure(self, **changes):
            if not isinstance(changes.get("actors", 1), int):
                raise TypeError("'<' not supported between instances of 'str' and 'int'")
            if changes.get("actors") == 99:
                raise CE(["actors=99: more than the cores"])
            self.changes.append(changes)

    runner = Runner()
    link = DaemonLink("ipc:///nonexistent/x.sock", {"base": {"actors": 2}}, runner)
    try:
        link._handle({"type": "APPLY", "seq": "x", "values": {}})  # malformed: ignored
        link._handle({"type": "APPLY", "seq": 1, "values": {"actors": "many"}})
        assert link.applied == 1 and link.refused.startswith("TypeError")
        link._handle({"type": "APPLY", "seq": 2, "values": {"actors": 99}})
        assert link.applied == 2 and "more than the cores" in link.refused
        link._handle({"type": "APPLY", "seq": 3, "values": {"actors": 3}})
        link._handle({"type": "APPLY", "seq": 3, "values": {"actors": 3}})  # a resend
        assert link.refused is None and runner.changes == [{"actors": 3}]
    finally:
        link.close()
