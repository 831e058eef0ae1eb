"""The allocator on described machines and simulated jobs: floors, totals, core accounting."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from conftest import mujoco_like_model

from autotune.control.allocator import (
    MIN_GMI_PCT,
    AllocationError,
    Budget,
    Claim,
    _split,
    allocate,
    check_admission,
)
from autotune.control.cores import parse_cores
from autotune.control.machine import MachineView, busy_last
from autotune.control.rates import model_rate
from autotune.tuning.knobs import MPS_CHOICES

H100 = {"index": 0, "name": "H100", "sms": 132, "memory_mib": 81559}


def machine(cores: int, gpus: int = 0) -> MachineView:
    return MachineView.from_dict(
        {"cores": cores, "gpus": [dict(H100, index=i) for i in range(gpus)]}
    )


def saturating(cap: float, per_core: float, w_core: float = 10.0):
    """A job whose steps/s stop growing at ``cap``: cores past that only add watts."""

    def rate(cores: int, pct: int) -> tuple[float, float]:
        steps = cap * (1 - math.exp(-per_core * cores / cap))
        return steps, w_core * cores + 0.3 * pct

    return rate


def scaling(per_core: float, w_core: float = 10.0, gpu_gain: float = 0.0):
    def rate(cores: int, pct: int) -> tuple[float, float]:
        return per_core * cores * (1 + gpu_gain * pct / 100), w_core * cores + 0.5 * pct

    return rate


def check(alloc, m: MachineView, claims: list[Claim]) -> None:
    """Exact core accounting, and every floor held."""
    seen: list[int] = []
    for b in alloc.budgets.values():
        assert b.cores, "every job has at least one core"
        seen += list(b.cores)
    assert len(seen) == len(set(seen)), f"a core is in two budgets: {alloc.budgets}"
    assert set(seen) <= set(m.cores)
    for c in claims:
        if c.fixed is None:
            p = alloc.predicted[c.job]
            assert p["steps_per_s"] >= p["floor"] * (1 - 1e-9), (c.job, p)
    by_gpu: dict[int, int] = {}
    for b in alloc.budgets.values():
        if b.gpu is not None:
            by_gpu[b.gpu] = by_gpu.get(b.gpu, 0) + (b.mps_pct or 0)
    assert all(v <= 100 for v in by_gpu.values()), by_gpu


@pytest.mark.parametrize("cores", [2, 16, 64])
def test_moves_cores_to_where_they_pay_and_never_below_the_equal_split(cores):
    m = machine(cores)
    claims = [Claim("light"), Claim("heavy")]
    rates = {"light": saturating(cap=3.0, per_core=2.0), "heavy": scaling(per_core=1.0)}
    alloc = allocate(m, claims, rates, idle_w=50.0)
    check(alloc, m, claims)
    assert alloc.steps_per_joule >= alloc.equal_split_steps_per_joule
    assert sum(len(b.cores) for b in alloc.budgets.values()) == cores
    if cores >= 16:  # the saturated job gives cores to the one that still scales
        assert len(alloc.budgets["heavy"].cores) > cores // 2
        assert alloc.steps_per_joule > 1.05 * alloc.equal_split_steps_per_joule


def test_the_fairness_floor_binds():
    m = machine(16)
    rates = {"a": scaling(per_core=1.0, w_core=1.0), "b": scaling(per_core=0.2, w_core=10.0)}
    loose = allocate(m, [Claim("a", min_share=0.0), Claim("b", min_share=0.0)], rates)
    tight = allocate(m, [Claim("a", min_share=0.9), Claim("b", min_share=0.9)], rates)
    assert len(loose.budgets["b"].cores) == 1  # all it can lose, with no floor
    assert len(tight.budgets["b"].cores) >= math.ceil(0.9 * 8)
    check(tight, m, [Claim("a", min_share=0.9), Claim("b", min_share=0.9)])


def test_weights_split_in_proportion():
    m = machine(12)
    claims = [Claim("a", weight=2.0), Claim("b")]
    alloc = allocate(m, claims, {})  # nothing known: linear rates, the split stays
    assert (len(alloc.budgets["a"].cores), len(alloc.budgets["b"].cores)) == (8, 4)
    # the units go in proportion to the weights, not one each and the rest in proportion
    assert _split(10, {"a": 1.0, "b": 9.0}, 1) == {"a": 1, "b": 9}
    assert _split(8, {"a": 1.0, "b": 1.0, "c": 6.0}, 1) == {"a": 1, "b": 1, "c": 6}
    # a job the proportion leaves under the least is raised with units of the richest
    assert _split(10, {"a": 1.0, "b": 30.0}, 1) == {"a": 1, "b": 9}
    assert _split(2, {"a": 1.0, "b": 1.0, "c": 1.0}, 1) == {"a": 1, "b": 1, "c": 0}


def test_gpu_shares_split_and_move_in_steps():
    m = machine(16, gpus=1)
    claims = [Claim("a", gpu=0), Claim("b", gpu=0)]
    rates = {"a": scaling(1.0, gpu_gain=2.0), "b": scaling(1.0, gpu_gain=0.0)}
    alloc = allocate(m, claims, rates, idle_w=80.0)
    check(alloc, m, claims)
    assert alloc.budgets["a"].mps_pct > alloc.budgets["b"].mps_pct
    assert all(b.mps_pct % 5 == 0 for b in alloc.budgets.values())


def test_fixed_budgets_are_untouched_and_exclusive_use_is_alone():
    m = machine(8, gpus=1)
    fixed = Claim("f", fixed=Budget((0, 1, 2), 0, 40))
    claims = [fixed, Claim("a", gpu=0), Claim("b", gpu=0)]
    alloc = allocate(m, claims, {})
    assert alloc.budgets["f"].cores == (0, 1, 2) and alloc.budgets["f"].mps_pct == 40
    check(alloc, m, claims)
    assert alloc.budgets["a"].mps_pct + alloc.budgets["b"].mps_pct <= 60
    why = check_admission(m, claims, Claim("x", exclusive=True))
    assert "exclusive use needs an idle machine" in why
    assert "exclusive use" in check_admission(m, [Claim("x", exclusive=True)], Claim("y"))
    clash = check_admission(m, claims, Claim("y", fixed=Budget((2, 3))))
    assert "cores 2 are fixed to other jobs; free: 3-7" in clash


def test_a_job_that_asks_for_more_than_there_is_is_refused_with_what_is_free():
    m = machine(2)
    claims = [Claim("a"), Claim("b")]
    why = check_admission(m, claims, Claim("c"))
    assert "no core left" in why and "2 cores to hand out" in why
    assert "not all among" in check_admission(m, [], Claim("c", fixed=Budget((0, 5))))
    assert "GPU 0 is not on this machine" in check_admission(m, [], Claim("c", gpu=0))
    assert "weight must be above 0 and at most" in check_admission(m, [], Claim("c", weight=0))
    with pytest.raises(AllocationError, match="job c"):
        allocate(m, [*claims, Claim("c")], {})


def test_jobs_keep_their_cores_where_the_counts_allow():
    m = machine(8)
    first = allocate(m, [Claim("a"), Claim("b")], {})
    held = first.budgets
    grown = allocate(m, [Claim("b")], {}, current=held)  # a left: b keeps its own and grows
    assert set(held["b"].cores) <= set(grown.budgets["b"].cores)
    assert grown.budgets["b"].cores == tuple(range(8))
    again = allocate(m, [Claim("a"), Claim("b")], {}, current=held)
    assert again.budgets == held


def test_foreign_load_is_handed_out_last():
    m = machine(8)
    alloc = allocate(m, [Claim("a"), Claim("b")], {}, taken_cores=2)
    assert sum(len(b.cores) for b in alloc.budgets.values()) == 6
    # the cores a foreign process is pinned to: handed out to no job while others are free
    alloc = allocate(busy_last(m, [0, 3]), [Claim("a"), Claim("b")], {}, taken_cores=2)
    held = {k for b in alloc.budgets.values() for k in b.cores}
    assert held == set(m.cores) - {0, 3}
    crowded = allocate(busy_last(m, [0, 3]), [Claim(str(j)) for j in range(8)], {}, taken_cores=2)
    assert sorted(k for b in crowded.budgets.values() for k in b.cores) == list(range(8))


def test_model_rates_from_the_throughput_model():
    """Two modelled jobs on a 16-core GPU host: a MuJoCo-like and a 4x heavier env step."""
    m = mujoco_like_model()
    rates = {"ant": model_rate(m, 1, 16), "humanoid": model_rate(replace(m, t_env=1.2e-3), 1, 16)}
    mv = machine(16, gpus=1)
    claims = [Claim("ant", gpu=0), Claim("humanoid", gpu=0)]
    alloc = allocate(mv, claims, rates)  # each job is charged its shares of the idle draw
    check(alloc, mv, claims)
    assert alloc.steps_per_joule >= alloc.equal_split_steps_per_joule
    more, fewer = rates["ant"](8, 50), rates["ant"](4, 50)
    assert more[0] > fewer[0] > 0


def test_parse_cores():
    assert parse_cores("0-3,8") == (0, 1, 2, 3, 8)
    for bad in ("3-1", "a", "", "-2"):
        with pytest.raises(ValueError, match="expected a list such as 0-3,8"):
            parse_cores(bad)


def test_every_partition_of_a_small_machine_is_no_better_than_the_search():
    """On 6 cores and three jobs, the search's total is the best of every partition that keeps
    the floors (its moves are one core at a time, and these surfaces are concave)."""
    m = machine(6)
    rates = {
        "a": saturating(2.0, 1.5),
        "b": scaling(1.0, w_core=8.0),
        "c": saturating(4.0, 1.0, w_core=12.0),
    }
    claims = [Claim(j, min_share=0.5) for j in rates]
    alloc = allocate(m, claims, rates, idle_w=30.0)
    floors = {j: alloc.predicted[j]["floor"] for j in rates}
    best = 0.0
    for n in itertools.product(range(1, 5), repeat=3):
        if sum(n) != 6:
            continue
        out = [rates[j](k, 0) for j, k in zip(rates, n, strict=True)]
        if any(o[0] < floors[j] - 1e-9 for o, j in zip(out, rates, strict=True)):
            continue
        best = max(best, sum(o[0] for o in out) / (30.0 + sum(o[1] for o in out)))
    assert alloc.steps_per_joule == pytest.approx(best, rel=1e-9)


def test_a_fixed_budget_on_a_gpu_must_name_its_share():
    """Without one it would hold the GPU unbounded while the others were given all of it."""
    m = machine(8, gpus=1)
    unbounded = Claim("f", fixed=Budget((0, 1), 0, None), gpu=0)
    assert "a fixed budget on GPU 0 must name its MPS share" in " ".join(unbounded.problems(m))
    with pytest.raises(AllocationError, match="must name its MPS share"):
        allocate(m, [unbounded, Claim("a", gpu=0)], {})
    claims = [Claim("f", fixed=Budget((0, 1), 0, 40), gpu=0), Claim("a", gpu=0)]
    alloc = allocate(m, claims, {})
    assert alloc.budgets["f"].mps_pct == 40 and alloc.budgets["a"].mps_pct == 60
    check(alloc, m, claims)


def test_every_job_on_a_gpu_keeps_a_share_a_gmi_can_run_at():
    assert min(MPS_CHOICES) == MIN_GMI_PCT  # the least share a GMI is started with
    m = machine(8, gpus=1)
    fixed = Claim("f", fixed=Budget((0,), 0, 90), gpu=0)
    assert check_admission(m, [fixed], Claim("a", gpu=0)) is None  # 10 % left for one job
    why = check_admission(m, [fixed, Claim("a", gpu=0)], Claim("b", gpu=0))
    assert "GPU 0 has 10 % of its SMs not fixed to jobs, and 2 jobs would share it at 10 %" in why
    why = check_admission(m, [Claim("f", fixed=Budget((0,), 0, 92), gpu=0)], Claim("a", gpu=0))
    assert "GPU 0 has 8 % of its SMs not fixed to jobs" in why  # no GMI runs at 8 %
    assert "must be within 10..100 %, got 5" in check_admission(
        m, [], Claim("x", fixed=Budget((1,), 0, 5), gpu=0)
    )
    # however little a job's model says the GPU helps it, it keeps a share its GMIs can run at
    rates = {"flat": lambda cores, pct: (3000.0, 40.0), "ant": scaling(2000.0, gpu_gain=1.0)}
    claims = [Claim(j, gpu=0, min_share=0.0) for j in rates]
    alloc = allocate(m, claims, rates, idle_w=100.0)
    assert alloc.budgets["flat"].mps_pct == MIN_GMI_PCT and alloc.budgets["ant"].mps_pct == 90
    assert "is not on this machine" in check_admission(
        m, [], Claim("x", fixed=Budget((1,), 3, 10), gpu=None)
    )


def test_a_job_whose_model_says_cores_do_not_help_keeps_its_floor_in_resources():
    """A model probed on a loaded machine can call a job flat in cores and GPU share; the
    floor still leaves it ``min_share`` of its equal-split cores and share (the daemon once
    gave such a job 1 core of 15)."""
    m = machine(15, gpus=1)
    rates = {
        "flat": lambda cores, pct: (3000.0, 40.0),
        "ant": scaling(2000.0, gpu_gain=1.0),
        "ant2": scaling(2000.0, gpu_gain=1.0),
    }
    claims = [Claim(j, gpu=0) for j in rates]
    alloc = allocate(m, claims, rates, idle_w=100.0)
    check(alloc, m, claims)
    assert len(alloc.budgets["flat"].cores) == math.floor(0.8 * 5)
    assert alloc.budgets["flat"].mps_pct == 20  # 0.8 of its 30 % in the equal split, in 5 % steps
    loose = allocate(m, [Claim(j, gpu=0, min_share=0.0) for j in rates], rates, idle_w=100.0)
    assert len(loose.budgets["flat"].cores) == 1  # no floor: all it can lose


def test_a_shrinking_job_gives_up_the_cores_a_foreign_process_is_pinned_to_first():
    m = machine(8)
    held = {"a": Budget(tuple(range(8)))}
    alloc = allocate(busy_last(m, [0]), [Claim("a"), Claim("b")], {}, current=held)
    assert 0 not in alloc.budgets["a"].cores and 0 in alloc.budgets["b"].cores


def test_the_daemon_hands_out_every_core_unless_told_to_keep_some(monkeypatch, tmp_path, capsys):
    """No core is kept for the daemon by default (it mostly sleeps); ``--reserve-cores N``
    keeps the lowest N, and a reserve outside 0..cores-1 is refused saying what is allowed."""
    import os

    from autotune.control.machine import detect

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 1, 2, 0})
    assert detect(sms=False).cores == (0, 1, 2, 3) and detect(sms=False).reserved == ()
    kept = detect(1, sms=False)
    assert kept.reserved == (0,) and kept.cores == (1, 2, 3)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=r"reserve of .* allowed are 0\.\.3"):
            detect(bad, sms=False)
    # and `autotune daemon start` refuses it before a daemon is started, writing no log
    from autotune.cli.main import main

    home = tmp_path / "home"
    monkeypatch.setenv("AUTOTUNE_HOME", str(home))
    monkeypatch.setenv("AUTOTUNE_CONTROL", f"ipc://{tmp_path}/control.sock")
    assert main(["daemon", "start", "--reserve-cores", "4"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "--reserve-cores: a reserve of 4 cores: allowed are 0..3" in said, said
    assert not (home / "daemon.log").exists()


def test_a_jobs_cpu_energy_share_is_of_the_machines_cores_not_only_the_daemons():
    """A daemon on part of the machine (a second daemon on the other cores, a container's
    cpuset) charges its jobs their cores' share of the whole packages, which the CPU meters
    read, so two daemons never charge the packages twice; on the whole machine the shares of
    the cores it hands out sum to one."""
    from autotune.control.allocator import Budget
    from autotune.control.machine import energy_shares

    half = MachineView.from_dict({"cores": [0, 1, 2, 3], "online": 8})
    other = MachineView.from_dict({"cores": [4, 5, 6, 7], "online": 8})
    shares = [energy_shares(m, Budget(m.cores[:2])) for m in (half, other)]
    assert [s["cpu_share"] for s in shares] == [0.25, 0.25]
    whole = MachineView.from_dict({"cores": [1, 2, 3], "reserved": [0], "online": 4})
    split = [energy_shares(whole, Budget(c)) for c in ((1,), (2, 3))]
    assert sum(s["cpu_share"] for s in split) == pytest.approx(1.0)
    assert MachineView.from_dict(whole.to_dict()) == whole
    unknown = MachineView.from_dict({"cores": 4})  # a description without the online count
    assert energy_shares(unknown, Budget((0, 1)))["cpu_share"] == 0.5
