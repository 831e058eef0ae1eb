"""The daemon shares one machine among its jobs: a real daemon and two tuned CartPole jobs get
disjoint cores and are pinned there; when one finishes the other grows to the freed cores;
claims the machine cannot meet, and a second daemon, are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import kill_daemon, wait_until

from autotune.control.allocator import Budget
from autotune.control.claims import claim_from, share_of
from autotune.control.machine import MachineView
from autotune.control.sharing import MachineShares

CLI = [sys.executable, "-m", "autotune.cli"]


def _env(tmp_path):
    home = tmp_path / "home"
    return {**os.environ, "AUTOTUNE_HOME": str(home), "AUTOTUNE_CONTROL": "", "COLUMNS": "250"}


def _cli(env, *args, timeout=60):
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _job(env, tmp_path, name):
    return subprocess.Popen(
        [
            *CLI,
            "train",
            "--tune",
            "--quiet",
            "--storage",
            f"sqlite:///{tmp_path / name}.db",
            "--study",
            name,
            "--knob",
            "batch_size=512,1024",
            "--actors",  # sized by hand and tuned by TPE: no workload probes, a quicker test
            "1",
            "--envs-per-actor",
            "8",
            "--batch-size",
            "512",
            "--trainer-device",
            "cpu",
            "--trainers",
            "1",
            "--tune-sampler",
            "tpe",
            "--max-wall-s",
            "900",  # a safety net only: the test ends each job once it has seen what it waits for
            "--steps",
            "100000000",
            "--json",
            str(tmp_path / f"{name}.json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _status(env, path):
    out = _cli(env, "status", "--json", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(path.read_text())


def _live(env):
    """The daemon's status document, asked over its socket (no CLI process per poll)."""
    from autotune.control import protocol

    answer = protocol.request(f"ipc://{env['AUTOTUNE_HOME']}/control.sock", protocol.MsgType.STATUS)
    return answer["status"] if answer else {"jobs": []}


def _pinned(doc, n):
    """Whether ``n`` jobs are registered and each has taken its budget."""
    jobs = doc["jobs"]
    return len(jobs) == n and all(j.get("allocation") and j["allocation_taken"] for j in jobs)


def _shared(doc, n):
    """Whether ``n`` jobs hold budgets they have taken, none overlapping (no job starting)."""
    return _pinned(doc, n) and not any(j["starting"] for j in doc["jobs"])


def _finish(job):
    job.send_signal(signal.SIGINT)  # a clean drain: the result is written, nothing lost
    out, _ = job.communicate(timeout=180)
    assert job.returncode == 0, out
    return out


def _nothing_lost(result):
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    ), result
    assert result["lost_steps"] == 0


def test_two_tuned_jobs_share_the_machine_and_the_survivor_grows(tmp_path):
    env = _env(tmp_path)
    assert _cli(env, "daemon", "start").returncode == 0
    st = tmp_path / "st.json"
    first = second = None
    try:
        first = _job(env, tmp_path, "first")
        wait_until(lambda: _pinned(_live(env), 1), first, what="the first job's budget")
        second = _job(env, tmp_path, "second")
        # the first keeps its cores while the second starts, until the second has trained
        wait_until(lambda: _pinned(_live(env), 2), second, what="both jobs' budgets")
        wait_until(lambda: _shared(_live(env), 2), second, what="the share-out once it trained")
        doc = _status(env, st)  # what `autotune status --json` writes
        machine = set(doc["machine"]["cores"])
        cores = {j["study"]: set(j["allocation"]["cores"]) for j in doc["jobs"]}
        assert cores["first"] and cores["second"] and not cores["first"] & cores["second"]
        assert cores["first"] | cores["second"] <= machine
        for j in doc["jobs"]:  # every thread of the job is pinned to its budget
            assert os.sched_getaffinity(j["pid"]) == set(j["allocation"]["cores"])
            # the document's shape: each job, its env, budget and figures (None until measured)
            assert (
                j["id"]
                and j["env"] == "CartPole-v1"
                and {"steps_per_s", "steps_per_joule"} <= j.keys()
            )
            assert j["allocation"]["gpu"] is None and j["allocation"]["mps_pct"] is None  # no GPU
        _finish(first)
        first = None

        def grown():
            jobs = _live(env)["jobs"]
            return (
                len(jobs) == 1
                and set(jobs[0]["allocation"]["cores"]) == machine
                and jobs[0]["allocation_taken"]
            )

        wait_until(grown, second, what="the second job growing to the freed cores")
        second_pid = _live(env)["jobs"][0]["pid"]
        assert os.sched_getaffinity(second_pid) == machine
        _finish(second)
        second = None
    finally:
        for job in (first, second):
            if job is not None:
                job.kill()
        kill_daemon(env["AUTOTUNE_HOME"])
    for name in ("first", "second"):
        result = json.loads((tmp_path / f"{name}.json").read_text())
        _nothing_lost(result)
        assert result["tuning"]["where"].startswith("daemon on ipc://")
        # a job's actors range over the machine, not over the budget it was first offered
        assert result["tuning"]["knobs"]["actors"]["choices"][-1] >= len(machine), name


@pytest.fixture(scope="module")
def daemon_env(tmp_path_factory):
    """The CLI's environment for a daemon of its own state dir, started once for the tests
    that only ask it things (claims it refuses, hostile messages) and stopped after them."""
    env = _env(tmp_path_factory.mktemp("asked"))
    assert _cli(env, "daemon", "start").returncode == 0
    yield env
    kill_daemon(env["AUTOTUNE_HOME"])


def test_claims_the_machine_cannot_meet_are_refused_with_what_is_free(daemon_env, tmp_path):
    env = daemon_env
    again = _cli(env, "daemon", "run", "--control", f"ipc://{tmp_path}/other.sock")
    out = _cli(env, "train", "--tune", "--quiet", "--cores", "0-999")
    share = _cli(env, "train", "--tune", "--quiet", "--gpu-share", "50")
    floor = _cli(env, "train", "--tune", "--quiet", "--min-share", "2")
    untuned = _cli(env, "train", "--quiet", "--exclusive")
    assert again.returncode == 2 and "one per state dir" in again.stderr
    assert out.returncode == 2
    assert "the daemon cannot take this job" in out.stderr and "fixed cores" in out.stderr
    assert share.returncode == 2 and "give --cores with it" in share.stderr
    assert floor.returncode == 2 and "--min-share 2.0: a share within 0..1" in floor.stderr
    assert untuned.returncode == 2 and "--exclusive take effect with --tune" in untuned.stderr


def test_a_busy_process_the_daemon_does_not_manage_counts_as_taken():
    from autotune.control.machine import foreign_load

    cores = tuple(sorted(os.sched_getaffinity(0)))
    last = cores[-1]  # the spinner is confined to it, as `taskset -c` would
    spin = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {last}),
    )
    seen: dict = {}
    try:

        def counted() -> bool:
            seen.update(foreign_load(set(), cores))  # CPU use since the previous reading
            return spin.pid in seen["pids"]

        wait_until(counted, spin, timeout_s=120, what="the spinning process counted")
        assert seen["cores"] >= 1
        # on a machine of more than one core, the core it is confined to is known (other
        # tests' pinned processes may show as well)
        assert last in seen["pinned"] if len(cores) > 1 else seen["pinned"] == []
        assert spin.pid not in foreign_load({spin.pid}, cores)["pids"]  # managed: not foreign
    finally:
        spin.kill()
        spin.wait()


def test_hostile_registrations_and_offers_leave_the_daemon_serving(daemon_env):
    """Malformed fields in a registration are left out (a malformed machine model refused),
    and offers without a real pid, with a malformed claim or a reserved job id are refused; the
    daemon keeps answering."""
    from autotune.control import protocol

    machine = MachineView.from_dict({"cores": 4})
    hostile = {"pid": -5, "minibatches": "x", "held": {"cores": [0, 0]}}
    share = share_of(claim_from("job-h", {}), hostile, machine)
    assert (share.pid, share.minibatches, share.budget, share.model) == (None, 4, None, None)
    with pytest.raises(ValueError, match="machine model: rollout_len=0; allowed: an integer"):
        share_of(claim_from("job-h", {}), {"machine": {"rollout_len": 0}}, machine)
    assert share_of(claim_from("j", {}), {"held": "x"}, machine).budget is None
    assert share_of(claim_from("j", {}), {"held": {"cores": [9]}}, machine).budget is None
    endpoint = f"ipc://{daemon_env['AUTOTUNE_HOME']}/control.sock"
    os.environ["AUTOTUNE_HOME"] = daemon_env["AUTOTUNE_HOME"]
    try:
        me = os.getpid()
        for body in ({"pid": -5}, {"pid": True}, {}, {"pid": me, "claim": {"weight": "x"}}):
            answer = protocol.request(endpoint, protocol.MsgType.OFFER, **body)
            assert answer["type"] == protocol.MsgType.ERROR, (body, answer)
        # an offer for another process (its pending offer would be replaced): the kernel
        # names the sender on the ipc socket, and only its own pid is taken
        answer = protocol.request(endpoint, protocol.MsgType.OFFER, pid=1)
        assert f"names pid 1, but process {me} sent it" in answer["message"], answer
        assert protocol.request(endpoint, protocol.MsgType.OFFER, pid=me)["type"] == "OFFER"
        answer = protocol.request(endpoint, protocol.MsgType.HELLO, job="offer-1")
        assert "reserved" in answer["message"]
        assert protocol.request(endpoint, protocol.MsgType.PING)["type"] == protocol.MsgType.PONG
    finally:
        del os.environ["AUTOTUNE_HOME"]


def test_a_stopping_daemon_leaves_every_job_its_budget_and_a_job_registered_again_takes_budgets():
    from autotune.control.job_link import DaemonLink

    sent: list[tuple[str, Budget]] = []
    shares = MachineShares(
        MachineView.from_dict({"cores": 4}), lambda j, b, changed: sent.append((j, b))
    )
    for job in ("a", "b"):
        shares.join(share_of(claim_from(job, {}), {}, shares.machine))
    before, count = shares.shares["b"].budget, len(sent)
    shares.leave("a", rebalance=False)
    assert shares.shares["b"].budget == before and len(sent) == count
    link = DaemonLink("ipc:///nonexistent/x.sock", {"base": {}}, object())
    try:
        link.budget_seq = 5  # budgets taken under a registration the daemon has forgotten
        link._handle({"type": "WELCOME", "job": "x"})
        assert link.budget_seq == 0  # the new registration's budgets count from one again
    finally:
        link.close()


def test_a_silent_job_whose_process_runs_is_given_longer_than_one_that_is_gone():
    from autotune.control import protocol

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(done.stdout)
    busy, past = protocol.JOB_BUSY_S, protocol.JOB_SILENT_S + 1
    assert not protocol.too_silent(protocol.JOB_SILENT_S, gone)  # not yet, whatever the pid
    assert not protocol.too_silent(past, os.getpid()) and protocol.too_silent(busy + 1, os.getpid())
    assert protocol.too_silent(past, gone)
    assert protocol.too_silent(past, None) and protocol.too_silent(past, True)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not yet waited for
    try:
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)  # waits on its exit, not on a time
        assert protocol.too_silent(past, zombie.pid)  # a zombie holds nothing: gone
    finally:
        zombie.wait()


def test_a_budget_pins_the_job_and_re_pins_its_actors_with_the_runs_endpoints():
    """A BUDGET pins the job's tree to its cores and has the actor pool pin its actors again,
    with the endpoints to start any EnvPool actor whose block changed; a resend of one taken,
    and a malformed one, change nothing."""
    from types import SimpleNamespace

    from autotune.control.job_link import DaemonLink

    class Actors:
        def __init__(self) -> None:
            self.calls: list = []

        def pin(self, ep=None) -> int:
            self.calls.append(ep)
            return 0

    runner = SimpleNamespace(actors=Actors(), endpoints="the run's endpoints", meter=None)
    link = DaemonLink("ipc:///nonexistent/x.sock", {"base": {}}, runner)
    cores = sorted(os.sched_getaffinity(0))  # this process's own set: the test moves nothing
    try:
        link._take_budget({"seq": 1, "budget": {"cores": cores}})
        assert link.budget_seq == 1 and link.budget["cores"] == cores
        assert runner.actors.calls == ["the run's endpoints"]
        link._take_budget({"seq": 1, "budget": {"cores": cores}})  # a resend: taken once
        link._take_budget({"seq": "x", "budget": None})  # malformed: ignored, logged
        assert runner.actors.calls == ["the run's endpoints"] and link.budget_seq == 1
        assert os.sched_getaffinity(0) == set(cores)
    finally:
        link.close()
