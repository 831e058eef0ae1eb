"""``autotune study``'s options: what is refused and why, where a study starts from (a
``--from`` config, the flags given over it), and how workers split the trials."""

from __future__ import annotations

import json
import os

import pytest

from runtime.config import TrainConfig


@pytest.mark.parametrize("confirm", [-1, 4])
def test_study_refuses_more_confirmations_than_trials(confirm):
    from autotune.cli.main import build_parser
    from autotune.cli.study import study_options

    args = build_parser().parse_args(["study", "--trials", "3", "--confirm", str(confirm)])
    with pytest.raises(ValueError, match=r"--confirm .*allowed 0\.\.--trials \(3\)"):
        study_options(args)


def test_workers_split_the_confirmations_with_the_trials(tmp_path):
    from autotune.cli.main import build_parser
    from autotune.cli.study import study_options
    from autotune.workflows.study_workers import plan_workers

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two workers need two cores")
    args = build_parser().parse_args(["study", "--trials", "5", "--confirm", "3", "--workers", "2"])
    plans = plan_workers(study_options(args))
    assert [(p.trials, p.confirm) for p in plans] == [(3, 2), (2, 1)]


def test_a_study_from_a_config_starts_from_it_and_the_flags_given_win(tmp_path):
    from autotune.cli.main import build_parser
    from autotune.cli.study import study_options
    from autotune.workflows.study import make_study

    cfg = TrainConfig(
        env="Pendulum-v1",
        policy="auto:32:auto",
        actors=3,
        envs_per_actor=4,
        batch_size=2048,
        chunk_bytes=65536,
        trainer_device="cpu",
        seed=5,
        learner=TrainConfig().learner.__class__(lr=1e-3),
    )
    (tmp_path / "c.json").write_text(json.dumps({"config": cfg.to_dict()}))
    storage = f"sqlite:///{tmp_path}/s.db"
    args = build_parser().parse_args(
        [
            "study",
            "--from",
            str(tmp_path / "c.json"),
            "--storage",
            storage,
            "--knob",
            "actors=1..4",
            "--knob",
            "envs_per_actor=2,4,8",
            "--trial-s",
            "12",
        ]
    )
    opts = study_options(args)
    assert (opts.env, opts.policy, opts.seed) == ("Pendulum-v1", "auto:32:auto", 5)
    offline = make_study(opts, cores=4)
    base = offline.trials.base
    assert (base.learner.lr, base.batch_size, base.max_wall_s, base.steps) == (
        1e-3,
        2048,
        12,
        10**12,
    )
    assert offline.study.study_name == "study-Pendulum-v1"
    default = offline.trials.default()
    assert default["actors"] == 3 and default["envs_per_actor"] == 4
    assert default["batch_size"] == 2048 and default["chunk_bytes"] == 65536
    # resumed from another config: refused, naming what differs (export assumes the first)
    other = TrainConfig.from_dict({**cfg.to_dict(), "learner": {"lr": 1e-2}})
    (tmp_path / "d.json").write_text(json.dumps(other.to_dict()))
    args = build_parser().parse_args(
        [
            "study",
            "--from",
            str(tmp_path / "d.json"),
            "--storage",
            storage,
            "--knob",
            "actors=1..4",
            "--knob",
            "envs_per_actor=2,4,8",
        ]
    )
    opts = study_options(args)
    with pytest.raises(ValueError, match=r"was started from another config \(learner: .*0\.01"):
        make_study(opts, cores=4)
    # the same network spelled out (Pendulum-v1: 3 observations, 1 action) is the same study
    again = ["--storage", storage, "--knob", "actors=1..4", "--knob", "envs_per_actor=2,4,8"]
    for policy, same in (("3:32:1", True), ("3:33:1", False)):
        args = build_parser().parse_args(
            ["study", "--from", str(tmp_path / "c.json"), "--policy", policy, *again]
        )
        if same:
            assert make_study(study_options(args), cores=4).study.study_name == "study-Pendulum-v1"
        else:
            with pytest.raises(ValueError, match=r"\(policy: 'auto:32:auto' -> '3:33:1'\)"):
                make_study(study_options(args), cores=4)
    # --env, --policy and --seed given replace the file's; a policy that cannot fit is refused
    args = build_parser().parse_args(
        [
            "study",
            "--from",
            str(tmp_path / "c.json"),
            "--env",
            "CartPole-v1",
            "--policy",
            "auto:16:auto",
            "--seed",
            "2",
        ]
    )
    opts = study_options(args)
    assert (opts.env, opts.policy, opts.seed) == ("CartPole-v1", "auto:16:auto", 2)
    args = build_parser().parse_args(
        [
            "study",
            "--from",
            str(tmp_path / "c.json"),
            "--env",
            "CartPole-v1",
            "--policy",
            "3:16:1",
            "--storage",
            f"sqlite:///{tmp_path}/e.db",
        ]
    )
    opts = study_options(args)
    with pytest.raises(ValueError, match=r"--env CartPole-v1 --policy 3:16:1: .*takes 3 inputs"):
        make_study(opts, cores=4)
    # without --from, the defaults
    args = build_parser().parse_args(["study"])
    opts = study_options(args)
    assert (opts.env, opts.policy, opts.base, opts.seed) == ("CartPole-v1", "auto", None, 0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("[1, 2]", "no config in it"),
        ('{"actors": 0}', "actors=0: must be an integer >= 1"),
    ],
)
def test_a_study_from_a_bad_config_says_what_is_wrong(tmp_path, content, message, capsys):
    from autotune.cli.main import main

    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    assert main(["study", "--from", str(path), "--storage", f"sqlite:///{tmp_path}/s.db"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--from {path}" in err and message in err
    assert not (tmp_path / "s.db").exists()  # refused before the study was opened


def test_a_study_from_a_config_refuses_a_wrapped_script(tmp_path):
    from autotune.cli.main import build_parser
    from autotune.cli.study import study_options

    args = build_parser().parse_args(
        ["study", "--from", "x.json", "--knob", "n=1,2", "--", "python", "s.py"]
    )
    with pytest.raises(ValueError, match="--from: a train config"):
        study_options(args)


@pytest.mark.parametrize(("bad", "message"), [("actors=0", "actors"), ("nosuch=1", "nosuch")])
def test_study_refuses_bad_knobs(tmp_path, bad, message, capsys):
    from autotune.cli.main import main

    assert main(["study", "--knob", bad, "--storage", f"sqlite:///{tmp_path}/s.db"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err


def test_the_default_trial_runs_the_trainer_device_a_plain_run_would():
    """``trainer_device`` auto is cuda where a GPU is (``TrainConfig.resolved_device``): the
    study's yardstick trial is what ``autotune train`` with the same defaults runs, not the
    knob's first choice (cpu)."""
    from autotune.tuning.knobs import Machine, build_space
    from autotune.tuning.trials import TrainTrials

    base = TrainConfig(env="CartPole-v1", trainer_device="auto", mps_pct=(50, 25))
    with_gpu = build_space(Machine(cores=8, gpus=1), ["trainer_device=cpu,cuda", "mps_pct=25,50"])
    default = TrainTrials(with_gpu, base, 1.0, run=lambda *a: None).default()
    assert default["trainer_device"] == "cuda" and default["mps_pct"] == 50
    no_gpu = build_space(Machine(cores=8, gpus=0), [])
    assert (
        TrainTrials(no_gpu, base, 1.0, run=lambda *a: None).default().get("trainer_device", "cpu")
        == "cpu"
    )
    explicit = TrainConfig(env="CartPole-v1", trainer_device="cpu")
    assert (
        TrainTrials(with_gpu, explicit, 1.0, run=lambda *a: None).default()["trainer_device"]
        == "cpu"
    )
