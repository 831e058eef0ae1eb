"""The tuning suite's steps and the command lines of its offline studies (nothing is run)."""

from __future__ import annotations

import sys

import pytest

from bench.__main__ import main, parser
from bench.suites import tuning


def _plan(tmp_path, *argv: str):
    a = parser().parse_args(["tuning", *argv, "--out", str(tmp_path)])
    tuning.check(a._parser, a)
    return a, tuning.plan(a)[0]


def _study(tmp_path, *argv: str) -> list[str]:
    a, steps = _plan(tmp_path, "--arms", "study", *argv)
    assert [s.name for s in steps] == ["study"]
    return tuning.study_command(a, tmp_path)[2]


def test_online_arms_are_steps_in_the_order_given(tmp_path):
    a, steps = _plan(tmp_path, "--tune-s", "510,390", "--grid-s", "330")
    assert [s.name for s in steps] == ["tune1", "tune2", "grid", "default", "report"]
    assert [s.estimate_s for s in steps[:3]] == [540, 420, 360]
    assert a.storage == f"sqlite:///{tmp_path.resolve()}/tuning.db"
    a, steps = _plan(
        tmp_path, "--arms", "fixed", "--fixed", 'tuned={"actors": 16}', "--fixed", "grid={}"
    )
    names = ["fixed-tuned-1", "fixed-grid-1", "fixed-tuned-2", "fixed-grid-2"]
    assert [s.name for s in steps] == names  # A B A B


def test_the_other_workloads_study_starts_from_the_ant_export(tmp_path):
    cmd = _study(tmp_path, "--study-preset", "other", "--workload", "humanoid")
    assert cmd[:4] == [sys.executable, "-m", "autotune.cli", "study"]
    line = " ".join(cmd)
    assert "--env Humanoid-v5" in line and "--policy auto:400:200:100:auto" in line
    assert "--trials 10 --confirm 3" in line
    assert "--from bench/exports/ant-export.json" in line
    assert f"--storage sqlite:///{tmp_path.resolve()}/study-humanoid.db" in line
    assert "--knob actor_nice" not in line
    line = " ".join(_study(tmp_path, "--study-preset", "other", "--nice", "0,10"))
    assert "--knob actor_nice=0,10" in line and "--env Ant-v5" in line
    line = " ".join(_study(tmp_path, "--study-preset", "other", "--confirm", "0"))
    assert "--trials 10 --confirm 0" in line  # none asked for: none run


def test_the_cpu_study_takes_a_workload_and_precisions(tmp_path):
    line = " ".join(_study(tmp_path, "--study-preset", "cpu", "--workload", "humanoid"))
    assert "--env Humanoid-v5" in line and "--study humanoid-study-cpu" in line
    assert "--knob trainer_device=cpu" in line and "--knob trainer_threads=1,2,4" in line
    assert "--knob trainer_precision=fp32" in line and "--trials 6 --confirm 2" in line
    line = " ".join(_study(tmp_path, "--study-preset", "cpu", "--precisions", "fp32,bf16"))
    assert "--knob trainer_precision=fp32,bf16" in line and "--env Ant-v5" in line
    a, steps = _plan(tmp_path, "--arms", "study,export", "--study-preset", "cpu")
    assert [s.name for s in steps] == ["study", "export"]
    export = tuning.export_command(a, tmp_path)
    assert export[export.index("--study") + 1] == "ant-study-cpu"
    assert export[export.index("--out") + 1] == str(tmp_path / "ant-export-cpu.json")
    assert export[export.index("--plots") + 1] == str(tmp_path / "plots-cpu-ant")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "tune,sweep"], "--arms: unknown ['sweep']; allowed tune, grid, default"),
        (["--arms", "fixed"], "the fixed arm needs --fixed LABEL=JSON"),
        (["--arms", "fixed", "--fixed", "a=[1]"], "--fixed 'a=[1]': expected LABEL=JSON"),
        (["--arms", "remeasure"], "the remeasure arm needs --config FILE"),
        (["--tune-s", "5,x"], "--tune-s '5,x': expected seconds"),
        (["--workload", "walker"], "invalid choice: 'walker' (choose from"),
    ],
)
def test_tuning_refuses_bad_input(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["tuning", *args, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
