"""The daemon shares one machine among its jobs: a real daemon and two tuned CartPole jobs get
disjoint cores and are pinned there; when one finishes the other grows to the freed cores;
claims the machine cannot meet, and a second daemon, are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import kill_daemon, mujoco_like_model, wait_until

from autotune.control.allocator import Budget, Claim
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
        wait_until(lambda: _pinned(_live(env), 2), second, what="both jobs' budgets")
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


def test_offers_are_disjoint_and_registered_jobs_keep_their_cores_until_the_new_one_joins():
    """Jobs that ask before they size themselves get disjoint cores; a registered job keeps
    its budget while a newcomer probes, and is cut when the newcomer registers; an offer whose
    job never registers lapses."""
    t = [0.0]
    sent: list[tuple[str, Budget]] = []
    shares = MachineShares(
        MachineView.from_dict({"cores": 6}),
        lambda job, b, changed: sent.append((job, b)),
        clock=lambda: t[0],
        read_foreign=False,
    )
    assert shares.offer(Claim("offer"), pid=11).cores == tuple(range(6))  # alone: the machine
    shares.join(share_of(claim_from("job-a", {}), {"pid": 11}, shares.machine))
    assert sent == [("job-a", Budget(tuple(range(6))))]  # to pin to, and to its tuner
    b = shares.offer(Claim("offer"), pid=12)
    c = shares.offer(Claim("offer"), pid=13)
    assert len(b.cores) == 3 and c.cores and not set(b.cores) & set(c.cores)
    assert shares.shares["job-a"].budget.cores == tuple(range(6))  # kept while they probe
    shares.join(share_of(claim_from("job-b", {}), {"pid": 12}, shares.machine))
    a_now, b_now = shares.shares["job-a"].budget, shares.shares["job-b"].budget
    assert b_now.cores == b.cores and not set(a_now.cores) & set(b_now.cores)
    assert len(a_now.cores) + len(b_now.cores) == 6  # the lapsing offer holds nothing here
    t[0] += 1000.0  # job c never registers: its offer lapses
    shares.tick()
    assert sorted(shares.shares) == ["job-a", "job-b"]
    small = MachineShares(  # a pending offer of every core: the next is shared out, not refused
        MachineView.from_dict({"cores": 2}), lambda *a: None, read_foreign=False
    )
    assert small.offer(Claim("offer"), pid=21).cores == (0, 1)
    assert len(small.offer(Claim("offer"), pid=22).cores) == 1
    for job, pid in (("job-x", 21), ("job-y", 22)):
        small.join(share_of(claim_from(job, {}), {"pid": pid}, small.machine))
    x, y = small.shares["job-x"].budget.cores, small.shares["job-y"].budget.cores
    assert len(x) == len(y) == 1 and x != y
    with pytest.raises(ValueError, match="malformed claim"):
        claim_from("x", {"weight": "heavy"})
    with pytest.raises(ValueError, match="a claim is a map of"):
        claim_from("x", {"priority": 1})


def test_a_changed_budget_keeps_the_costly_values_unless_changing_them_pays():
    """Sized for a new budget, a job keeps its envs per actor (a respawn of every actor) and
    its GMI (a handover) where the model's best gains less than ``KEEP_GAIN`` from changing
    them; it changes them where the gain is larger."""
    from autotune.control.claims import Share
    from autotune.control.rates import sized_for
    from autotune.control.sharing import KEEP_GAIN

    m = mujoco_like_model()
    shares = MachineShares(
        MachineView.from_dict({"cores": 16}), lambda *a: None, read_foreign=False
    )
    shares.shares["a"] = Share(Claim("a", gpu=0), model=m)
    budget = Budget(tuple(range(8)), 0, 50)
    best = shares.sized("a", budget)
    assert shares.sized("a", budget, best) == best
    for envs in (1, 2, 4, 8, 16, 32):
        if envs == best["envs_per_actor"]:
            continue
        kept = sized_for(m, 1, 16, 8, 50, keep={"envs_per_actor": envs})
        gain = (
            sized_for(m, 1, 16, 8, 50).predicted["steps_per_joule"]
            / kept.predicted["steps_per_joule"]
        )
        out = shares.sized("a", budget, {**best, "envs_per_actor": envs})
        assert out["envs_per_actor"] == (envs if gain < 1 + KEEP_GAIN else best["envs_per_actor"])
        assert out["actors"] <= 8  # inside the budget either way


def test_a_restarted_daemon_keeps_the_budgets_its_jobs_hold():
    """Jobs register again with the budget they are pinned to: each keeps exactly that while
    the others come back (the first would otherwise be given every core, those the others
    still hold included), and the share-out after the grace keeps each where the counts
    allow, so no job is moved by the restart."""
    from autotune.control.sharing import RESTART_GRACE_S

    now = [0.0]
    sent: list[tuple[str, Budget]] = []
    shares = MachineShares(
        MachineView.from_dict({"cores": 8}),
        lambda j, b, changed: sent.append((j, b)),
        clock=lambda: now[0],
        read_foreign=False,
    )
    held = {"x": Budget((4, 5, 6, 7)), "y": Budget((0, 1, 2, 3))}
    for job, budget in held.items():
        shares.join(
            share_of(claim_from(job, {}), {"pid": None, "held": budget.to_dict()}, shares.machine)
        )
    assert sent == list(held.items())  # no core of y's was ever sent to x
    now[0] = RESTART_GRACE_S + 1
    shares.tick()
    assert {j: s.budget for j, s in shares.shares.items()} == held and shares.allocation
    # a job that comes back holding cores another job holds is shared out at once
    late = share_of(claim_from("z", {}), {"held": {"cores": [0, 1]}}, shares.machine)
    shares.join(late)
    cores = [set(s.budget.cores) for s in shares.shares.values()]
    assert sum(len(c) for c in cores) == len(set().union(*cores)) == 8  # disjoint


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
        # on a machine of more than one core, the core it is confined to is known
        assert seen["pinned"] == ([last] if len(cores) > 1 else [])
        assert spin.pid not in foreign_load({spin.pid}, cores)["pids"]  # managed: not foreign
    finally:
        spin.kill()
        spin.wait()


def test_hostile_registrations_and_offers_leave_the_daemon_serving(daemon_env):
    """Malformed fields in a registration are left out, and offers without a real pid, with a
    malformed claim or a reserved job id are refused; the daemon keeps answering."""
    from autotune.control import protocol

    machine = MachineView.from_dict({"cores": 4})
    hostile = {
        "pid": -5,
        "minibatches": "x",
        "held": {"cores": [0, 0]},
        "machine": {"rollout_len": 0},
    }
    share = share_of(claim_from("job-h", {}), hostile, machine)
    assert (share.pid, share.minibatches, share.budget, share.model) == (None, 4, None, None)
    assert share_of(claim_from("j", {}), {"held": "x"}, machine).budget is None
    assert share_of(claim_from("j", {}), {"held": {"cores": [9]}}, machine).budget is None
    endpoint = f"ipc://{daemon_env['AUTOTUNE_HOME']}/control.sock"
    os.environ["AUTOTUNE_HOME"] = daemon_env["AUTOTUNE_HOME"]
    try:
        for body in ({"pid": -5}, {"pid": True}, {}, {"pid": 7, "claim": {"weight": "x"}}):
            answer = protocol.request(endpoint, protocol.MsgType.OFFER, **body)
            assert answer["type"] == protocol.MsgType.ERROR, (body, answer)
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


def test_the_periodic_share_out_moves_budgets_only_where_it_pays():
    """Every ``REBALANCE_S`` the daemon shares the machine out again with the jobs' fitted
    models: budgets stay where nothing changed, and move once a job's model says cores pay
    more elsewhere (here one job's env steps turn out 4x as dear as probed: its phase changed)."""
    from dataclasses import replace

    from autotune.control.claims import Share
    from autotune.control.sharing import REBALANCE_S, RESTART_GRACE_S
    from autotune.tuning.perf_model import prior_params

    now, sent = [0.0], []
    m = mujoco_like_model()
    fitted = {"a": prior_params(m), "b": prior_params(m)}
    shares = MachineShares(
        MachineView.from_dict({"cores": 16}),
        lambda job, budget, changed: changed and sent.append((job, budget)),
        params_of=lambda job: fitted[job],
        clock=lambda: now[0],
        read_foreign=False,
    )
    for job in ("a", "b"):
        shares.join(Share(Claim(job), model=m))

    def tick():  # and each job takes what it was sent, as its report says
        shares.tick()
        for job, share in shares.shares.items():
            shares.taken(job, share.seq)

    now[0] = RESTART_GRACE_S + 1
    tick()
    first = {j: s.budget for j, s in shares.shares.items()}
    assert len(first["a"].cores) + len(first["b"].cores) == 16
    sent.clear()
    now[0] += REBALANCE_S / 2
    tick()
    now[0] += REBALANCE_S
    tick()  # a share-out with the same models: nothing to gain, nothing sent
    assert sent == [] and {j: s.budget for j, s in shares.shares.items()} == first
    slow = max(first, key=lambda j: len(first[j].cores))  # the job holding the most cores
    fitted[slow] = replace(fitted[slow], k_s=0.25 * fitted[slow].k_s)
    now[0] += REBALANCE_S / 2
    tick()
    assert sent == []  # not before its time
    now[0] += REBALANCE_S / 2
    tick()
    moved = {j: s.budget for j, s in shares.shares.items()}
    assert len(moved[slow].cores) < len(first[slow].cores) and {j for j, _ in sent} == {"a", "b"}
    assert not set(moved["a"].cores) & set(moved["b"].cores)
