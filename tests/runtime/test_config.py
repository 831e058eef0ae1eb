"""Bad input: each a clear error naming the value and what is allowed, before any process."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from runtime.config import ConfigError, TrainConfig


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"actors": 0}, "actors=0: must be an integer >= 1"),
        ({"envs_per_actor": -2}, "envs_per_actor=-2"),
        ({"steps": 0}, "steps=0"),
        ({"rollout_len": 0}, "rollout_len=0"),
        ({"batch_size": 100, "rollout_len": 32}, "must be a multiple of rollout_len=32"),
        ({"batch_size": 4096, "steps": 1024}, "larger than steps=1024, so no batch"),
        ({"trainer_device": "tpu"}, "trainer_device='tpu'"),
        ({"chunk_timeout_s": 0}, "chunk_timeout_s=0"),
        ({"env": "CartPol-v1"}, "did you mean CartPole-v1"),
        ({"policy": "5:64:2"}, "takes 5 inputs but the environment's observations have 4"),
        ({"policy": "4:64:3"}, "gives 3 outputs but the environment needs 2"),
        ({"policy": "4:x:2"}, "entry 1 is 'x'"),
        ({"env": "Pendulum-v1", "policy": "3:64:2"}, "environment needs 1"),
        ({"actor_nice": 20}, "actor_nice=20: allowed an integer 0..19"),
        ({"actor_nice": -1}, "actor_nice=-1: allowed an integer 0..19"),
        ({"trainer_precision": "fp16"}, "trainer_precision='fp16': allowed ('fp32', 'bf16')"),
        ({"max_wall_s": float("inf")}, "max_wall_s=inf: must be a finite number > 0"),
        ({"chunk_timeout_s": float("nan")}, "chunk_timeout_s=nan: must be a finite number > 0"),
        ({"chunk_bytes": 2**30}, "chunk_bytes=1073741824: at most 268435456 (256 MiB)"),
        # a rollout channel larger than the pipeline holds (its frames would be refused unread)
        (
            {"envs_per_actor": 2**20, "rollout_len": 64, "batch_size": 2**26, "steps": 2**27},
            "envs_per_actor=1048576 x (rollout_len=64 + 1) x 4 floats is 1040 MiB in one "
            "rollout channel; the pipeline holds rollouts of at most 256 MiB",
        ),
    ],
)
def test_bad_settings_name_the_value_and_what_is_allowed(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**kwargs).validate()
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("entropy_coef", float("nan"), "learner.entropy_coef=nan: must be a finite number >= 0"),
        ("value_coef", float("inf"), "learner.value_coef=inf: must be a finite number >= 0"),
        ("lr", float("inf"), "learner.lr=inf: must be a finite number > 0"),
        ("lr", float("nan"), "learner.lr=nan: must be a finite number > 0"),
    ],
)
def test_learner_numbers_must_be_finite(field, value, needle):
    """A NaN or infinite learner setting is refused before the run (a NaN entropy coefficient
    once reached the probes and failed there, in the learner's words)."""
    from policies.appo_config import APPOConfig

    with pytest.raises(ConfigError) as err:
        TrainConfig(learner=APPOConfig(**{field: value})).validate()
    assert needle in str(err.value)


def test_an_unknown_env_gets_one_hint():
    """gymnasium's own "Did you mean" is dropped where ours names the close ids."""
    with pytest.raises(ConfigError) as err:
        TrainConfig(env="CartPol-v1").validate()
    assert str(err.value).lower().count("did you mean") == 1


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        TrainConfig(actors=0, envs_per_actor=0, steps=-1).validate()
    assert len(err.value.problems) == 3


def test_defaults_are_valid_and_describe_the_env():
    info = TrainConfig().validate()
    assert (info.obs_dim, info.act_dim, info.discrete) == (4, 2, True)


def test_cli_rejects_bad_input_before_starting_any_process():
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "train", "--actors", "0", "--batch-size", "100"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "actors=0" in proc.stderr and "multiple of rollout_len" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30
    proc = subprocess.run(  # an explicit 0 is refused, not taken as "the default"
        [sys.executable, "-m", "autotune.cli", "train", "--tune", "--tune-window-s", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--tune-window-s: '0': allowed a finite number of seconds > 0" in proc.stderr
    proc = subprocess.run(  # square brackets in an error are printed, not taken as markup
        [sys.executable, "-m", "autotune.cli", "train", "--config", "no-such[mujoco].json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no-such[mujoco].json" in proc.stderr, proc.stderr


def test_cuda_trainer_without_cuda_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        TrainConfig(trainer_device="cuda").validate()


def _niceness_after_actor_setup(nice, out):
    from runtime.actor_process import init_actor_process

    init_actor_process(0, nice)
    out.put(os.nice(0))


def test_an_actor_adds_actor_nice_to_its_niceness_and_the_runner_keeps_its_own():
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    base = os.nice(0)
    proc = ctx.Process(target=_niceness_after_actor_setup, args=(5, out))
    proc.start()
    got = out.get(timeout=60)
    proc.join(30)
    assert got == min(base + 5, 19) and os.nice(0) == base
