"""``autotune study --reference-every K``: the default config re-run as a reference, and every
trial ranked by its figures scaled to the first reference's machine state."""

from __future__ import annotations

import pytest
from conftest import record_train_study

from autotune.tuning.knobs import Machine, build_space
from autotune.tuning.offline_study import OfflineStudy, TrainTrials
from autotune.tuning.storage import open_study
from autotune.workflows.export import export_doc
from runtime.config import TrainConfig

KNOBS = [
    "actors=1..3",
    "batch_size=1024",
    "envs_per_actor=8",
    "chunk_bytes=262144",
    "trainers=1",
    "trainer_threads=1",
    "rollout_len=32",
    "inference=actor",
]
TRUE_SPJ = {1: 80.0, 2: 90.0, 3: 100.0}
"""Each actor count's steps/J on an unloaded machine; the default config has 2 actors."""


class SlowingMachine:
    """Runs measured on a machine that gets 30 % slower after every ``every`` runs."""

    def __init__(self, every: int) -> None:
        self.every, self.runs = every, 0

    def speed(self, run: int) -> float:
        return 0.7 ** (run // self.every)

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        spj = TRUE_SPJ[cfg.actors] * self.speed(self.runs)
        self.runs += 1
        rate = {"steps_per_s": spj * 10, "steps_per_joule": spj, "gpu_w": 0.0, "cpu_w": 10.0}
        return {"lost_steps": 0, "energy": {"cpu_source": "model"}}, rate


def _study(tmp_path, runs, every: int) -> OfflineStudy:
    space = build_space(Machine(cores=4, gpus=0), KNOBS)
    study = open_study(f"sqlite:///{tmp_path}/r.db", "r", seed=0)
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=10)
    trials = TrainTrials(space, base, warmup_s=1.0, run=runs)
    record_train_study(study, trials, base, 10, {"cores": 4, "gpus": 0})
    return OfflineStudy(study, trials, profile=False, reference_every=every)


def test_reference_runs_undo_the_drift_of_a_slowing_machine(tmp_path):
    # the machine slows just before each reference run (trials 3, 6 and 9: after every 2
    # trials), so a reference measures each stretch's machine exactly
    offline = _study(tmp_path, SlowingMachine(every=3), every=2)
    rows = [offline.step() for _ in range(10)]
    assert [r.role for r in rows][::3] == ["default", "reference", "reference", "reference"]
    assert all(r.values == {"actors": 2} for r in rows[::3])
    assert all(r.role not in ("default", "reference") for i, r in enumerate(rows) if i % 3)
    for i, row in enumerate(rows):
        raw = TRUE_SPJ[row.values["actors"]] * 0.7 ** (i // 3)
        assert row.steps_per_joule == pytest.approx(raw)
        assert row.attrs["reference_trial"] == 3 * (i // 3)
        # scaled to the first reference's machine: each config's own figure, at any time
        assert row.attrs["scaled_steps_per_joule"] == pytest.approx(TRUE_SPJ[row.values["actors"]])
        assert row.objective == [pytest.approx(TRUE_SPJ[row.values["actors"]])]
    doc = export_doc(offline.study)
    ev = doc["evidence"]
    best = max({r.values["actors"] for r in rows})
    assert doc["recommended"]["values"]["actors"] == best
    assert ev["recommended"]["scaled_steps_per_joule"]["median"] == pytest.approx(TRUE_SPJ[best])
    assert ev["steps_per_joule_vs_default"] == pytest.approx(TRUE_SPJ[best] / 90.0)
    refs = ev["reference_runs"]
    assert refs["count"] == 4 and refs["spread"] == pytest.approx(0.7**-3)
    assert ev["default"]["scaled_steps_per_joule"]["median"] == pytest.approx(90.0)


def test_without_reference_runs_the_scaled_figures_are_the_raw_ones(tmp_path):
    offline = _study(tmp_path, SlowingMachine(every=3), every=0)
    rows = [offline.step() for _ in range(5)]
    assert rows[0].role == "default"
    assert "reference" not in [r.role for r in rows]
    for row in rows:
        assert row.attrs["reference_trial"] == 0
        assert row.attrs["scaled_steps_per_joule"] == row.steps_per_joule
        assert row.attrs["scaled_steps_per_s"] == row.steps_per_s


def test_a_failed_default_config_is_not_run_again_as_a_reference(tmp_path):
    from runtime.config import ConfigError

    class DefaultFails(SlowingMachine):
        def __call__(self, cfg, warmup_s, meter=None):
            if cfg.actors == 2:
                raise ConfigError(["actors=2: not runnable (test)"])
            return super().__call__(cfg, warmup_s, meter)

    offline = _study(tmp_path, DefaultFails(every=100), every=1)
    rows = [offline.step() for _ in range(5)]
    assert rows[0].role == "default" and rows[0].error.startswith("not runnable")
    assert "reference" not in [r.role for r in rows]
    done = [r for r in rows if r.error is None]
    assert done and all(r.attrs["reference_trial"] is None for r in done)


@pytest.fixture
def as_process(monkeypatch):
    """Makes this test's studies act as the process ``owner`` (trials record it too)."""
    import autotune.tuning.offline_study
    import autotune.tuning.storage

    def become(owner: str) -> None:
        monkeypatch.setattr(autotune.tuning.offline_study, "owner_id", lambda: owner)
        monkeypatch.setattr(autotune.tuning.storage, "owner_id", lambda: owner)

    return become


class HalfSpeed(SlowingMachine):
    def speed(self, run: int) -> float:
        return 0.5


def _two_sessions(tmp_path, as_process, every: int, confirm: bool):
    """Session A (3 trials) on the whole machine; session B (3 trials, confirmations if
    ``confirm``), resumed later on a machine half as fast. Returns both sessions' rows."""
    as_process("host:1:0.00")
    a = _study(tmp_path, SlowingMachine(every=100), every=every)
    rows = [a.step() for _ in range(3)]
    as_process("host:2:9.00")
    b = _study(tmp_path, HalfSpeed(every=100), every=every)
    later = [b.step(confirm=confirm) for _ in range(3)]
    for row in rows + later:  # B's trials count against its own reference
        assert row.attrs["scaled_steps_per_joule"] == pytest.approx(TRUE_SPJ[row.values["actors"]])
    return rows, later


def test_a_resumed_session_runs_its_own_reference_first(tmp_path, as_process):
    rows, later = _two_sessions(tmp_path, as_process, every=3, confirm=False)
    assert rows[0].role == "default" and "reference" not in [r.role for r in rows]
    assert later[0].role == "reference" and later[0].steps_per_joule == pytest.approx(45.0)
    assert all(r.role not in ("default", "reference") for r in later[1:])
    assert [r.attrs["reference_trial"] for r in later] == [3, 3, 3]


def test_a_session_of_confirmations_runs_a_reference_first(tmp_path, as_process):
    _, later = _two_sessions(tmp_path, as_process, every=5, confirm=True)
    assert [r.role for r in later] == ["reference", "confirm", "confirm"]


def test_a_waiting_trial_of_a_killed_session_runs_after_the_reference(tmp_path, as_process):
    as_process("host:1:0.00")
    a = _study(tmp_path, SlowingMachine(every=100), every=5)
    a.step()
    a.study.enqueue_trial({"actors": 3}, user_attrs={"role": "profile"})  # then killed
    a.study.enqueue_trial({"actors": 1})  # one with no role, as a user may enqueue
    as_process("host:2:9.00")
    b = _study(tmp_path, HalfSpeed(every=100), every=5)
    later = [b.step() for _ in range(3)]
    assert [r.role for r in later] == ["reference", "profile", "sampler"]
    assert later[1].values == {"actors": 3} and later[2].values == {"actors": 1}
    assert later[1].attrs["scaled_steps_per_joule"] == pytest.approx(100.0)
    cut = [t for t in b.study.get_trials(deepcopy=False) if "interrupted" in t.user_attrs]
    assert [t.user_attrs["interrupted"] for t in cut] == [
        "asked before this session's reference run"
    ] * 2


def test_reference_runs_are_refused_with_workers():
    from autotune.cli.main import build_parser
    from autotune.cli.study import study_options

    args = build_parser().parse_args(
        ["study", "--trials", "4", "--workers", "2", "--reference-every", "2"]
    )
    with pytest.raises(ValueError, match=r"--reference-every with --workers 2: .*--workers 1"):
        study_options(args)


def test_a_failed_reference_stops_references_but_not_the_default_config(tmp_path):
    class SecondDefaultFails(SlowingMachine):
        def __call__(self, cfg, warmup_s, meter=None):
            if cfg.actors == 2 and self.runs > 0:
                from runtime.runner import RunError

                self.runs += 1
                raise RunError("the run died (test)")
            return super().__call__(cfg, warmup_s, meter)

    offline = _study(tmp_path, SecondDefaultFails(every=100), every=1)
    rows = [offline.step()]
    offline.study.enqueue_trial({"actors": 3})  # not the default config: it runs
    rows += [offline.step() for _ in range(3)]
    assert [r.role for r in rows[:3]] == ["default", "sampler", "reference"]
    assert rows[2].error.startswith("run failed: the run died")
    assert offline.reference_every == 0 and "reference" not in [r.role for r in rows[3:]]
    failed = offline.study.get_trials(deepcopy=False)[2]
    assert failed.user_attrs["interrupted"].startswith("reference run failed")
    assert "error" not in failed.user_attrs  # the default config is not marked unrunnable


def test_confirmations_run_no_reference(tmp_path):
    offline = _study(tmp_path, SlowingMachine(every=100), every=1)
    rows = [offline.step(confirm=i >= 2) for i in range(5)]
    assert [r.role for r in rows[:2]] == ["default", "sampler"]
    assert [r.role for r in rows[2:]] == ["confirm"] * 3


def test_reference_runs_of_zero_have_no_spread():
    from optuna.trial import TrialState

    from autotune.tuning.reference import reference_runs

    class T:
        def __init__(self, value):
            self.state, self.user_attrs = (
                TrialState.COMPLETE,
                {"role": "reference", "steps_per_joule": value},
            )

    assert reference_runs([T(0.0), T(5.0)], "steps_per_joule") == {
        "count": 2,
        "min": 0.0,
        "max": 5.0,
        "spread": None,
    }
    assert reference_runs([], "steps_per_joule") is None


@pytest.mark.parametrize("every", ["-1", "x"])
def test_study_refuses_a_bad_reference_interval(every, capsys):
    from autotune.cli.main import build_parser
    from autotune.cli.study import study_options

    parser = build_parser()
    if every == "x":
        with pytest.raises(SystemExit):
            parser.parse_args(["study", "--reference-every", every])
        assert "--reference-every: invalid int value: 'x'" in capsys.readouterr().err
        return
    args = parser.parse_args(["study", "--reference-every", every])
    with pytest.raises(ValueError, match=r"--reference-every -1: allowed 0 \(never\) or K >= 1"):
        study_options(args)
