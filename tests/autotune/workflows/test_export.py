"""``autotune export``: the recommendation by median, sizing, formats, bad input; and a study
opens in optuna-dashboard."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import record_train_study

from autotune.tuning.knobs import Machine, build_space
from autotune.tuning.offline_study import OfflineStudy, TrainTrials
from autotune.tuning.storage import open_study
from autotune.workflows.export import ExportError, dump, export_doc, load_config
from runtime.config import ConfigError, TrainConfig


def _runs(cfg: TrainConfig, warmup_s: float, meter=None):
    spj = {2: 10.0, 4: 30.0, 6: 20.0}[cfg.actors] + cfg.envs_per_actor
    rate = {"steps_per_s": spj * 100, "steps_per_joule": spj, "gpu_w": 50.0, "cpu_w": 20.0}
    return {"lost_steps": 0, "energy": {"cpu_source": "model"}}, rate


@pytest.fixture
def study(tmp_path):
    space = build_space(
        Machine(cores=6, gpus=1),
        [
            "actors=2,4,6",
            "envs_per_actor=8,16",
            "batch_size=1024",
            "trainers=1",
            "mps_pct=50",
            "trainer_device=cuda",
            "rollout_len=32",
            "chunk_bytes=262144",
            "inference=actor",
            "trainer_threads=1",
        ],
    )
    study = open_study(f"sqlite:///{tmp_path}/e.db", "e", seed=0, metrics=("steps_per_joule",))
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=20)
    trials = TrainTrials(space, base, 1.0, run=_runs)
    offline = OfflineStudy(study, trials, profile=False)
    record_train_study(study, trials, base, 20, {"cores": 6, "gpus": 1, "sm_count": 132})
    for _ in range(10):
        offline.step()
    return study


def test_export_recommends_the_best_median_config_and_sizes_a_target(study):
    doc = export_doc(study, target_gpus=8, target_cores=40)
    rec = doc["recommended"]
    assert rec["values"]["actors"] == 4 and rec["values"]["envs_per_actor"] == 16
    assert rec["runtime"] == {
        **rec["runtime"],
        "gmis_per_gpu": 1,
        "mps_pct_per_gmi": [50],
        "trainer_device": "cuda",
        "envs": 64,
    }
    assert rec["config"]["steps"] == TrainConfig().steps and rec["config"]["max_wall_s"] is None
    once = len(doc["evidence"]["recommended"]["trials"]) == 1
    assert (doc["evidence"]["confirm"] is not None) == once  # a pick measured once says so
    sizing = doc["sizing"]
    assert sizing["sms_granted_per_gpu"] == 66 and sizing["cpu_threads_per_sm"] == 4 / 66
    target = sizing["target"]
    # an actor per core; the GMIs and the stages share them (processes: 32 + 8 + 2)
    assert target["actors"] == 32 and target["cores_needed"] == 32
    assert target["cpu_processes_needed"] == 32 + 8 + 2
    assert target["fits"] is True and target["gpus_the_cores_can_feed"] == 10
    small = export_doc(study, target_gpus=8, target_cores=30)["sizing"]["target"]
    assert small["fits"] is False and small["gpus_the_cores_can_feed"] == 7
    assert "30 cores feed 7 GPU(s) at 4 actors per GPU" in small["note"]
    ev = doc["evidence"]
    assert ev["default"]["values"] == {"actors": 2, "envs_per_actor": 8}
    assert ev["steps_per_joule_vs_default"] == pytest.approx(46 / 18)
    for fmt in ("json", "yaml"):
        assert load_config_text(dump(doc, fmt), fmt) == TrainConfig.from_dict(rec["config"])


def load_config_text(text: str, fmt: str, tmp=None) -> TrainConfig:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"c.{fmt}"
        path.write_text(text)
        return load_config(str(path))


def test_bad_exports_and_configs_say_what_is_wrong(study, tmp_path):
    other = open_study(f"sqlite:///{tmp_path}/e.db", "not-ours")
    with pytest.raises(ExportError, match="neither an 'autotune study --env' study nor"):
        export_doc(other)
    with pytest.raises(ExportError, match="pick='nope'"):
        export_doc(study, pick="nope")
    with pytest.raises(ExportError, match=r"no trial of study .* was measured by target_per_mj"):
        export_doc(study, pick="target_per_mj")  # not a study to a target return
    (tmp_path / "bad.json").write_text(json.dumps({"actors": 2, "actros": 3}))
    with pytest.raises(ConfigError, match="unknown field 'actros'; allowed: actor_nice, actors"):
        load_config(str(tmp_path / "bad.json"))
    (tmp_path / "broken.json").write_text('{"actors": 2,\n')
    with pytest.raises(ExportError, match=r"not valid JSON: Expecting property name .* line 2"):
        load_config(str(tmp_path / "broken.json"))
    (tmp_path / "broken.yaml").write_text("actors: [1\n")
    with pytest.raises(ExportError, match="not valid YAML"):
        load_config(str(tmp_path / "broken.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ExportError, match="no config in it"):
        load_config(str(tmp_path / "list.yaml"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli.main",
            "export",
            "--study",
            "nosuch",
            "--storage",
            f"sqlite:///{tmp_path}/e.db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        out.returncode == 2
        and "no study 'nosuch'" in out.stderr
        and "studies there: e" in out.stderr
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli.main",
            "train",
            "--config",
            str(tmp_path / "bad.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "actros" in out.stderr


def test_a_study_opens_in_optuna_dashboard(study, tmp_path):
    from wsgiref.util import setup_testing_defaults

    dashboard = pytest.importorskip("optuna_dashboard", reason="the dashboard extra")
    app = dashboard.wsgi(f"sqlite:///{tmp_path}/e.db")

    def get(path: str) -> dict:
        env: dict = {}
        setup_testing_defaults(env)
        env["PATH_INFO"] = path
        status = []
        body = b"".join(app(env, lambda s, h, exc=None: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:300])
        return json.loads(body)

    summaries = get("/api/studies")["study_summaries"]
    ours = next(s for s in summaries if s["study_name"] == "e")
    detail = get(f"/api/studies/{ours['study_id']}")
    assert len(detail["trials"]) == 10 and detail["objective_names"] == ["steps_per_joule"]


def test_an_export_to_a_target_return_bounds_its_steps_by_what_its_trials_took():
    from types import SimpleNamespace

    from autotune.workflows.export_evidence import TARGET_STEPS_MARGIN, steps_to_run

    def trial(steps, reached=True):
        return SimpleNamespace(user_attrs={"steps_to_target": steps, "reached": reached})

    took = [trial(300_000), trial(900_000), trial(5_000_000, reached=False)]
    assert steps_to_run(took) == TARGET_STEPS_MARGIN * 900_000  # reached ones only
    assert steps_to_run([trial(1_000)]) == TrainConfig().steps  # never under the default
    assert steps_to_run([trial(None, reached=False)]) == TrainConfig().steps
