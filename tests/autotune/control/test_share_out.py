"""The daemon's share-out (``autotune.control.sharing.MachineShares``) on described machines,
with no daemon process: offers, registration, restarts and the periodic share-out."""

from __future__ import annotations

import pytest
from conftest import mujoco_like_model
from rich.console import Console

from autotune.cli.status_view import render_machine
from autotune.control.allocator import Budget, Claim
from autotune.control.claims import claim_from, share_of
from autotune.control.machine import MachineView
from autotune.control.sharing import MachineShares


def _recording(cores: int, clock) -> tuple[MachineShares, list[tuple[str, Budget]]]:
    """A share-out of ``cores`` cores on ``clock``, and the list it sends each budget to."""
    sent: list[tuple[str, Budget]] = []
    shares = MachineShares(
        MachineView.from_dict({"cores": cores}),
        lambda job, budget, changed: sent.append((job, budget)),
        clock=clock,
        read_foreign=False,
    )
    return shares, sent


def test_offers_are_disjoint_and_registered_jobs_keep_their_cores_until_the_new_one_trains(
    live_pids,
):
    """Jobs that ask before they size themselves get disjoint cores; a registered job keeps
    its budget while a newcomer probes and starts, and is cut when the newcomer has trained;
    an offer whose job never registers lapses, at once where its process has ended."""
    p11, p12, p13, p21, p22, p31 = live_pids(6)
    t = [0.0]
    shares, sent = _recording(6, lambda: t[0])
    assert shares.offer(Claim("offer"), pid=p11).cores == tuple(range(6))  # alone: the machine
    shares.join(share_of(claim_from("job-a", {}), {"pid": p11}, shares.machine))
    assert sent == [("job-a", Budget(tuple(range(6))))]  # to pin to, and to its tuner
    b = shares.offer(Claim("offer"), pid=p12)
    c = shares.offer(Claim("offer"), pid=p13)
    assert len(b.cores) == 3 and c.cores and not set(b.cores) & set(c.cores)
    assert shares.shares["job-a"].budget.cores == tuple(range(6))  # kept while they probe
    shares.join(share_of(claim_from("job-b", {}), {"pid": p12}, shares.machine))
    assert shares.job_status("job-b")["starting"] and not shares.job_status("job-a")["starting"]
    assert shares.shares["job-a"].budget.cores == tuple(range(6))  # kept while b starts
    assert sent[-1] == ("job-b", b)  # b pins to its offer at once
    shares.progressed("job-b", 0)  # its first report: nothing trained yet
    shares.progressed("job-a", 90_000)  # the running job's own steps end nothing
    assert shares.shares["job-a"].budget.cores == tuple(range(6))
    shares.progressed("job-b", 512)  # its first batch: a is cut now
    assert not shares.job_status("job-b")["starting"]
    a_now, b_now = shares.shares["job-a"].budget, shares.shares["job-b"].budget
    # c still probes in its offer: a and b share out the rest, b inside the cores it holds
    assert set(b_now.cores) <= set(b.cores) and not set(a_now.cores) & set(b_now.cores)
    assert not (set(a_now.cores) | set(b_now.cores)) & set(c.cores)
    assert len(a_now.cores) + len(b_now.cores) + len(c.cores) == 6
    t[0] += 1000.0  # job c never registers: its offer lapses, and its cores go back
    shares.tick()
    assert sorted(shares.shares) == ["job-a", "job-b"]
    a_now, b_now = shares.shares["job-a"].budget, shares.shares["job-b"].budget
    assert len(a_now.cores) + len(b_now.cores) == 6 and not set(a_now.cores) & set(b_now.cores)
    small = MachineShares(  # a pending offer of every core: the next is shared out, not refused
        MachineView.from_dict({"cores": 2}), lambda *a: None, read_foreign=False
    )
    assert small.offer(Claim("offer"), pid=p21).cores == (0, 1)
    assert len(small.offer(Claim("offer"), pid=p22).cores) == 1
    for job, pid in (("job-x", p21), ("job-y", p22)):
        small.join(share_of(claim_from(job, {}), {"pid": pid}, small.machine))
    for steps in (0, 64):  # y's reports: it has trained, the overlap ends
        small.progressed("job-y", steps)
    x, y = small.shares["job-x"].budget.cores, small.shares["job-y"].budget.cores
    assert len(x) == len(y) == 1 and x != y
    import os
    import signal

    gone = MachineShares(MachineView.from_dict({"cores": 2}), lambda *a: None, read_foreign=False)
    gone.offer(Claim("offer", exclusive=True), pid=p31)
    os.kill(p31, signal.SIGKILL)  # killed while it probed: its offer goes with it, at once
    os.waitpid(p31, 0)
    assert gone.offer(Claim("offer", exclusive=True), pid=p11).cores == (0, 1)
    with pytest.raises(ValueError, match="malformed claim"):
        claim_from("x", {"weight": "heavy"})
    with pytest.raises(ValueError, match="a claim is a map of"):
        claim_from("x", {"priority": 1})
    with pytest.raises(ValueError, match=r"cores \[0, 0\]: a core is named twice"):
        claim_from("x", {"cores": [0, 0]})  # as a socket could send it; the CLI dedupes


def test_a_changed_budget_keeps_the_costly_values_unless_changing_them_pays():
    """Sized for a new budget, a job keeps its envs per actor (a respawn of every actor) and
    its GMI (a handover) where the model's best gains less than ``KEEP_GAIN`` from changing
    them; it changes them where the gain is larger."""
    from autotune.control.claims import Share
    from autotune.control.rates import KEEP_GAIN, sized_for

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
    shares, sent = _recording(8, lambda: now[0])
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
    ahead = shares.shares["a"].seq + 10**9  # a report naming a budget never sent is not taken
    shares.taken("a", ahead)
    assert shares.shares["a"].taken < ahead

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


def test_a_starting_job_that_never_trains_has_the_cores_lent_for_a_stated_time_only(live_pids):
    """The running job keeps its cores while a newcomer starts, through the periodic share-out,
    but no longer than ``STARTING_MAX_S``; a job joining a machine no one else runs on is
    not starting (no budget overlaps), and one joining without an offer is shared out at once."""
    from autotune.control.sharing import REBALANCE_S, RESTART_GRACE_S, STARTING_MAX_S

    p1, p2, p3 = live_pids(3)
    t = [0.0]
    shares, sent = _recording(8, lambda: t[0])
    shares.offer(Claim("offer"), pid=p1)
    shares.join(share_of(claim_from("a", {}), {"pid": p1}, shares.machine))
    assert not shares.job_status("a")["starting"]
    t[0] = RESTART_GRACE_S + 1
    shares.tick()
    offer = shares.offer(Claim("offer"), pid=p2)  # named back as held, as `train --tune` does
    shares.join(share_of(claim_from("b", {}), {"pid": p2, "held": offer.to_dict()}, shares.machine))
    assert shares.shares["a"].budget.cores == tuple(range(8))
    t[0] += REBALANCE_S + 1  # a periodic share-out falls due: not while b starts
    shares.tick()
    assert shares.shares["a"].budget.cores == tuple(range(8))
    assert shares.job_status("b")["starting"]
    t[0] += STARTING_MAX_S  # b never trained: the machine is shared out all the same
    shares.tick()
    a, b = set(shares.shares["a"].budget.cores), set(shares.shares["b"].budget.cores)
    assert a and b and not a & b and len(a | b) == 8 and not shares.job_status("b")["starting"]
    shares.join(share_of(claim_from("c", {}), {"pid": p3}, shares.machine))  # asked no offer
    cores = [set(s.budget.cores) for s in shares.shares.values()]
    assert sum(len(c) for c in cores) == len(set().union(*cores)) == 8
    assert not shares.job_status("c")["starting"] and sent[-1][0] in {"a", "b", "c"}
    held = shares.shares["c"].budget  # c registers again (a daemon restarted): it held that
    shares.join(share_of(claim_from("c", {}), {"pid": p3, "held": held.to_dict()}, shares.machine))
    assert not shares.job_status("c")["starting"]


def test_a_job_leaving_while_another_probes_frees_cores_only_beside_the_offer(live_pids):
    """Two jobs run, a third probes in its offer, and the first leaves: the second grows into
    the freed cores but not into the offer's (it would be cut again as soon as the third
    registers and trains); the third then starts on cores no one else holds."""
    from autotune.control.sharing import RESTART_GRACE_S

    pa, pb, pc = live_pids(3)
    t = [0.0]
    shares, _ = _recording(16, lambda: t[0])
    for job, pid in (("a", pa), ("b", pb)):
        offer = shares.offer(Claim("offer"), pid=pid)
        shares.join(share_of(claim_from(job, {}), {"pid": pid}, shares.machine))
        shares.progressed(job, 0)
        shares.progressed(job, 512)
    t[0] = RESTART_GRACE_S + 1
    shares.tick()
    offer = shares.offer(Claim("offer"), pid=pc)
    assert 0 < len(offer.cores) < 16
    t[0] += 5.0
    (shown,) = shares.status()["offers"]  # `autotune status` shows the process probing
    assert shown == {"pid": pc, "allocation": offer.to_dict(), "for_s": 5.0}
    console = Console(record=True, width=200)
    render_machine(console, shares.status())
    assert f"process {pc} sizing itself (probing) on cores" in console.export_text()
    shares.leave("a")
    b = set(shares.shares["b"].budget.cores)
    assert not b & set(offer.cores) and len(b) == 16 - len(offer.cores)
    shares.join(share_of(claim_from("c", {}), {"pid": pc}, shares.machine))
    assert set(shares.shares["c"].budget.cores) == set(offer.cores)
    assert set(shares.shares["b"].budget.cores) == b  # nothing to cut back
    assert shares.status()["offers"] == []


def test_an_offer_lapsing_while_a_job_starts_leaves_the_start_alone(live_pids):
    """A runs, B has joined and has not trained yet, and C's offer lapses (its process
    ended): A keeps its cores and B is still starting; the machine is shared out when B trains,
    C's cores with it."""
    import os
    import signal

    from autotune.control.sharing import RESTART_GRACE_S

    pa, pb, pc = live_pids(3)
    t = [0.0]
    shares, _ = _recording(16, lambda: t[0])
    shares.offer(Claim("offer"), pid=pa)
    shares.join(share_of(claim_from("a", {}), {"pid": pa}, shares.machine))
    t[0] = RESTART_GRACE_S + 1
    shares.tick()
    shares.offer(Claim("offer"), pid=pb)
    shares.join(share_of(claim_from("b", {}), {"pid": pb}, shares.machine))
    c = shares.offer(Claim("offer"), pid=pc)
    assert c.cores and shares.job_status("b")["starting"]
    os.kill(pc, signal.SIGKILL)  # C's probes died: its offer lapses at the next tick
    os.waitpid(pc, 0)
    t[0] += 1.0
    shares.tick()
    assert f"offer-{pc}" not in shares.shares
    assert (
        shares.shares["a"].budget.cores == tuple(range(16)) and shares.job_status("b")["starting"]
    )
    shares.progressed("b", 0)
    shares.progressed("b", 512)
    a, b = set(shares.shares["a"].budget.cores), set(shares.shares["b"].budget.cores)
    assert not a & b and len(a | b) == 16


def test_a_starting_job_offered_cores_a_fixed_budget_took_since_is_shared_out_afresh(live_pids):
    """An offer made before a fixed budget registered is not kept as it is: the starting job
    gets no core of the fixed budget, and the GPU's shares stay within 100 %."""
    (pa,) = live_pids(1)
    gpu = {"index": 0, "name": "NVIDIA H200", "sms": 132, "memory_mib": 143_771}
    sent: list[tuple[str, Budget]] = []
    shares = MachineShares(
        MachineView.from_dict({"cores": 8, "gpus": [gpu]}),
        lambda job, budget, changed: sent.append((job, budget)),
        read_foreign=False,
    )
    offered = shares.offer(claim_from("offer", {"gpu": 0}), pid=pa)
    assert offered.cores == tuple(range(8)) and offered.mps_pct == 100
    fixed = claim_from("f", {"cores": [0, 1, 2, 3], "gpu": 0, "mps_pct": 60})
    shares.join(share_of(fixed, {"pid": None}, shares.machine))
    shares.join(share_of(claim_from("a", {"gpu": 0}), {"pid": pa}, shares.machine))
    f, a = shares.shares["f"].budget, shares.shares["a"].budget
    assert f.cores == (0, 1, 2, 3) and f.mps_pct == 60  # the fixed budget, untouched
    assert not set(a.cores) & set(f.cores) and a.mps_pct + f.mps_pct <= 100
    assert sent[-1][0] in ("a", "f") and ("a", offered) not in sent


def test_a_huge_weight_is_refused_and_could_not_break_the_split():
    from autotune.control.allocator import MAX_WEIGHT, _split

    machine = MachineView.from_dict({"cores": 8})
    assert any("at most 1e+06" in p for p in Claim("a", weight=MAX_WEIGHT * 10).problems(machine))
    assert not Claim("a", weight=MAX_WEIGHT).problems(machine)
    assert _split(8, {"a": 1e308, "b": 1.0}, 1) == {"a": 7, "b": 1}
    assert _split(8, {"a": 1e308, "b": 1e308}, 1) == {"a": 4, "b": 4}


def test_a_fixed_gpu_share_refused_says_the_most_that_would_fit():
    from autotune.control.allocator import check_admission

    gpu = {"index": 0, "name": "NVIDIA H200", "sms": 132, "memory_mib": 143_771}
    m = MachineView.from_dict({"cores": 8, "gpus": [gpu]})
    flexible = [Claim("a", gpu=0), Claim("b", gpu=0)]  # 10 % each at least
    said = check_admission(m, flexible, Claim("f", fixed=Budget((0, 1), 0, 90), gpu=0))
    assert said is not None and said.endswith("at most 80 % would fit it"), said
    assert check_admission(m, flexible, Claim("f", fixed=Budget((0, 1), 0, 80), gpu=0)) is None


def test_a_job_whose_model_fails_counts_as_linear_and_every_job_is_still_shared_out(
    live_pids, monkeypatch, caplog
):
    """A model that passed registration can still fail for some budget: that job is sized as
    linear in its cores (logged once), and the share-out and the offers go on for every job."""
    from autotune.control.claims import Share

    calls = []

    def failing_rate(m, gpus, total, minibatches=4, params=None):
        def rate(cores: int, pct: int):
            calls.append(cores)
            raise TypeError("can't multiply sequence by non-int of type 'float'")

        return rate

    monkeypatch.setattr("autotune.control.sharing.model_rate", failing_rate)
    shares, sent = _recording(8, lambda: 0.0)
    shares.grace_until = None
    pa, pb, pc = live_pids(3)
    shares.join(share_of(claim_from("good", {}), {"pid": pa}, shares.machine))
    shares.join(Share(claim_from("bad", {}), pb, model=mujoco_like_model()))
    assert calls and set(shares.allocation.budgets) == {"good", "bad"}, "not shared out again"
    budgets = {j: s.budget for j, s in shares.shares.items()}
    assert len(budgets["good"].cores) == len(budgets["bad"].cores) == 4  # linear: even
    assert {j for j, _ in sent[-2:]} == {"bad", "good"}  # both sent their new budgets
    offered = shares.offer(claim_from("offer", {}), pid=pc)  # no TypeError out of an offer
    assert offered.cores
    said = [r.getMessage() for r in caplog.records if "counts as linear" in r.getMessage()]
    assert len(said) == 1 and "job bad" in said[0] and "TypeError: can't multiply" in said[0]


def test_a_failing_read_of_the_other_load_keeps_the_last_reading_and_the_share_out(
    monkeypatch, caplog
):
    """NVML losing a GPU makes reading what other processes take fail: the daemon starts and
    shares out all the same, with the last reading, and says why."""
    import autotune.control.sharing as sharing
    from runtime.hw.nvml import NVMLUnavailable

    def lost(managed, cores):
        raise NVMLUnavailable("GPU is lost")

    monkeypatch.setattr(sharing, "foreign_load", lost)
    now = [0.0]
    shares = MachineShares(
        MachineView.from_dict({"cores": 4}), lambda *a: None, clock=lambda: now[0]
    )
    before = dict(shares.foreign)
    now[0] = sharing.RESTART_GRACE_S + sharing.REBALANCE_S + 1.0
    shares.tick()
    assert shares.rebalanced == now[0]  # the periodic share-out ran, and is not due again
    assert shares.foreign == before
    assert "GPU is lost" in caplog.text
