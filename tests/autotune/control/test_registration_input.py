"""What a registration (HELLO) or an offer may carry, checked before the daemon uses it: the
job's machine model field by field, its claim's and held budget's integers and ranges, and the
SQLite file its storage URL names, whatever the URL's driver."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import mujoco_like_model

from autotune.control.admission import storage_problem
from autotune.control.allocator import Budget
from autotune.control.claims import claim_from, share_of
from autotune.control.machine import MachineView

H100 = {"index": 0, "name": "H100", "sms": 132, "memory_mib": 81559}


def _machine() -> MachineView:
    return MachineView.from_dict({"cores": 8, "gpus": [H100]})


LEARNER_ALLOWED = "a map of cpu or cuda or cuda-group to two finite numbers >= 0"


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("t_env", "x", "a finite number >= 0"),
        ("t_env", True, "a finite number >= 0"),
        ("f0", None, "a finite number >= 0"),
        ("f1", math.nan, "a finite number >= 0"),
        ("gpu_idle_w", math.inf, "a finite number >= 0"),
        ("w_core", -1.0, "a finite number >= 0"),
        ("cores", 2.5, "an integer >= 1"),
        ("rollout_len", 0, "an integer >= 1"),
        ("learner", {"cpu": ["x", 1.0]}, LEARNER_ALLOWED),
        ("learner", {"tpu": [0.1, 0.1]}, LEARNER_ALLOWED),
        ("nodes", [{"name": "n"}], "a list of maps of name, cpus, here, rtt_s"),
    ],
)
def test_a_machine_model_with_a_malformed_field_is_refused_naming_it(field, value, allowed):
    doc = {**dataclasses.asdict(mujoco_like_model()), field: value}
    with pytest.raises(ValueError, match=f"job j: machine model: {field}=.*; allowed: {allowed}"):
        share_of(claim_from("j", {"gpu": 0}), {"machine": doc}, _machine())


def test_a_machine_model_with_unknown_fields_or_a_failing_rate_is_refused(monkeypatch):
    good = dataclasses.asdict(mujoco_like_model())
    share = share_of(claim_from("j", {"gpu": 0}), {"machine": good}, _machine())
    assert share.model == mujoco_like_model()
    with pytest.raises(ValueError, match=r"unknown fields \['speed'\]; allowed: \['cores'"):
        share_of(claim_from("j", {}), {"machine": {**good, "speed": 1}}, _machine())
    with pytest.raises(ValueError, match="a machine model is a map of its fields; got list"):
        share_of(claim_from("j", {}), {"machine": [1]}, _machine())

    def failing(*args, **kwargs):
        raise TypeError("unsupported operand")

    monkeypatch.setattr("autotune.control.rates.sized_for", failing)
    with pytest.raises(ValueError, match=r"its rate on this machine fails \(TypeError: unsup"):
        share_of(claim_from("j", {}), {"machine": good}, _machine())


def test_integers_in_claims_and_budgets_are_whole_numbers_and_held_budgets_fit_the_machine():
    for claim in (
        {"gpu": math.inf},
        {"cores": [0, math.inf]},
        {"cores": [0], "mps_pct": -math.inf},
    ):
        with pytest.raises(ValueError, match=r"malformed claim .*mps_pct an integer, gpu an"):
            claim_from("j", claim)
    for claim in ({"gpu": 0.5}, {"cores": [1.5]}, {"gpu": True}, {"cores": ["1"]}):
        with pytest.raises(ValueError, match="malformed claim"):
            claim_from("j", claim)
    assert claim_from("j", {"cores": [1.0, 2], "gpu": 0.0, "mps_pct": 50}).fixed == Budget(
        (1, 2), 0, 50
    )
    with pytest.raises(ValueError, match="nan is not an integer"):
        Budget.from_dict({"cores": [math.nan]})
    m = _machine()
    fine = {"cores": [0, 1], "gpu": 0, "mps_pct": 50}
    assert share_of(claim_from("j", {}), {"held": fine}, m).budget == Budget((0, 1), 0, 50)
    assert share_of(claim_from("j", {}), {"held": {"cores": [2]}}, m).budget == Budget((2,))
    for held in (
        {**fine, "cores": [0, math.inf]},
        {**fine, "gpu": math.inf},
        {**fine, "gpu": 3},  # not one of the machine's GPUs
        {**fine, "mps_pct": 5},  # below a GMI's least share
        {**fine, "mps_pct": 150},
        {**fine, "mps_pct": None},  # a budget on a GPU names its share
        {"cores": []},
    ):
        assert share_of(claim_from("j", {}), {"held": held}, m).budget is None, held


def test_every_sqlite_url_is_checked_as_a_file_whatever_its_driver(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("AUTOTUNE_HOME", str(home))
    (tmp_path / "x").mkdir()
    outside = tmp_path / "x" / "b.db"
    for url in (f"sqlite+pysqlite:///{outside}", f"SQLite:///{outside}"):
        problem = storage_problem(url)
        assert f"the SQLite file {outside} does not exist" in problem, url
        assert "only under its state dir" in problem
    monkeypatch.chdir(tmp_path / "x")  # a relative path is the daemon's directory's
    assert "the SQLite file" in storage_problem("sqlite+pysqlite:///b.db")
    uri = f"sqlite+pysqlite:///file:{outside}?mode=rwc&uri=true"
    assert "a SQLite URI filename is not opened from a message" in storage_problem(uri)
    assert storage_problem(f"sqlite+pysqlite:///{home}/study.db") is None
    assert storage_problem("sqlite+pysqlite://") is None  # in memory
    assert storage_problem("sqlite:///:memory:") is None
    assert storage_problem("postgresql://u:secret@db.example/optuna") is None
    assert storage_problem("mysql+pymysql://u@db.example/optuna") is None
    garbage = storage_problem("not a url")
    assert "is not a database URL; allowed: sqlite:///PATH or a database server" in garbage
    assert not outside.exists()


def test_a_gpu_machines_model_as_its_probes_make_it_is_taken():
    """A GPU machine's probes time the learner on cpu, on cuda and as a trainer group's member
    on cuda: the model made from them, as a job registers it, is taken (the group's line had
    been refused as an unknown device, so no job on a GPU machine could be tuned)."""
    from autotune.workflows.auto_size import machine_model
    from runtime.config import TrainConfig
    from runtime.learner_probe import GROUP_LEARNER
    from runtime.probe_results import Probes

    probes = Probes.from_dict(
        {
            "env": "Ant-v5",
            "policy": "auto:256:128:64:auto",
            "env_step_s": 3.4e-4,
            "forward_s": {"1": 4.1e-5, "8": 5.9e-5, "32": 1.2e-4},
            "learners": {
                "cuda": {"seconds": {"1024": 0.0234, "4096": 0.0219, "16384": 0.0235}},
                GROUP_LEARNER: {"seconds": {"1024": 0.121, "4096": 0.117}},
                "cpu": {"seconds": {"1024": 0.160}},
            },
            "sms": [132],
            "round_loaded_s": {"1": 0.01, "16": 0.012},
            "gpu_power": {"idle_w": 79.7, "context_w": 121.8, "busy_w": 182.6},
        }
    )
    model, _ = machine_model(TrainConfig(env="Ant-v5"), probes, 16)
    assert set(model.learner) == {"cpu", "cuda", GROUP_LEARNER}
    doc = dataclasses.asdict(model)
    share = share_of(claim_from("j", {"gpu": 0}), {"machine": doc}, _machine())
    assert share.model.learner == model.learner
