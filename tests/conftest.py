"""Shared test set-up: the ``gpu`` marker skips where NVML or CUDA is absent; the suite runs
on two pytest-xdist workers (``pyproject.toml``), each with its own temp dir."""

from __future__ import annotations

import functools
import os
import signal
import tempfile

import pytest

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # pytest started as a background job (a shell without job control ignores SIGINT for it):
    # every command a test starts would inherit the ignored SIGINT, and the runs and benchmark
    # arms stopped with Ctrl-C would not take it, each waiting out its stop's grace period
    # before a SIGKILL. Restored, they take it as a terminal's foreground job does.
    signal.signal(signal.SIGINT, signal.default_int_handler)

if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # each worker's runs in their own temp dir: a run sweeps the private directories of dead
    # runs in $TMPDIR at its start, which must not reach another worker's test of that sweep
    _tmp = os.path.join(tempfile.gettempdir(), f"autotune-tests-{os.getuid()}-{worker}")
    os.makedirs(_tmp, mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = _tmp
    tempfile.tempdir = None  # gettempdir() reads $TMPDIR again
    # and their daemons' locks on this machine's cores (one worker's must not refuse the other's)
    os.environ["AUTOTUNE_MACHINE_LOCKS"] = os.path.join(_tmp, "machine-locks")

from runtime.hw.gpus import no_gpu_reason


@functools.lru_cache(maxsize=1)
def _gpu_missing_reason() -> str | None:
    return no_gpu_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or _gpu_missing_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def postgres_url() -> str:
    """A PostgreSQL storage URL (``$AUTOTUNE_TEST_POSTGRES``, which ``.ci/run`` sets after
    ``.ci/postgres.sh start``); the test is skipped, saying why, where there is none."""
    import os

    url = os.environ.get("AUTOTUNE_TEST_POSTGRES")
    if not url:
        pytest.skip(
            "no PostgreSQL server: set AUTOTUNE_TEST_POSTGRES=postgresql://... "
            "(.ci/run starts one with .ci/postgres.sh)"
        )
    pytest.importorskip("psycopg", reason="the postgres extra: pip install -e '.[postgres]'")
    import sqlalchemy

    from autotune.tuning.storage import storage_url

    try:
        sqlalchemy.create_engine(storage_url(url)).connect().close()
    except Exception as exc:  # any driver error means the server cannot be used
        pytest.skip(f"PostgreSQL at {url} does not answer: {exc}")
    return url


def wait_until(ready, proc=None, timeout_s: float = 300.0, what: str = "progress") -> None:
    """Waits until ``ready()`` is true, checking twice a second: a test that drives a real run
    waits on its progress, never on a fixed number of seconds, so a loaded machine only makes
    it slower. Fails, naming ``what``, if ``proc`` exits first or ``timeout_s`` passes."""
    import time

    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.5)


def kill_daemon(home) -> None:
    """Ends the daemon of state dir ``home`` at once (SIGKILL); nothing if none answers. For a
    test done with its daemon whose stop is not what it checks (``autotune daemon stop``
    waits for a clean exit, which the daemon tests check on their own daemons)."""
    import os
    import signal

    from autotune.control import protocol

    pong = protocol.request(f"ipc://{home}/control.sock", protocol.MsgType.PING, timeout_s=30.0)
    if pong is not None:
        os.kill(int(pong["pid"]), signal.SIGKILL)


def mujoco_like_model():
    """A throughput/power model of a MuJoCo-like job on a 16-core GPU host (0.3 ms per env
    step), for tests of the allocator's rates and the daemon's sizing."""
    from autotune.tuning.perf_model import MachineModel

    return MachineModel(
        cores=16,
        rollout_len=32,
        t_env=3e-4,
        f0=2e-4,
        f1=2e-5,
        learner={"cpu": (0.05, 6e-5), "cuda": (0.01, 2e-6)},
        gpu_idle_w=70.0,
        gpu_limit_w=700.0,
        cpu_idle_w=24.0,
    )


@pytest.fixture
def live_pids():
    """``pids(n)``: the ids of ``n`` running processes (sleepers, ended after the test), for
    described jobs whose processes must be alive: the daemon drops what a gone process held."""
    import subprocess
    import sys

    procs: list[subprocess.Popen] = []

    def pids(n: int) -> list[int]:
        code = "import time; time.sleep(600)"
        procs.extend(subprocess.Popen([sys.executable, "-c", code]) for _ in range(n))
        return [p.pid for p in procs[-n:]]

    yield pids
    for p in procs:
        p.kill()
        p.wait()


def record_train_study(study, trials, base, trial_s: float, machine: dict) -> None:
    """Records on ``study`` what ``autotune study`` records of a training study it makes
    (``autotune.workflows.study.make_study``): the workload, the base config, the fixed and
    default knob values and the machine, for tests that drive an ``OfflineStudy`` by hand."""
    study.set_user_attr(
        "autotune",
        {
            "kind": "train",
            "objective": "steps_per_joule",
            "env": base.env,
            "policy": base.policy,
            "trial_s": trial_s,
            "warmup_s": trials.warmup_s,
            "base": base.to_dict(),
            "fixed": trials.fixed,
            "default": trials.default(),
            "machine": machine,
        },
    )
