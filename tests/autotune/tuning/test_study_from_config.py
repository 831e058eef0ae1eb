"""``autotune study --from CONFIG``: the first trial (and every reference run) runs the given
config as it is, values outside the knobs' choices included, while the other trials keep to the
choices; the study stays valid, resumes, and exports that config; a knob with one value says
what it changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotune.control.status import study_summary
from autotune.tuning.trials import TrainTrials
from autotune.workflows import study as study_flow
from autotune.workflows.export import export_doc
from autotune.workflows.study import StudyOptions, make_study, resolve_options
from runtime.config import TrainConfig
from runtime.services import RunError

GIVEN = TrainConfig(
    actors=2,
    envs_per_actor=3,
    batch_size=1536,
    rollout_len=48,
    chunk_bytes=100_000,
    trainer_threads=3,
    trainer_device="cpu",
)
FIELDS = ("actors", "envs_per_actor", "batch_size", "rollout_len", "chunk_bytes", "trainer_threads")
KNOBS = ("actors=1..2", "envs_per_actor=2,4,8", "trainers=1", "inference=actor")


def _fields(cfg) -> dict:
    get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
    return {k: get(k) for k in FIELDS}


class Runs:
    """The given config measures best; the first run of it is killed where ``kill_first``."""

    def __init__(self, kill_first: bool = False) -> None:
        self.ran: list[TrainConfig] = []
        self.kill_first = kill_first

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        self.ran.append(cfg)
        if self.kill_first and len(self.ran) == 1:
            raise RunError("the trainer was killed (signal 9)", killed=True)
        spj = 100.0 if _fields(cfg) == _fields(GIVEN) else 10.0 + cfg.envs_per_actor
        rate = {"steps_per_s": spj * 10, "steps_per_joule": spj, "gpu_w": 0.0, "cpu_w": 10.0}
        return {"lost_steps": 0, "energy": {"cpu_source": "model"}}, rate


def _options(tmp_path, *knobs: str, **more) -> StudyOptions:
    (tmp_path / "c.json").write_text(json.dumps(GIVEN.to_dict()))
    return resolve_options(
        StudyOptions(
            from_config=str(tmp_path / "c.json"),
            storage=f"sqlite:///{tmp_path}/s.db",
            knobs=(*KNOBS, *knobs),
            profile=False,
            **more,
        )
    )


def _use(monkeypatch, runs: Runs) -> None:
    """Studies run their trials with ``runs``, on a machine of 4 cores and no GPU."""

    class Trials(TrainTrials):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, run=runs, **kwargs)

    monkeypatch.setattr(study_flow, "TrainTrials", Trials)
    monkeypatch.setattr(study_flow.Machine, "here", classmethod(lambda cls: cls(4, 0)))


def test_the_first_trial_and_the_references_run_the_given_config_as_it_is(tmp_path, monkeypatch):
    runs = Runs()
    _use(monkeypatch, runs)
    options = _options(tmp_path, reference_every=3)
    offline = make_study(options, cores=2)
    rows = [offline.step() for _ in range(6)]
    assert rows[0].role == "default" and _fields(runs.ran[0]) == _fields(GIVEN)
    given = {"envs_per_actor": 3, "rollout_len": 48, "batch_size": 1536}
    given |= {"chunk_bytes": 100_000, "trainer_threads": 3}
    assert offline.given == given
    assert rows[0].values == {"actors": 2, **given}
    first = offline.study.trials[0]
    assert first.params == {"actors": 2} and first.user_attrs["given"] == given
    references = [i for i, r in enumerate(rows) if r.role == "reference"]
    assert references and all(_fields(runs.ran[i]) == _fields(GIVEN) for i in references)
    sampled = [runs.ran[i] for i, r in enumerate(rows) if r.role == "sampler"]
    assert sampled and all(c.envs_per_actor in (2, 4, 8) for c in sampled)
    assert all(c.rollout_len in (16, 32, 64) for c in sampled)
    # valid: the sampler and a resumed study read it; export recommends the given config
    assert offline.study.best_trial.number == 0
    again = make_study(options, cores=2)
    assert again.step().error is None
    doc = export_doc(offline.study)
    assert _fields(doc["recommended"]["config"]) == _fields(GIVEN)
    assert doc["recommended"]["values"]["envs_per_actor"] == 3
    measured = [t for t in offline.study.trials if t.user_attrs.get("scaled_steps_per_joule")]
    default = [t.number for t in measured if t.user_attrs["role"] in ("default", "reference")]
    assert doc["evidence"]["default"]["trials"] == default and default[:2] == [0, references[0]]
    assert offline.study.user_attrs["autotune"]["default"] == {"actors": 2, **given}
    shown = study_summary(offline.study)["trials"][0]["values"]  # what status shows of it
    assert shown == {"actors": 2, **given}


def test_a_killed_first_trial_runs_the_given_config_again(tmp_path, monkeypatch):
    runs = Runs(kill_first=True)
    _use(monkeypatch, runs)
    offline = make_study(_options(tmp_path), cores=2)
    killed, again = offline.step(), offline.step()
    assert "killed" in killed.error and again.error is None
    assert _fields(runs.ran[0]) == _fields(runs.ran[1]) == _fields(GIVEN)


def test_a_knob_with_one_value_says_what_it_changed(tmp_path, monkeypatch):
    from autotune.workflows.study import from_notes

    runs = Runs()
    _use(monkeypatch, runs)
    options = _options(tmp_path, "trainer_threads=1", "chunk_bytes=65536")
    offline = make_study(options, cores=2)
    assert offline.changed == {"trainer_threads": (3, 1), "chunk_bytes": (100_000, 65536)}
    notes = from_notes(options, offline)
    assert len(notes) == 2 and "envs_per_actor=3" in notes[0]
    assert "trainer_threads 3 -> 1" in notes[1] and "chunk_bytes 100000 -> 65536" in notes[1]
    assert "a knob with one value (given by --knob" in notes[1]
    offline.step()
    assert runs.ran[0].trainer_threads == 1 and runs.ran[0].envs_per_actor == 3
    plain = resolve_options(StudyOptions(storage=f"sqlite:///{tmp_path}/p.db", knobs=KNOBS))
    assert from_notes(plain, make_study(plain, cores=2)) == []  # no --from: nothing to say


@pytest.mark.slow
@pytest.mark.timeout(600)  # a run of at most --trial-s and an export, on a loaded machine
def test_a_real_study_from_a_config_runs_it_first_and_exports_it(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(GIVEN.to_dict()))
    storage = f"sqlite:///{tmp_path}/s.db"
    cli = [sys.executable, "-m", "autotune.cli.main"]
    flags = ["--from", str(tmp_path / "c.json"), "--storage", storage, "--trials", "1"]
    flags += ["--trial-s", "120", "--warmup-s", "1", "--knob", "trainers=1"]
    flags += ["--knob", "trainer_threads=1,2", "--json", str(tmp_path / "s.json")]
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run(
        [*cli, "study", *flags], capture_output=True, text=True, timeout=400, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    notes = " ".join(out.stderr.split())
    assert "the first trial runs it as it is" in notes and "trainer_threads=3" in notes
    row = json.loads((tmp_path / "s.json").read_text())["trials"][0]
    assert row["role"] == "default" and row["error"] is None
    assert _fields(row["values"]) == _fields(GIVEN)
    out = subprocess.run(
        [*cli, "export", "--study", "study-CartPole-v1", "--storage", storage],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert TrainConfig.from_dict(json.loads(out.stdout)["recommended"]["config"]) == GIVEN
