"""What the probe cache refuses to serve: an entry that is not an object, whose costs are not
finite numbers above 0, or that lacks the GPU learner a run on a GPU asks for; and the GPUs a
run's key names, as ``CUDA_VISIBLE_DEVICES`` shows them to it."""

from __future__ import annotations

import json
import time

import pytest

from policies.appo_config import APPOConfig
from runtime import probe_cache
from runtime.probe_results import LearnerCost, Probes

ENV, POLICY = "CartPole-v1", "auto:64:64:auto"
NAMES = ["NVIDIA H200", "NVIDIA A100"]


@pytest.mark.parametrize(
    "visible,seen",
    [
        (None, NAMES),
        ("1,0", ["NVIDIA A100", "NVIDIA H200"]),
        ("", []),  # every GPU hidden: probes of its own, with no GPU learner
        ("0,-1,1", ["NVIDIA H200"]),  # CUDA reads no further than an entry naming no GPU
        ("7", []),
        ("GPU-5e0c,MIG-2f1a", ["GPU-5e0c", "MIG-2f1a"]),
    ],
)
def test_the_key_names_the_gpus_cuda_will_use(visible, seen, monkeypatch):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert probe_cache.visible_gpus(NAMES) == seen


def _probes(learners: dict[str, dict[int, float]], sms: list[int]) -> Probes:
    return Probes(
        ENV,
        POLICY,
        10e-6,
        {1: 20e-6, 8: 25e-6},
        {d: LearnerCost(d, s) for d, s in learners.items()},
        sms,
        measured_at=time.time(),
        round_loaded_s={2: 40e-6, 16: 200e-6},
    )


def _broken(doc: dict) -> list:
    """Documents of an entry that must be measured again, not read (nor crash the run)."""
    nan = {**doc, "env_step_s": float("nan")}
    no_forward = {**doc, "forward_s": {}}
    no_points = {**doc, "learners": {"cpu": {"seconds": {}}}}
    negative = {**doc, "round_loaded_s": {"2": -1.0}}
    zero_size = {**doc, "learners": {"cpu": {"seconds": {"0": 0.1}}}}
    return [[], None, 1, "text", nan, no_forward, no_points, negative, zero_size]


def test_an_entry_that_is_not_sound_is_measured_again_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    good = _probes({"cpu": {2048: 0.05, 4096: 0.1}}, []).to_dict()
    path = probe_cache.entry_path(ENV, POLICY, 32, APPOConfig().to_dict(), ["cpu"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(good))
    assert probe_cache._read(path) is not None
    for doc in _broken(good):
        path.write_text(json.dumps(doc))
        assert probe_cache._read(path) is None, doc
    path.write_text("[" * 100_000 + "]" * 100_000)  # nested too deep for the parser
    assert probe_cache._read(path) is None


def test_probes_without_the_gpu_learner_serve_no_run_where_a_gpu_is_visible(monkeypatch):
    cpu_only = _probes({"cpu": {2048: 0.05}}, [])
    both = _probes({"cpu": {2048: 0.05}, "cuda": {2048: 0.004}}, [132])
    facts = probe_cache.machine_facts()
    monkeypatch.setattr(probe_cache, "machine_facts", lambda: {**facts, "gpus": ["NVIDIA H200"]})
    # CUDA did not start in the probes this time: not kept, and such an entry is not read
    assert not probe_cache._complete(cpu_only, ["cpu", "cuda"])
    assert probe_cache._serving(cpu_only, ["cpu", "cuda"]) is None
    assert probe_cache._serving(both, ["cpu", "cuda"]) is both
    assert probe_cache._serving(cpu_only, ["cpu"]) is cpu_only
    # where this process sees no GPU (none here, or all hidden), the CPU's figures are all
    monkeypatch.setattr(probe_cache, "machine_facts", lambda: {**facts, "gpus": []})
    assert probe_cache._complete(cpu_only, ["cpu", "cuda"])
    assert probe_cache._serving(cpu_only, ["cpu", "cuda"]) is cpu_only


@pytest.mark.parametrize("busy,kept", [(None, True), (2.0, True), (63.0, False)])
def test_probes_taken_while_another_process_used_the_gpu_are_not_kept(
    busy, kept, tmp_path, monkeypatch, caplog
):
    """The GPU busy (NVML utilisation) while the probes read it idle means another process
    used it: those probes size the run that took them, and a later run probes again."""
    from dataclasses import replace

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    facts = probe_cache.machine_facts()
    monkeypatch.setattr(probe_cache, "machine_facts", lambda: {**facts, "gpus": ["NVIDIA H200"]})
    measured = replace(
        _probes({"cpu": {2048: 0.05}, "cuda": {2048: 0.004}}, [132]), gpu_busy_pct=busy
    )
    assert Probes.from_dict(measured.to_dict()).gpu_busy_pct == busy  # kept in the document
    monkeypatch.setattr(probe_cache, "run_probes", lambda *a, **k: measured)
    got = probe_cache.probes(ENV, POLICY, 32, APPOConfig().to_dict(), ["cpu", "cuda"])
    assert got is measured and measured.gpu_shared() is not kept
    path = probe_cache.entry_path(ENV, POLICY, 32, APPOConfig().to_dict(), ["cpu", "cuda"])
    assert path.exists() is kept
    assert ("another process used the GPU" in caplog.text) is not kept
