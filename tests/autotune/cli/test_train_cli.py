"""``autotune train`` as a user runs it: a subprocess with a tiny budget, JSON checked."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

TOP_KEYS = {
    "env",
    "env_steps",
    "sampled_steps",
    "discarded_steps",
    "lost_steps",
    "wall_s",
    "steps_per_s",
    "energy",
    "steps_per_joule",
    "return_mean",
    "policy_lag",
    "config",
    "stages",
}


def run_cli(tmp_path, *args: str) -> dict:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "train", "--quiet", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "steps per joule" in proc.stdout  # the summary table
    return json.loads(out.read_text())


def assert_documented_shape(r: dict, steps: int, actors: int) -> None:
    """The JSON ``--json`` writes for a CartPole run of ``steps`` with ``--actors actors``."""
    assert set(r) >= TOP_KEYS
    assert r["env"] == "CartPole-v1" and r["env_steps"] >= steps
    assert r["sampled_steps"] == r["env_steps"] + r["discarded_steps"] + r["lost_steps"]
    assert set(r["energy"]) >= {"gpu_j", "cpu_j", "gpu_source", "cpu_source"}
    assert r["energy"]["gpu_source"] in ("nvml", "nvml-power-polling", "none")
    assert r["energy"]["cpu_source"] in ("rapl", "model")
    assert r["steps_per_joule"] is None or r["steps_per_joule"] > 0
    assert set(r["policy_lag"]) == {"mean", "max"}
    assert set(r["stages"]) == {"dispenser", "compressor", "migrator", "batcher"}
    assert all(s["messages"] > 0 and s["bytes"] > 0 for s in r["stages"].values())
    assert r["config"]["actors"] == actors


def test_pendulum_continuous_control_smoke(tmp_path):
    r = run_cli(
        tmp_path,
        "--env",
        "Pendulum-v1",
        "--steps",
        "8192",
        "--actors",
        "1",
        "--reward-scale",
        "0.1",
    )
    assert r["env_steps"] >= 8192 and r["lost_steps"] == 0
    assert r["return_mean"] is not None and math.isfinite(r["return_mean"])
    assert r["config"]["learner"]["reward_scale"] == 0.1


def test_python_api_example_runs(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "train_api.py"),
            "--env",
            "CartPole-v1",
            "--steps",
            "3000",
            "--actors",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert summary["env_steps"] >= 3000 and summary["lost_steps"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mps-pct", "half"], "comma-separated list of integers"),
        (["--mps-change", "soon:50"], "SECONDS:P"),
        (["--mps-change", "10"], "SECONDS:P"),
        (["--trainer-device", "cpu", "--mps-pct", "50"], "trainer device is cpu"),
        (["--trainers", "2", "--mps-pct", "50,50,50"], "3 values for 2 GMIs"),
        (["--grad-sync", "ring"], "invalid choice"),
        (["--inference", "gpu"], "invalid choice"),
        (["--inference-mps-pct", "50"], "applies only with inference='gmi'"),
        (["--inference", "gmi", "--inference-mps-pct", "101"], "integer in 1..100"),
        # a budget asked of a daemon no one asks: refused, not ignored
        (["--tune", "--in-process", "--cores", "0"], "--cores take effect under a running"),
        (["--tune", "--in-process", "--exclusive"], "daemon'), which shares the machine out;"),
        # the user's text as typed, not read as markup or emoji codes (':x:')
        (["--policy", "4:x:2"], "policy spec '4:x:2': entry 1 is 'x'"),
        (["--checkpoint", "/proc/autotune-checkpoint"], "checkpoint='/proc/autotune-checkpoint': "),
        (["--tune", "--in-process", "--tune-trials", "0"], "trials=0: must be >= 1"),
        (["--cluster", "local:0"], "cluster='local:0': local:N needs N from 1 to"),
        (["--min-minibatch", "-1"], "learner.min_minibatch=-1: must be an integer >= 0 (0: off)"),
        (["--max-inflight-batches", "0"], "max_inflight_batches=0.0: must be a finite number > 0"),
        (["--chunk-timeout-s", "nan"], "chunk_timeout_s=nan: must be a finite number > 0"),
        # a shortened flag would pass argparse but not override a --config file: refused
        (["--max-inflight", "4"], "unrecognized arguments: --max-inflight 4"),
    ],
)
def test_bad_flags_are_refused_with_what_is_allowed(args, message, capsys):
    from autotune.cli.main import main

    try:
        rc = main(["train", "--quiet", *args])
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()), err
    assert "probes" not in err and "sizing" not in err  # refused before the probes are paid for


def test_auto_sizing_is_stored_explicit_flags_win_and_probes_are_cached(tmp_path):
    """The defaults size the run from probes; the second run reads them from the cache. The
    second run's JSON (``--actors`` given, the rest sized) has the documented shape."""
    env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(tmp_path / "cache")}

    def train(name: str, *args: str) -> tuple[dict, str]:
        out = tmp_path / f"{name}.json"
        cmd = [sys.executable, "-m", "autotune.cli", "train", "--quiet", "--json", str(out)]
        proc = subprocess.run(
            [*cmd, "--steps", "4096", *args], capture_output=True, text=True, timeout=240, env=env
        )
        assert proc.returncode == 0, proc.stderr
        assert "steps per joule" in proc.stdout  # the summary table
        return json.loads(out.read_text()), proc.stderr

    first, said = train("first")
    sizing = first["sizing"]
    assert "sizing: actors=" in said and "probes " in said and "cached" not in said
    assert set(sizing["auto"]) >= {"actors", "envs_per_actor", "batch_size", "trainer_device"}
    for field in ("actors", "envs_per_actor", "batch_size", "trainer_device"):
        assert first["config"][field] == sizing["chosen"][field], field
    if first["config"]["trainer_device"] == "cpu":  # no MPS share is said to be chosen for it
        assert "mps_pct" not in sizing["chosen"] and "mps_pct=" not in said
    assert sizing["probes"]["env_step_s"] > 0 and not sizing["probes"]["cached"]
    assert sizing["values"]["batch_size"] == 512  # 4096 steps: the smallest batch (64 updates)
    assert len(list((tmp_path / "cache" / "probes").glob("*.json"))) == 1

    assert sizing["model"]["inflight_batches"] == 2.0  # the run's budget, as the model has it
    second, said = train("second", "--actors", "2", "--max-inflight-batches", "3")
    assert second["sizing"]["model"]["inflight_batches"] == 3.0
    assert_documented_shape(second, 4096, actors=2)
    assert second["config"]["actors"] == 2 and "actors" not in second["sizing"]["auto"]
    assert second["sizing"]["probes"]["cached"] and "probes cached" in said
    assert second["sizing"]["probes"]["env_step_s"] == sizing["probes"]["env_step_s"]

    third, said = train(
        "third", "--reprobe", "--batch-size", "512", "--target-return", "10", "--steps", "100000"
    )
    assert not third["sizing"]["probes"]["cached"] and third["config"]["batch_size"] == 512
    # what the sizing cost, metered as the run is, and counted in the target's figures
    cost = third["sizing"]["energy"]
    assert cost["elapsed_s"] >= third["sizing"]["probes"]["probe_s"] > 0 and cost["cpu_j"] > 0
    assert f"sizing {cost['elapsed_s']:.1f} s" in " ".join(said.split())  # rich wraps lines
    target = third["target"]
    assert target["reached"], target
    assert target["sizing"]["joules"] == cost["gpu_j"] + cost["cpu_j"]
    assert target["seconds"] >= cost["elapsed_s"] and target["joules"] > target["sizing"]["joules"]
    # the sizing counted once: the run's own joules to the target are at most its whole run's
    run_j = third["energy"]["gpu_j"] + third["energy"]["cpu_j"]
    assert 0 < target["joules"] - target["sizing"]["joules"] <= run_j


def test_which_flags_are_sized_with_and_without_a_config_file(tmp_path):
    """Without --config every sizing flag left at its default is auto; with one, only those
    given `auto` on the command line (the file's values stand); a tuned run's --knob narrows
    the sized values."""
    from autotune.cli.auto_flags import tuned_space
    from autotune.cli.main import parse_args as parse
    from autotune.cli.train_config import AUTO, auto_fields

    assert auto_fields(parse(["train"])) == set(AUTO)
    assert auto_fields(parse(["train", "--actors", "3"])) == set(AUTO) - {"actors"}
    # a CPU trainer has no GPU share: with every other field given, nothing is sized
    given = ["--actors", "1", "--envs-per-actor", "4", "--batch-size", "1024", "--trainers", "1"]
    assert auto_fields(parse(["train", *given, "--trainer-device", "cpu"])) == set()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"env": "CartPole-v1", "actors": 2}))
    assert auto_fields(parse(["train", "--config", str(cfg)])) == set()
    with_auto = parse(["train", "--config", str(cfg), "--batch-size", "auto"])
    assert auto_fields(with_auto) == {"batch_size"}
    tuned = parse(["train", "--tune", "--knob", "actors=1..2", "--knob", "batch_size=512,1024"])
    assert tuned_space(tuned) == {"actors": (1, 2), "batch_size": (512, 1024)}
    assert tuned_space(parse(["train", "--knob", "actors=1..2"])) is None  # not tuning


def test_the_loss_compile_is_on_by_default_and_a_flag_turns_it_off(tmp_path):
    """``--compile-loss off`` reaches the learner's settings, over a config file's too."""
    from autotune.cli.main import parse_args as parse
    from autotune.cli.train_config import train_config as build_config

    assert build_config(parse(["train"])).learner.compile_loss is True
    assert build_config(parse(["train", "--compile-loss", "off"])).learner.compile_loss is False
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"env": "CartPole-v1", "learner": {"compile_loss": False}}))
    assert build_config(parse(["train", "--config", str(cfg)])).learner.compile_loss is False
    over = parse(["train", "--config", str(cfg), "--compile-loss", "on"])
    assert build_config(over).learner.compile_loss is True
    with pytest.raises(SystemExit):
        parse(["train", "--compile-loss", "maybe"])
    # the minibatch floor likewise: off by default, a flag over a file's
    assert build_config(parse(["train"])).learner.min_minibatch == 0
    floor = parse(["train", "--config", str(cfg), "--min-minibatch", "512"])
    assert build_config(floor).learner.min_minibatch == 512


def test_flags_given_auto_over_a_config_file_win_unless_auto_means_sizing(tmp_path):
    """``--policy auto`` and ``--grad-sync auto`` are values, not sizes to probe: over a
    file's they stand. A batch size or rate given anew starts the rate's scaling afresh."""
    from autotune.cli.main import parse_args as parse
    from autotune.cli.train_config import train_config as build_config

    doc = tmp_path / "c.json"
    learner = {"lr": 0.002, "lr_batch": 512, "lr_scaling": "sqrt", "lr_schedule": "constant"}
    given = {"env": "CartPole-v1", "policy": "auto:16:auto", "grad_sync": "mpr"}
    doc.write_text(json.dumps({**given, "batch_size": 512, "learner": learner}))
    over = build_config(
        parse(["train", "--config", str(doc), "--policy", "auto", "--grad-sync", "auto"])
    )
    assert (over.policy, over.grad_sync) == ("auto", "auto")
    kept = build_config(parse(["train", "--config", str(doc)]))
    assert (kept.policy, kept.grad_sync, kept.learner.lr_batch) == ("auto:16:auto", "mpr", 512)
    bigger = build_config(parse(["train", "--config", str(doc), "--batch-size", "2048"]))
    assert bigger.batch_size == 2048 and bigger.learner.lr_batch is None  # 0.002 at 2048
    sized = parse(["train", "--config", str(doc), "--batch-size", "auto"])
    assert build_config(sized).batch_size == 512  # the sizing's to set, from the file's


def test_a_batch_with_fewer_trajectories_than_minibatches_is_refused_saying_the_least():
    from autotune.cli.main import parse_args as parse
    from autotune.cli.train_config import train_config as build_config

    cfg = build_config(parse(["train", "--batch-size", "64", "--minibatches", "4"]))
    (problem,) = cfg.problems()
    assert "2 trajectories of 32 steps cannot fill learner.minibatches=4" in problem
    assert "at least 128" in problem


def test_the_in_flight_budget_and_chunk_timeout_flags_reach_the_config(tmp_path):
    """``--max-inflight-batches`` and ``--chunk-timeout-s`` set the run's; over a config
    file's too, and the file's stand where they are not given."""
    from autotune.cli.main import parse_args as parse
    from autotune.cli.train_config import train_config as build_config

    plain = build_config(parse(["train"]))
    assert (plain.max_inflight_batches, plain.chunk_timeout_s) == (2.0, 0.02)
    cfg = build_config(
        parse(["train", "--max-inflight-batches", "4", "--chunk-timeout-s", "0.005"])
    )
    assert (cfg.max_inflight_batches, cfg.chunk_timeout_s) == (4.0, 0.005)
    doc = tmp_path / "c.json"
    doc.write_text(json.dumps({"env": "CartPole-v1", "max_inflight_batches": 8}))
    assert build_config(parse(["train", "--config", str(doc)])).max_inflight_batches == 8.0
    over = parse(["train", "--config", str(doc), "--max-inflight-batches", "3"])
    assert build_config(over).max_inflight_batches == 3.0


def test_a_gpu_knob_on_a_machine_without_one_is_refused_before_the_probes():
    from runtime.hw.gpus import list_gpus

    if list_gpus():
        pytest.skip("this machine has a GPU")
    cmd = [sys.executable, "-m", "autotune.cli", "train", "--env", "CartPole-v1", "--tune"]
    out = subprocess.run(
        [*cmd, "--in-process", "--knob", "mps_pct=50", "--steps", "20000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "knob mps_pct cannot be set here: no CUDA GPU" in said, said
    assert "probes" not in said


def test_tuning_flags_without_tune_are_refused_not_ignored(capsys):
    from autotune.cli.main import main

    argv = ["train", "--quiet", "--knob", "actors=2", "--tune-trials", "0", "--max-lag", "3"]
    assert main(argv) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "--knob, --tune-trials, --max-lag take effect with --tune" in said


def test_values_that_passed_and_failed_mid_run_are_refused_before_it():
    """A NaN lag ceiling, a seed torch cannot take, a learner number given as text."""
    from autotune.tuning.settings import TunerSettings
    from policies.appo_config import APPOConfig
    from runtime.config import TrainConfig

    (lag,) = TunerSettings(max_policy_lag=float("nan")).problems()
    assert "a ceiling is a finite number of versions >= 0" in lag
    (seed,) = TrainConfig(seed=2**64).problems()
    assert "seed=18446744073709551616: at most 9223372036854775807" in seed
    assert TrainConfig(seed=2**63 - 1).problems() == []
    (gamma,) = APPOConfig(gamma="99e-2").problems()
    assert "learner.gamma='99e-2': must be in (0, 1]" in gamma


def test_an_auto_batch_is_not_refused_for_a_value_the_user_never_gave(tmp_path, capsys):
    """Before the sizing sets it, an ``auto`` batch is checked as the least batch the rollout
    length and minibatches take: a short run or an odd rollout length is not refused for it."""
    from autotune.cli.main import main
    from autotune.cli.main import parse_args as parse
    from autotune.cli.train_config import train_config as build_config

    assert build_config(parse(["train", "--steps", "1000"])).problems() == []
    assert build_config(parse(["train", "--rollout-len", "48"])).problems() == []
    # and a --progress path that cannot be written is refused before any probe
    assert main(["train", "--quiet", "--progress", str(tmp_path)]) == 2
    assert "--progress" in capsys.readouterr().err
