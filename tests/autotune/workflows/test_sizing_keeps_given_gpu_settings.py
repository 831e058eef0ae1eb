"""A GPU setting given on the command line (an MPS share, GPUs) keeps the trainer on a GPU
when its device is left to the sizing: the given value is never dropped for a CPU trainer. A
held value outside the space a tuned run's ``--knob`` pins moves into it."""

from __future__ import annotations

import json
import time

from autotune.workflows.auto_size import size_config
from runtime import probe_cache
from runtime.config import TrainConfig
from runtime.probe_results import LearnerCost, Probes

ENV, POLICY = "CartPole-v1", "auto:64:64:auto"


def test_an_explicit_mps_share_keeps_the_trainer_on_the_gpu_where_the_cpu_would_win(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    cfg = TrainConfig(env=ENV, policy=POLICY, env_backend="gymnasium", steps=200_000)
    cfg = TrainConfig(**{**cfg.__dict__, "mps_pct": (50,)})
    learner = cfg.learner.to_dict()
    costs = {  # the CPU learner a thousand times faster: the sizing alone would pick it
        "cpu": LearnerCost("cpu", {1024: 0.003, 4096: 0.011}),
        "cuda": LearnerCost("cuda", {1024: 3.0, 4096: 11.0}),
    }
    rounds = {"round_loaded_s": {2: 50e-6, 16: 300e-6}, "backend": "gymnasium"}
    forward = {1: 20e-6, 8: 25e-6, 32: 45e-6}
    probes = Probes(ENV, POLICY, 25e-6, forward, costs, [132], measured_at=time.time(), **rounds)
    path = probe_cache.entry_path(ENV, POLICY, 32, learner, ["cpu", "cuda"], "gymnasium")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(probes.to_dict()))
    auto = {"actors", "envs_per_actor", "batch_size", "trainer_device", "trainers"}
    sized, doc = size_config(cfg, auto)
    assert (sized.trainer_device, sized.mps_pct) == ("cuda", (50,))
    assert doc["rules"]["fixed"]["trainer_device"] == "cuda"
    free, _ = size_config(TrainConfig(**{**cfg.__dict__, "mps_pct": None}), auto)
    assert free.trainer_device == "cpu"  # without the share, the faster learner is picked


def test_a_held_value_outside_the_tuned_space_starts_inside_it(tmp_path, monkeypatch):
    """``--tune --knob trainer_threads=2``: the run starts with 2 threads, not the default 1
    the tuner could never have chosen."""
    test_an_explicit_mps_share_keeps_the_trainer_on_the_gpu_where_the_cpu_would_win(
        tmp_path, monkeypatch
    )  # the probes cached
    cfg = TrainConfig(env=ENV, policy=POLICY, env_backend="gymnasium", steps=200_000)
    auto = {"actors", "envs_per_actor", "batch_size", "trainer_device", "trainers"}
    sized, doc = size_config(cfg, auto, allowed={"trainer_threads": (2, 4)})
    assert sized.trainer_threads == 2 and doc["rules"]["fixed"]["trainer_threads"] == 2
