"""Where ``auto`` could step the env on either backend, sizing probes the env on both and sizes
the run on each; it keeps EnvPool (``auto``'s own resolution) unless the other is predicted
better by a margin, and says what it predicted for each."""

from __future__ import annotations

import json
import time

import pytest

from autotune.workflows.auto_size import BACKEND_MARGIN, pick_backend, size_config
from runtime import probe_cache
from runtime.config import TrainConfig
from runtime.probe_results import LearnerCost, Probes
from runtime.probes import other_backend

ENV, POLICY = "CartPole-v1", "auto:64:64:auto"
AUTO = {"actors", "envs_per_actor", "batch_size"}


def test_the_resolved_backend_stands_unless_another_is_predicted_better_by_the_margin():
    def pred(sps: float, spj: float) -> dict[str, float]:
        return {"steps_per_s": sps, "steps_per_joule": spj}

    close = {"envpool": pred(1000, 50.0), "gymnasium": pred(1040, 50.0 * BACKEND_MARGIN)}
    assert pick_backend("envpool", close, "steps_per_joule") == "envpool"
    assert pick_backend("envpool", close, "steps_per_s") == "envpool"
    far = {"envpool": pred(1000, 50.0), "gymnasium": pred(1200, 60.0)}
    assert pick_backend("envpool", far, "steps_per_joule") == "gymnasium"
    assert pick_backend("envpool", far, "goodput_per_joule") == "gymnasium"  # sized for steps/J
    assert pick_backend("envpool", {"envpool": pred(1000, 50.0)}, "steps_per_s") == "envpool"


def _probes(env_step_s: float, round_16_s: float, other: tuple[float, float]) -> Probes:
    """CartPole-like probes of a 2-core machine on EnvPool with gymnasium's figures beside:
    ``(env_step_s, round_16_s)`` each (an actor round of 16 envs with every core busy)."""
    return Probes(
        ENV,
        POLICY,
        env_step_s,
        {1: 20e-6, 8: 25e-6, 32: 45e-6},
        {"cpu": LearnerCost("cpu", {1024: 0.03, 4096: 0.11})},
        measured_at=time.time(),
        round_loaded_s={2: round_16_s / 6, 16: round_16_s},
        backend="envpool",
        other_backends={
            "gymnasium": {"env_step_s": other[0], "round_loaded_s": {2: other[1] / 6, 16: other[1]}}
        },
    )


@pytest.mark.parametrize(
    ("envpool", "gymnasium", "chosen"),
    [((40e-6, 900e-6), (4e-6, 90e-6), "gymnasium"), ((4e-6, 90e-6), (40e-6, 900e-6), "envpool")],
)
def test_a_run_is_sized_on_each_backend_and_steps_on_the_one_predicted_better(
    tmp_path, monkeypatch, envpool, gymnasium, chosen
):
    pytest.importorskip("envpool")
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    cfg = TrainConfig(env=ENV, policy=POLICY, trainer_device="cpu", steps=100_000)
    learner = cfg.learner.to_dict()
    path = probe_cache.entry_path(ENV, POLICY, 32, learner, ["cpu"], "envpool", ("gymnasium",))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_probes(*envpool, gymnasium).to_dict()))  # read, not measured

    sized, doc = size_config(cfg, AUTO)
    assert doc["probes"]["cached"]
    assert sized.env_backend == chosen and doc["env_backend"]["chosen"] == chosen
    predicted = doc["env_backend"]["predicted"]
    assert set(predicted) == {"envpool", "gymnasium"}
    worse = "envpool" if chosen == "gymnasium" else "gymnasium"
    assert predicted[chosen]["steps_per_joule"] > predicted[worse]["steps_per_joule"]
    # the section's probes and model are the chosen backend's
    assert doc["probes"]["backend"] == chosen and doc["predicted"] == predicted[chosen]


def test_a_gymnasium_or_explicit_backend_is_not_compared(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    for backend in ("gymnasium", "envpool"):
        if backend == "envpool":
            pytest.importorskip("envpool")
        learner = TrainConfig().learner.to_dict()
        path = probe_cache.entry_path(ENV, POLICY, 32, learner, ["cpu"], backend)
        path.parent.mkdir(parents=True, exist_ok=True)
        own = _probes(10e-6, 200e-6, (1e-6, 20e-6))
        doc = {**own.to_dict(), "backend": backend, "other_backends": {}}
        path.write_text(json.dumps(doc))
        cfg = TrainConfig(env=ENV, policy=POLICY, trainer_device="cpu", env_backend=backend)
        sized, doc = size_config(cfg, AUTO)
        assert sized.env_backend == backend and list(doc["env_backend"]["predicted"]) == [backend]


def test_the_other_backends_env_figures_are_timed_and_read_back():
    """The probe child's part for a second backend: its env made, its step and its loaded
    rounds timed (a process per core); the figures survive the cache's JSON."""
    pytest.importorskip("envpool")
    from runtime.envs import probe_env

    info = probe_env(ENV, "gymnasium")
    other = other_backend(ENV, "envpool", info, 2, [info.obs_dim, 64, 64, info.act_dim])
    assert other is not None and 0 < other["env_step_s"] < 0.01
    assert set(other["round_loaded_s"]) == {2, 16}
    mine = _probes(10e-6, 200e-6, (1e-6, 20e-6))
    assert Probes.from_dict(json.loads(json.dumps(mine.to_dict()))) == mine
    theirs = mine.on_backend("gymnasium")
    assert theirs.backend == "gymnasium" and theirs.env_step_s == 1e-6
    assert theirs.round_loaded_s[16] == 20e-6 and not theirs.other_backends
    assert theirs.learners == mine.learners and mine.on_backend("envpool") is mine
