"""The actor pool's process set-up: one BLAS thread per actor, version-0 weights built once,
and an actor's modules that never import torch."""

from __future__ import annotations

import os
import subprocess
import sys

from runtime.actor_pool import BLAS_THREAD_VARS, ActorPool, one_blas_thread
from runtime.config import TrainConfig


def test_one_blas_thread_sets_the_variables_for_the_start_and_restores_them(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with one_blas_thread():
        assert all(os.environ[name] == "1" for name in BLAS_THREAD_VARS)
    assert os.environ["OMP_NUM_THREADS"] == "7" and "OPENBLAS_NUM_THREADS" not in os.environ


def test_initial_weights_are_built_once_per_policy_and_only_for_actor_inference():
    cfg = TrainConfig(env="CartPole-v1", trainer_device="cpu")
    pool = ActorPool(None, cfg.validate())
    first = pool.initial_weights(cfg)
    assert first is not None and pool.initial_weights(cfg) is first
    names, _ = first
    assert "pi.0.weight" in names and "obs_norm.mean" in names
    other = TrainConfig(env="CartPole-v1", trainer_device="cpu", seed=1)
    assert pool.initial_weights(other) is not first
    gmi = TrainConfig(env="CartPole-v1", trainer_device="cpu", inference="gmi")
    assert pool.initial_weights(gmi) is None


def test_an_actor_process_imports_no_torch():
    """Its modules, as a spawned actor imports them (torch costs ~1.7 s of CPU per start)."""
    code = (
        "import sys, runtime.actor, runtime.policy_io, policies.numpy_policy; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
