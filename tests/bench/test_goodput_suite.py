"""``python -m bench goodput``: both tunings run to a target return, and the report's table,
ratio and plot; the table's rows for runs that missed the target or failed."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.goodput_report import efficient_samples, summary, table
from bench.suites import goodput


def test_the_suite_runs_both_tunings_to_the_target_and_reports_them(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "bench", "goodput", "--env", "CartPole-v1", "--seeds", "0"]
    cmd += ["--target-return", "40", "--max-wall-s", "240", "--reference-return", "30"]
    cmd += ["--train-args", "--env-backend gymnasium --trainer-device cpu --policy auto:64:64:auto"]
    cmd += ["--out", str(out), "--markdown", str(out / "table.md")]
    cmd += ["--plot", str(out / "curve.png"), "--probe-cache", "shared"]
    cmd += ["--sb3-window", "4", "--sb3-warmup-s", "2", "--sb3-steps", "50000"]  # SB3 first
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    results = json.loads((out / "goodput.json").read_text())["results"]
    for arm in ("steps-per-joule", "goodput"):
        run = results[f"{arm}-seed0"]
        assert run["target"]["reached"] and run["lost_steps"] == 0, run
        assert run["target"]["joules"] > 0 and run["target"]["steps"] <= run["trained_steps"]
        assert run["reference"]["joules"] <= run["target"]["joules"]
        assert (out / f"{arm}-seed0.db").is_file()  # its own study
    # one probe cache: the first run probed the workload, the second read its probes
    assert [p.name for p in out.glob("cache-*")] == ["cache-shared"]
    docs = [json.loads((out / f"{arm}-seed0.json").read_text()) for arm in goodput.ARMS]
    assert [d["sizing"]["probes"]["cached"] for d in docs] == [False, True]
    text = (out / "table.md").read_text()
    assert "The learning-rate schedule: adaptive (the last rates" in text  # the default
    assert "Samples weighed by the efficiency of the batch in use" in text
    assert "Probes: one probe cache for the runs" in text
    assert "read from the cache by goodput-seed0." in text  # the second run read the first's
    sb3 = json.loads((out / "sb3.json").read_text())
    assert not sb3["failed"] and sb3["steps_per_joule"] > 0, sb3
    kj = 50_000 / sb3["steps_per_joule"] / 1000
    assert f"so 0.05M steps cost {kj:.1f} kJ. Its joules over each run's to 30:" in text
    ref = results["goodput-seed0"]["reference"]["joules"]
    assert f"- goodput-seed0: {kj * 1000 / ref:.2f}x ({ref / 1000:.1f} kJ)" in text
    assert "| goodput | 0 | **" in text and "x (seed 0)" in text.split("per seed: ")[1]
    assert (out / "curve.png").stat().st_size > 1000


def test_the_table_says_which_runs_missed_the_target_or_failed():
    progress = [
        {"steps": 10, "return": 5.0, "joules": 1.0, "episodes": 3},
        {"steps": 12_000, "return": 31.0, "joules": 900.0, "episodes": 99},  # not yet a mean of 100
        {"steps": 20_000, "return": 35.0, "joules": 1500.0, "episodes": 120},
    ]
    target = {"reached": True, "joules": 2000.0, "seconds": 3.0, "steps": 30_000}
    reached = {"env_steps": 30_000, "wall_s": 4, "steps_per_joule": 9.0, "lost_steps": 0}
    reached["target"] = target
    reached["config"] = {"env_backend": "gymnasium"}  # what the run's `auto` resolved to
    reached["learning_rate"] = {"schedule": "adaptive", "last": 1.2e-5, "last_kl": 0.01}
    sizing = {"seconds": 0.5, "joules": 300.0, "note": "this run's probes"}
    faster = dict(reached, target=dict(target, joules=1000.0, sizing=sizing))
    faster["config"] = {"env_backend": "envpool"}
    missed = dict(reached, target={"reached": False, "best_return": 37.0})
    early = dict(reached, target={"reached": False, "best_return": None})  # < 100 episodes
    results = {
        "steps-per-joule-seed0": summary(reached, progress, 30.0),
        "goodput-seed0": summary(faster, progress, 30.0),
        "steps-per-joule-seed1": summary(missed, progress, 30.0),
        "goodput-seed1": {"failed": True},
        "steps-per-joule-seed2": summary(early, progress, 30.0),
    }
    text = table(results, [0, 1, 2], ["steps-per-joule", "goodput"], 30.0)
    row = "| steps-per-joule | 0 | **2.0 kJ** | 3.0 | 30,000 | 9.0 | 1.5 kJ, 0.02M steps |"
    # a reference passed within the progress line that reached the target: the target's joules
    both = summary(
        dict(reached, target=dict(target, joules=1000.0, **{"return": 40.0})), progress, 30.0
    )
    assert both["reference"] == {
        "return": 30.0,
        "joules": 1000.0,
        "steps": 30_000,
        "efficient_samples": None,  # no noise scale in these progress lines
    }
    assert row in text
    assert "not reached (best 37)" in text and "| goodput | 1 | failed |" in text
    assert "not reached (best n/a)" in text and "| goodput | 2 | failed |" in text
    assert text.rstrip().endswith("per seed: 2.00x (seed 0)")
    assert "The actors' env backend: envpool, gymnasium." in text  # a fallback shows
    assert "The learning-rate schedule: adaptive (the last rates 1.2e-05 to 1.2e-05)." in text
    assert results["goodput-seed0"]["learning_rate"]["last_kl"] == 0.01
    # one arm alone: the rows, no ratio
    alone = table(results, [0], ["goodput"], 30.0)
    assert "| goodput | 0 | **1.0 kJ** (0.3 kJ sizing) |" in alone and "per seed" not in alone


def test_efficient_samples_weigh_each_step_by_its_batch_at_the_noise_scale_then():
    # sized at batches of 100; the tuner moved to 300 ten seconds after the run's start
    doc = {"timeline": {"started_unix": 1000.0}, "sizing": {"values": {"batch_size": 100}}}
    doc["changes"] = [{"t": 10.0, "changed": {"batch_size": 300}}]
    progress = [
        {"t": 1001.0, "steps": 0},  # no estimate yet
        {"t": 1005.0, "steps": 50, "noise_scale": 100.0},  # 50 steps at 100 / (100 + 100)
        {"t": 1008.0, "steps": 150},  # no estimate in this line: counted at the next one's
        {"t": 1012.0, "steps": 250, "noise_scale": 900.0},  # 200 steps at 900 / (900 + 300)
        {"t": 1015.0, "steps": 300, "noise_scale": 300.0},  # 50 steps at 300 / (300 + 300)
    ]
    assert efficient_samples(doc, progress, 300) == pytest.approx(25 + 150 + 25)
    assert efficient_samples(doc, progress, 200) == pytest.approx(25 + 150 * 0.75)
    # a target reached after the last line: the steps past it at its estimate
    assert efficient_samples(doc, progress, 400) == pytest.approx(25 + 150 + 25 + 100 * 0.5)
    assert efficient_samples(doc, progress[:1], 10**9) is None  # no estimate at all
    assert efficient_samples({"config": {}}, progress, 10**9) is None  # no first batch
    untuned = {"config": {"batch_size": 300}}  # a given batch, never changed
    assert efficient_samples(untuned, progress, 50) == pytest.approx(50 * 0.25)
    # changes with no timeline to place them: the first batch throughout
    unplaced = {"sizing": {"values": {"batch_size": 100}}, "changes": doc["changes"]}
    assert efficient_samples(unplaced, progress, 50) == pytest.approx(50 * 0.5)


def _check(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    goodput.add_args(ap)
    a = ap.parse_args(list(argv))
    goodput.check(ap, a)
    return a


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--seeds", "0,-1"], "distinct integers >= 0"),
        (["--seeds", "1,1"], "distinct integers >= 0"),
        (["--seeds", "a"], "expected integers"),
        (["--arms", "goodput,steps"], "arms of"),
        (["--target-return", "nan"], "--target-return nan: must be a finite number"),
        (["--max-wall-s", "0"], "--max-wall-s 0.0: must be a number > 0"),
        (["--train-args", "--policy 'auto"], "quote it as a shell would"),
        (["--train-args=--obj=goodput_per_joule"], "--obj are (or abbreviate) the suite's own"),
        (["--train-args", "--seed 3"], "--seed are (or abbreviate)"),
        (["--sb3-window", "-1"], "the first two >= 0, the last > 0"),
        (["--sb3-steps", "0"], "the first two >= 0, the last > 0"),
        (["--sb3-window", "30"], "--sb3-window: give --reference-return"),
        (
            ["--sb3-window", "30", "--reference-return", "390", "--train-args", "--lr 3e-4"],
            "and a --policy in --train-args",
        ),
    ],
)
def test_bad_suite_input_is_refused_saying_what_is_allowed(argv, says, capsys):
    with pytest.raises(SystemExit):
        _check(*argv)
    assert says in capsys.readouterr().err
    ok = _check("--train-args", "--env-backend auto --batch-size 4096", "--seeds", "2,0")
    assert ok.seed_list == [2, 0] and ok.arm_list == list(goodput.ARMS)


def test_a_run_marked_failed_is_reported_failed_even_with_a_result_document(tmp_path):
    """A run stopped past its time drains and writes its document; the suite's mark wins."""
    a = _check("--seeds", "0", "--arms", "goodput")
    a.out = str(tmp_path)
    stem = Path(tmp_path) / "goodput-seed0"
    doc = {"env_steps": 1, "wall_s": 1.0, "lost_steps": 0, "target": {"reached": True}}
    stem.with_suffix(".json").write_text(json.dumps(doc))
    stem.with_name(stem.name + ".progress.jsonl").write_text("")
    assert "failed" not in goodput._results(a)["goodput-seed0"]
    goodput._failed(stem, "still running 385 s in")
    assert goodput._results(a) == {"goodput-seed0": {"failed": True}}


def test_a_seed_where_one_tuning_missed_the_target_gives_a_bound_from_what_it_spent():
    def doc(target: dict, gpu_j: float, cpu_j: float) -> dict:
        return {
            "env_steps": 5_000_000,
            "wall_s": 180.0,
            "steps_per_joule": 95.0,
            "lost_steps": 0,
            "target": target,
            "energy": {"gpu_j": gpu_j, "cpu_j": cpu_j},
        }

    sizing = {"seconds": 40.0, "joules": 7_000.0}
    reached = {"reached": True, "joules": 30_000.0, "seconds": 120.0, "steps": 2_000_000}
    # a document written before `spent`: its energy window and its sizing's probes
    kept = summary(
        doc({"reached": False, "best_return": 816.0, "sizing": sizing}, 22e3, 31e3), [], None
    )
    assert kept["spent_joules"] == pytest.approx(60_000.0)
    spent = {"steps": 5_000_000, "seconds": 220.0, "joules": 61_000.0}
    said = summary(
        doc({"reached": False, "best_return": 816.0, "spent": spent}, 1.0, 1.0), [], None
    )
    assert said["spent_joules"] == 61_000.0  # the run's own account wins
    cheap = summary(doc({"reached": False, "best_return": 700.0}, 10e3, 10e3), [], None)
    results = {
        "steps-per-joule-seed0": kept,
        "goodput-seed0": summary(doc(reached, 0.0, 0.0), [], None),
        "steps-per-joule-seed1": summary(doc(reached, 0.0, 0.0), [], None),
        "goodput-seed1": summary(
            doc({"reached": False, "best_return": 900.0}, 20e3, 30e3), [], None
        ),
        "steps-per-joule-seed2": cheap,  # missed, having spent less: a bound all the same
        "goodput-seed2": summary(doc(reached, 0.0, 0.0), [], None),
        "steps-per-joule-seed3": summary(doc(reached, 0.0, 0.0), [], None),
        "goodput-seed3": {"failed": True},
    }
    text = table(results, [0, 1, 2, 3], ["steps-per-joule", "goodput"], None)
    assert text.rstrip().endswith(
        "per seed: more than 2.00x (seed 0: steps/J missed it), "
        "less than 0.60x (seed 1: goodput missed it), more than 0.67x (seed 2: steps/J missed it)"
    )
    none = table({"goodput-seed3": {"failed": True}}, [3], ["steps-per-joule", "goodput"], None)
    assert none.rstrip().endswith("per seed: n/a (no seed gives a ratio or a bound)")


def test_sb3_lines_say_a_failed_arm_and_a_run_that_missed_the_reference():
    from bench.goodput_report import against_sb3

    runs = {"goodput-seed0": {"reference": {"joules": 2_000.0}}, "goodput-seed1": {}}
    runs["goodput-seed2"] = {"failed": True}
    runs["steps-per-joule-seed0"] = {"reference": {"joules": None, "steps": 9}}
    arm = {"steps_per_joule": 10.0, "steps_per_s": 1_500.0, "window_s": 30.0, "failed": False}
    text = " ".join(against_sb3(runs, arm, 1e6, 390.0).split())
    assert "1,500 steps/s at 10.00 steps/J over its 30-s window (its start-up left out;" in text
    assert "so 1M steps cost 100.0 kJ" in text and "- goodput-seed0: 50.00x (2.0 kJ)" in text
    assert "- goodput-seed1: not reached" in text and "- goodput-seed2: failed" in text
    assert "- steps-per-joule-seed0: n/a (no joules)" in text
    failed = {"failed": True, "error": "fewer than two progress lines"}
    assert "failed (fewer than two progress lines)" in against_sb3(runs, failed, 1e6, 390.0)
    assert against_sb3(runs, None, 1e6, 390.0) == ""  # not run


def test_the_policy_is_read_from_the_train_args_in_either_spelling():
    assert goodput.policy_of("--lr 3e-4 --policy auto:8:auto") == "auto:8:auto"
    assert goodput.policy_of("--policy=auto:16:auto --epochs 2") == "auto:16:auto"
    assert goodput.policy_of("--lr 3e-4") is None and goodput.policy_of("--policy") is None


def test_the_report_names_the_runs_that_read_their_probes_and_ignores_an_old_sb3_arm(tmp_path):
    """The note comes from each run's document; an ``sb3.json`` left in ``--out`` by an
    earlier command is not set against runs this command made without the arm."""
    a = _check("--seeds", "0", "--arms", "goodput", "--reference-return", "30")
    a.out = str(tmp_path)
    (tmp_path / "sb3.json").write_text(json.dumps({"steps_per_joule": 10.0, "steps_per_s": 1.0}))
    run = {"reference": {"joules": 10.0, "steps": 50}, "probes_cached": True}
    results = {"goodput-seed0": {**run, **_summary_fields()}}
    text = goodput.report(a, results)["table"]
    assert "each run a probe cache of its own; read from the cache by goodput-seed0." in text
    assert "SB3 PPO on this host" not in text
    from bench.goodput_report import probes_note

    assert "read from the cache by no run." in probes_note({"x": {"failed": True}}, "shared")


def _summary_fields() -> dict:
    """The fields ``table`` reads of a run that reached its target."""
    target = {"reached": True, "joules": 20.0, "seconds": 1.0, "steps": 100}
    return {"target": target, "trained_steps": 100, "steps_per_joule": 5.0, "env_backend": "x"}
