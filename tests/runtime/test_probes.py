"""The workload probes on this machine, in their child process, and their cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import probe_cache
from runtime.probes import ProbeError, Probes, run_probes

pytestmark = pytest.mark.slow
WORKLOAD = ("CartPole-v1", "auto:64:64:auto", 32, {}, ["cpu"])


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Probes, Path]:
    """One real measurement, shared: the cache's first look-up of a workload in an empty cache
    directory runs ``run_probes`` (an actor per usable core) and returns what it measured.
    Gives the probes and that directory."""
    cache = tmp_path_factory.mktemp("probe-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOTUNE_CACHE_DIR", str(cache))
        return probe_cache.probes(*WORKLOAD), cache


def test_probes_measure_the_env_the_forward_and_two_learner_sizes_at_least(measured):
    p = measured[0]
    assert 0 < p.env_step_s < 0.01 and set(p.forward_s) == {1, 8, 32}
    # an actor's rounds (envs stepped, one forward) with one process per usable core (two on
    # a 2-core machine) at once as well: what an actor pays with the cores full, at two env counts
    assert set(p.round_loaded_s) == {2, 16}
    assert 0 < p.round_loaded_s[2] < p.round_loaded_s[16] < 0.05
    g0, g1 = p.loaded_round_fit()
    # a per-env cost and a fixed cost; not compared with env_step_s: the two are timed at
    # different moments, and on a shared machine either may be the one that was crowded
    assert g0 >= 0 and g1 > 0 and p.load_factor() >= 1.0
    sizes = sorted(p.learners["cpu"].seconds)
    assert len(sizes) >= 2 and sizes[0] == 1024  # a fixed cost needs two points to show
    c0, c1 = p.learners["cpu"].fit()
    assert c0 >= 0 and c1 > 0
    assert Probes.from_dict(p.to_dict()) == p
    assert p.measured_at > 0 and not p.cached
    assert {"env", "env_loaded", "torch", "forward", "learner_cpu"} <= set(p.stage_s)


def test_a_device_far_slower_than_one_probed_before_is_timed_at_one_size(monkeypatch):
    """A big policy's CPU update takes seconds per size: once another device is many times
    faster at the smallest batch, the slow one is not timed at larger ones."""
    from runtime import probes
    from runtime.envs import probe_env

    info = probe_env("CartPole-v1")
    monkeypatch.setattr(probes, "LEARNER_STOP_S", 0.0)  # every update counts as slow
    alone = probes.probe_learner(info, "auto:16:auto", "cpu", 32, {})
    assert len(alone.seconds) >= 2
    fast = probes.LearnerCost("cuda", {1024: 1e-9})
    beaten = probes.probe_learner(info, "auto:16:auto", "cpu", 32, {}, rival=fast)
    assert list(beaten.seconds) == [1024]
    assert beaten.fit()[1] == pytest.approx(beaten.seconds[1024] / 1024)  # through the origin
    # a rival not many times faster: no cut (slower than any timing here, so that a loaded
    # machine timing the CPU slower than it did alone cannot make it look dominated)
    close = probes.LearnerCost("cuda", {size: 1e9 for size in alone.seconds})
    assert len(probes.probe_learner(info, "auto:16:auto", "cpu", 32, {}, rival=close).seconds) >= 2


def test_an_eager_learner_is_timed_for_one_epoch_and_scaled_to_the_runs(monkeypatch):
    """The CPU learner's probe times a learner of the run's settings but one epoch per update,
    and counts each timing ``epochs`` times: an eager update is its epochs' same work. (Spied,
    not compared with a whole update's timing: two timings seconds apart on a loaded 2-core
    machine differ by over 3x.)"""
    from runtime import probes
    from runtime.envs import probe_env

    made, timings = [], []
    real_make, real_timed = probes.make_learner, probes.timed

    def make(info, policy, device, learner, graphs=True):
        made.append(dict(learner))
        return real_make(info, policy, device, learner, graphs)

    def timed(fn, budget_s, least, first=None, clock=None):
        timings.append(real_timed(fn, budget_s=budget_s, least=least, first=first, clock=clock))
        return timings[-1]

    monkeypatch.setattr(probes, "make_learner", make)
    monkeypatch.setattr(probes, "timed", timed)
    learner = {"epochs": 8, "minibatches": 4}
    info = probe_env("CartPole-v1")
    cost = probes.probe_learner(info, "auto:64:64:auto", "cpu", 32, learner)
    assert made == [{"epochs": 1, "minibatches": 4}]  # the run's settings, one epoch
    assert list(cost.seconds.values()) == [8 * t for t in timings] and len(timings) >= 2
    # a learner handed in (the graphed CUDA one: a whole update replayed) is timed as it is
    made.clear(), timings.clear()
    _, update = real_make(info, "auto:64:64:auto", "cpu", learner)
    cost = probes.probe_learner(info, "auto:64:64:auto", "cpu", 32, learner, update=update)
    assert not made and list(cost.seconds.values()) == timings


def test_a_workload_that_cannot_be_probed_says_why():
    with pytest.raises(ProbeError, match="NoSuchEnv"):
        run_probes("NoSuchEnv-v0", "auto", 32, {}, ["cpu"])


def test_the_cache_keeps_a_workload_per_machine_and_refresh_measures_again(measured, monkeypatch):
    first, cache = measured  # measured in this empty cache directory
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(cache))
    env, policy, rollout, learner, devices = WORKLOAD
    again = probe_cache.probes(env, policy, rollout, learner, devices)
    assert not first.cached and again.cached and again.env_step_s == first.env_step_s
    other = probe_cache.probes(env, policy, 16, learner, devices)
    assert not other.cached  # another rollout length is another workload
    refreshed = probe_cache.probes(env, policy, rollout, learner, devices, refresh=True)
    assert not refreshed.cached
    for path in (cache / "probes").glob("*.json"):
        path.write_text("{not json")  # an unreadable entry is measured again, not trusted
    assert not probe_cache.probes(env, policy, rollout, learner, devices).cached


def test_the_learner_is_timed_at_batches_of_two_trajectories_per_minibatch_or_more():
    """At PPO's 32 minibatches of 32-step trajectories the smallest batch timed is 2,048: at
    1,024 each minibatch would be one trajectory, which runs the plain loss where the larger
    ones run the compiled one."""
    from runtime import probes

    assert probes.learner_batches(32, 32) == [2048, 4096, 16384]
    assert probes.learner_batches(4, 32) == list(probes.LEARNER_BATCHES)
    assert probes.learner_batches(64, 128) == [16384, 65536]  # two sizes, the fixed cost seen


def test_timing_keeps_the_first_calls_seconds_apart():
    """A learner's first update at a shape compiles and captures; the probes time the calls
    after it, and say what the first took (``stage_s['learner_cuda.first']``)."""
    import time

    from runtime.env_probes import timed

    calls, first = [], []

    def update():
        calls.append(1)
        time.sleep(0.05 if len(calls) == 1 else 0.001)

    assert timed(update, budget_s=0.01, least=3, first=first) < 0.02
    assert len(first) == 1 and first[0] >= 0.05 and len(calls) >= 4


def test_a_run_whose_workload_another_run_is_probing_waits_and_takes_its_result(
    measured, tmp_path, monkeypatch
):
    """Two runs of one workload started together probe it once: while one holds the entry's
    lock (here the test, as the run that measures), the other waits for it and reads what it
    wrote, with no probe of its own."""
    import json
    import os
    import subprocess
    import sys
    import threading

    first, _ = measured
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    path = probe_cache.entry_path(*WORKLOAD)
    code = (
        "import json, logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "from runtime import probe_cache\n"
        f"p = probe_cache.probes(*{WORKLOAD!r})\n"
        "print(json.dumps({'cached': p.cached, 'measured_at': p.measured_at}))\n"
    )
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path)}
    with probe_cache._measuring(path) as waited:
        assert not waited
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: list[str] = []
        told = threading.Event()

        def read() -> None:
            for line in child.stderr:
                lines.append(line)
                if "another run on this machine is probing" in line:
                    told.set()

        threading.Thread(target=read, daemon=True).start()
        assert told.wait(120), "".join(lines)  # the child is waiting on the lock
        probe_cache._write(path, first)  # what this "run" measured
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, "".join(lines)
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc == {"cached": True, "measured_at": first.measured_at}


def test_work_on_the_probes_thread_is_timed_on_its_clock_and_a_gpus_as_time_passes():
    """Seconds a probe's thread spent not running (asleep here; on a busy machine, waiting for
    a core another process holds) count neither for the policy forward nor for a CPU update:
    such a probe, cached, would size every later run; a GPU update's wait for its device does."""
    import time

    from runtime import probes
    from runtime.env_probes import timed
    from runtime.envs import probe_env

    def nap(*_):
        time.sleep(0.003)

    assert timed(nap, budget_s=0.02) >= 0.003
    assert timed(nap, budget_s=0.02, clock=time.thread_time) < 0.001
    info = probe_env("CartPole-v1")
    cpu = probes.probe_learner(info, "auto:16:auto", "cpu", 32, {}, update=nap)
    gpu = probes.probe_learner(info, "auto:16:auto", "cuda", 32, {}, update=nap)
    assert max(cpu.seconds.values()) < 0.001 and min(gpu.seconds.values()) >= 0.003
