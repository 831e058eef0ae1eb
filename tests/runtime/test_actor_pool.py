"""The actor pool's process set-up: one BLAS thread per actor, each actor pinned to a core of
its own, version-0 weights built once, and an actor's modules that never import torch."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import psutil
import pytest

from runtime.actor_placement import BLAS_THREAD_VARS, actor_cores, one_blas_thread, place_threads
from runtime.actor_pool import ActorPool, ActorSlot
from runtime.config import TrainConfig


def test_one_blas_thread_sets_the_variables_for_the_start_and_restores_them(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with one_blas_thread():
        assert all(os.environ[name] == "1" for name in BLAS_THREAD_VARS)
    assert os.environ["OMP_NUM_THREADS"] == "7" and "OPENBLAS_NUM_THREADS" not in os.environ


def test_initial_weights_are_built_once_per_policy_and_only_for_actor_inference(tmp_path):
    cfg = TrainConfig(env="CartPole-v1", trainer_device="cpu")
    pool = ActorPool(None, cfg.validate())
    first = pool.initial.arrays(cfg)
    assert first is not None and pool.initial.arrays(cfg) is first
    names, _ = first
    assert "pi.0.weight" in names and "obs_norm.mean" in names
    other = TrainConfig(env="CartPole-v1", trainer_device="cpu", seed=1)
    assert pool.initial.arrays(other) is not first
    gmi = TrainConfig(env="CartPole-v1", trainer_device="cpu", inference="gmi")
    assert pool.initial.arrays(gmi) is None and pool.initial.for_local(gmi) is None
    assert pool.initial.for_local(cfg) is first  # no run directory yet: the arrays themselves


def test_local_actors_get_the_weights_as_a_file_so_their_start_does_not_wait(tmp_path):
    """A spawn start blocks until the child reads arguments past the pipe's 64 KiB, after its
    imports: the weights go as a path (an ``.npz`` read without pickle), written once."""
    from multiprocessing.reduction import ForkingPickler

    from runtime.initial_weights import load

    cfg = TrainConfig(env="Pendulum-v1", trainer_device="cpu", policy="auto:256:128:64:auto")
    pool = ActorPool(None, cfg.validate())
    names, arrays = pool.initial.arrays(cfg)
    assert sum(a.nbytes for a in arrays) > 64 * 1024  # would have filled the pipe
    pool.initial.directory = tmp_path
    path = pool.initial.for_local(cfg)
    assert isinstance(path, str) and pool.initial.for_local(cfg) == path
    pool.initial.directory = tmp_path / "next"  # another run's directory: written there anew
    (tmp_path / "next").mkdir()
    assert pool.initial.for_local(cfg).startswith(str(tmp_path / "next"))
    assert len(ForkingPickler.dumps((cfg, pool.info, path))) < 16 * 1024
    back_names, back = load(path)
    assert back_names == names
    assert all((a == b).all() and a.dtype == b.dtype for a, b in zip(arrays, back, strict=True))
    (tmp_path / "bad.npz").write_bytes(b"not weights")
    with pytest.raises(ValueError, match="cannot read the initial weights"):
        load(str(tmp_path / "bad.npz"))


def test_an_actor_process_imports_no_torch():
    """Its modules, as a spawned actor imports them (torch costs ~1.7 s of CPU per start)."""
    code = (
        "import sys, runtime.actor, runtime.policy_io, policies.numpy_policy; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_actor_cores_take_the_ith_block_of_the_cpu_set(monkeypatch):
    from runtime.env_backends import actor_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert [actor_cores(i, 15, pin=True) for i in (0, 3, 14)] == [[0], [3], [14]]
    assert [actor_cores(i, 16, pin=True) for i in (0, 15)] == [[0], [15]]  # the stages share
    assert [actor_cores(i, 4, pin=True) for i in (0, 3)] == [[0, 1, 2, 3], [12, 13, 14, 15]]
    assert actor_cores(3, 17, pin=True) is None  # more actors than cores: the scheduler's
    assert actor_cores(3, 4, pin=False) is None
    assert [actor_threads(n) for n in (16, 8, 3, 32)] == [1, 2, 5, 1]  # EnvPool's, unpinned
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert actor_cores(3, 4) is None  # auto: the run shares the whole machine
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7, 2, 5})  # a daemon's budget
    assert [actor_cores(i, 2) for i in (0, 1)] == [[2], [5]]
    assert [actor_cores(i, 3) for i in (0, 2)] == [[2], [7]]


def _thread_cores(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}


def _actor_of_run(*flags_more: str, actors: int = 1) -> set[frozenset[int]]:
    """Starts a CartPole run with ``actors`` actors; the CPU sets of actor 0's threads, once it
    runs more than one thread (ZeroMQ's I/O thread, and EnvPool's where it steps on EnvPool)."""
    flags = f"--env CartPole-v1 --actors {actors} --envs-per-actor 4 --batch-size 256"
    flags += " --steps 100000000"
    cmd = [sys.executable, "-m", "autotune.cli", "train", *flags.split(), "--quiet"]
    cmd += ["--trainer-device", "cpu", *flags_more]
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert run.poll() is None, run.stderr.read()
            for p in psutil.Process(run.pid).children(recursive=True):
                try:
                    if "autotune: actor 0" in " ".join(p.cmdline()) and p.num_threads() > 1:
                        return _thread_cores(p.pid)
                except psutil.Error:
                    continue
            time.sleep(0.2)
        raise AssertionError("the run's actor did not start stepping within 240 s")
    finally:
        run.terminate()
        run.wait(60)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_runs_actor_and_every_thread_it_starts_run_on_its_own_core():
    cores = sorted(os.sched_getaffinity(0))
    block = frozenset(cores[: len(cores) // 2])  # actor 0 of two: the first half
    assert _actor_of_run("--pin-actors", "on", actors=2) == {block}
    assert _actor_of_run("--pin-actors", "off", actors=2) == {frozenset(cores)}


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_pin_puts_each_running_actor_on_its_core_and_spreads_those_without_one():
    """As after a daemon's new budget or a resize: the pool pins its running actors under
    the CPU set and actor count it has now."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_sleep, args=(60,), daemon=True)
    proc.start()
    try:
        whole = os.sched_getaffinity(0)
        pool = ActorPool(ctx, None)
        pool.count = 1
        cfg = TrainConfig(actors=1, pin_actors=True)
        pool.slots = [ActorSlot(0, 0, proc, None, None, cfg)]
        assert os.sched_getaffinity(proc.pid) == whole
        pool.count = 2  # two actors: slot 0 on the first half of the cores
        assert pool.pin() == 1
        assert os.sched_getaffinity(proc.pid) == set(sorted(whole)[: len(whole) // 2])
        pool.count = len(whole) + 1  # more actors than cores now: the scheduler places them
        assert pool.pin() == 0 and os.sched_getaffinity(proc.pid) == whole
    finally:
        proc.kill()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_pin_replaces_an_envpool_actor_whose_thread_count_it_changes(monkeypatch):
    """An EnvPool actor starts its threads once: where ``pin`` gives it another number of
    cores, the pool replaces it by a new incarnation (given the endpoints to start it with);
    a gymnasium actor, or a pin without endpoints, is only moved."""
    pytest.importorskip("envpool")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_sleep, args=(60,), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    started = []

    def fake_start(cfg, ep, index):
        started.append((cfg.env_backend, index))
        return ActorSlot(index, 1, procs[1], None, ctx.Event(), cfg, threads=1)

    try:
        pool = ActorPool(ctx, None)
        monkeypatch.setattr(pool, "_start", fake_start)
        pool.count = 1  # one actor: all cores, one EnvPool thread each
        want = len(os.sched_getaffinity(0))
        for backend, ep in (("gymnasium", "ep"), ("envpool", None)):
            cfg = TrainConfig(env="CartPole-v1", env_backend=backend, pin_actors=True)
            pool.slots = [ActorSlot(0, 0, procs[0], None, ctx.Event(), cfg, threads=want + 1)]
            assert pool.pin(ep) == 1 and not started and not pool.leaving
        cfg = TrainConfig(env="CartPole-v1", env_backend="envpool", pin_actors=True)
        old = ActorSlot(0, 0, procs[0], None, ctx.Event(), cfg, threads=want + 1)
        pool.slots = [old]
        assert pool.pin("ep") == 1 and started == [("envpool", 0)]
        # stopped at once (a respawn is made before broken; here its cores may be another's)
        assert pool.leaving == [old] and old.stop.is_set() and pool.slots[0].incarnation == 1
        # cores outside this CPU set are not taken, and such an actor is not counted pinned
        assert not place_threads(pool.slots[0].process.pid, pool.slots[0].key, {10_000})
    finally:
        for p in procs:
            p.kill()


@pytest.fixture
def respawned(monkeypatch):
    """A pool of two actors (sleeping processes, 5 steps each) just respawned: each slot's
    next incarnation (a sleeping process, no steps yet) started, the old ones leaving. Gives
    the pool, the old slots and the new ones."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_sleep, args=(60,), daemon=True) for _ in range(4)]
    for p in procs:
        p.start()
    spare = iter(procs[2:])

    def fake_start(cfg, ep, index):
        return ActorSlot(index, 1, next(spare), ctx.RawValue("q", 0), ctx.Event(), cfg)

    try:
        pool = ActorPool(ctx, None)
        monkeypatch.setattr(pool, "_start", fake_start)
        cfg = TrainConfig(env="CartPole-v1", actors=2, pin_actors=False)
        olds = [ActorSlot(i, 0, procs[i], ctx.RawValue("q", 5), ctx.Event(), cfg) for i in (0, 1)]
        pool.slots, pool.count = list(olds), 2
        pool.respawn(cfg, "ep")
        yield pool, olds, list(pool.slots)
    finally:
        for p in procs:
            p.kill()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_respawned_actor_steps_on_until_its_successor_has_stepped(respawned):
    """Make before break: a respawn starts each slot's next incarnation and leaves the old one
    running; the old one is told to stop once its successor has stepped (or has died), so
    the run keeps sampling while the new processes start."""
    pool, olds, news = respawned
    assert pool.leaving == olds and [s.incarnation for s in news] == [1, 1]
    pool.check("ep")
    assert not any(s.stop.is_set() for s in olds)  # no successor has stepped yet
    news[0].stepped.value = 1
    pool.check("ep")
    assert olds[0].stop.is_set() and not olds[1].stop.is_set()
    news[1].process.kill()
    news[1].process.join(10)
    pool.check(None)  # a successor that died ends its predecessor's hand-over too
    assert olds[1].stop.is_set()
    assert pool.sampled_steps() == 10 + 1  # the old incarnations' steps still count


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_successor_removed_before_it_stepped_takes_its_predecessor_with_it(respawned):
    """A resize that removes a slot mid-respawn stops the old incarnation still stepping for
    it too: the run no longer has that slot."""
    pool, olds, _ = respawned
    pool.resize(TrainConfig(env="CartPole-v1", actors=1, pin_actors=False), "ep")
    assert olds[1].stop.is_set() and olds[1].successor is None
    assert not olds[0].stop.is_set()  # slot 0 stays: its old one waits for its successor


def test_a_remote_actor_that_exits_on_its_own_is_counted_at_its_exact_final_steps(monkeypatch):
    """A Ray actor whose run returned (exit code, steps) is recorded with those steps, not the
    last telemetry's (which lag by up to a report and miss the rollout it never sent)."""
    pytest.importorskip("ray")
    from runtime.cluster import launcher
    from runtime.envs import EnvInfo

    class Telemetry:
        def source(self, name):
            stepped = {"stepped": 900} if name.startswith("actor-") else {}
            return stepped or {"complete_steps": {"0:0": 896}}

    class Handle:
        class node:  # the Ray handle's method name
            @staticmethod
            def remote():
                return "node"

    monkeypatch.setattr(launcher.ray, "wait", lambda refs, timeout=None: (list(refs), []))
    monkeypatch.setattr(launcher.ray, "get", lambda ref: (3, 1000))  # its exit code and steps
    proc = launcher.RayProcess(Handle(), "run")
    proc.stepped = launcher.RemoteStepped(Telemetry(), proc, 0, 0)

    class Launcher:
        def tick(self):
            pass

    pool = ActorPool(None, EnvInfo("x", 4, True, 2))
    pool.launcher = Launcher()
    pool.slots = [ActorSlot(0, 0, proc, proc.stepped, None, TrainConfig())]
    pool.check(None)
    assert pool.ended.stepped == {"0:0": 1000} and pool.sampled_steps() == 1000
