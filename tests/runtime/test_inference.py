"""The inference GMI: batched actions for remote actors, newer weights, bad requests, a run."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import zmq

from policies.actor_critic import ActorCritic
from runtime import wire
from runtime.commands import CommandIn, CommandOut
from runtime.config import ConfigError, TrainConfig
from runtime.envs import probe_env
from runtime.inference import InferencePlace, InferenceServer
from runtime.policy_io import RemotePolicy
from runtime.runner import Runner

KEY = b"k" * 32
"""The run's weights key in these tests."""


class _Served:
    """An inference server on its own thread, with a client, a weights PUB and a commands PUB."""

    def __init__(self, env: str, gpu: int | None = None) -> None:
        self.cfg = TrainConfig(env=env)
        self.info = probe_env(env)
        self.ctx = zmq.Context()
        router = self.ctx.socket(zmq.ROUTER)
        router.bind("inproc://infer")
        self.weights = self.ctx.socket(zmq.PUB)
        self.weights.bind("inproc://weights")
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect("inproc://weights")
        self.commands = CommandOut(self.ctx.socket(zmq.PUB), KEY)
        self.commands.sock.bind("inproc://commands")
        control_sub = self.ctx.socket(zmq.SUB)
        control_sub.setsockopt(zmq.SUBSCRIBE, b"")
        control_sub.connect("inproc://commands")
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect("inproc://infer")
        self.raw = self.ctx.socket(zmq.DEALER)
        self.raw.connect("inproc://infer")
        self.client = RemotePolicy(dealer)
        self.server = InferenceServer(
            self.cfg, self.info, router, sub, None, InferencePlace(gpu, None, {}, 1), KEY
        )
        self.thread = threading.Thread(
            target=self.server.run, args=(CommandIn(control_sub, KEY),), daemon=True
        )
        self.thread.start()

    def reference(self) -> ActorCritic:
        torch.manual_seed(self.cfg.seed)
        return ActorCritic(
            self.info.obs_dim,
            self.info.act_dim,
            self.info.discrete,
            self.cfg.policy,
            self.cfg.learner.normalize_obs,
        )

    def close(self) -> None:
        deadline = time.monotonic() + 5
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.commands.send({"cmd": "exit"})
            self.thread.join(0.1)
        assert not self.thread.is_alive()
        self.ctx.destroy(linger=0)


@pytest.fixture
def served():
    s = _Served("Pendulum-v1")
    yield s
    s.close()


def test_answers_each_group_with_the_policys_actions_and_values(served):
    rng = np.random.default_rng(0)
    obs_a = rng.normal(size=(3, served.info.obs_dim)).astype(np.float32)
    obs_b = rng.normal(size=(5, served.info.obs_dim)).astype(np.float32)
    served.client.request(0, obs_a)
    served.client.request(1, obs_b)
    values = served.client.value(obs_b[:2])
    act_b, logp_b, version_b = served.client.actions(1)  # answers are matched by tag
    act_a, logp_a, version_a = served.client.actions(0)
    assert act_a.shape == (3, served.info.act_dim) and act_b.shape == (5, served.info.act_dim)
    assert version_a == version_b == 0
    ref = served.reference()
    with torch.no_grad():
        lp, _, _ = ref.evaluate(torch.from_numpy(obs_a), torch.from_numpy(act_a))
        np.testing.assert_allclose(logp_a, lp.numpy(), rtol=1e-5, atol=1e-5)
        lp, _, _ = ref.evaluate(torch.from_numpy(obs_b), torch.from_numpy(act_b))
        np.testing.assert_allclose(logp_b, lp.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(
            values, ref.values(torch.from_numpy(obs_b[:2])).numpy(), rtol=1e-5, atol=1e-5
        )
    snap = served.server.snapshot()
    assert snap["rows"] == 8 and snap["value_rows"] == 2 and snap["requests"] == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_answers_match_the_cpu_policy():
    served = _Served("Pendulum-v1", gpu=0)
    try:
        assert served.server.device.type == "cuda" and served.server.sm_count > 0
        obs = np.random.default_rng(1).normal(size=(64, served.info.obs_dim)).astype(np.float32)
        served.client.request(0, obs)
        actions, logp, _ = served.client.actions(0)
        ref = served.reference()
        with torch.no_grad():
            lp, _, _ = ref.evaluate(torch.from_numpy(obs), torch.from_numpy(actions))
            np.testing.assert_allclose(logp, lp.numpy(), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(
                served.client.value(obs),
                ref.values(torch.from_numpy(obs)).numpy(),
                rtol=1e-4,
                atol=1e-4,
            )
    finally:
        served.close()


def test_takes_newer_genuine_weights_and_says_which_version_acted(served):
    ref = served.reference()
    with torch.no_grad():
        for p in ref.v.parameters():
            p.add_(0.5)
    names, arrays = ref.state_arrays()
    obs = np.ones((2, served.info.obs_dim), np.float32)
    deadline = time.monotonic() + 10
    version = 0
    while version != 7:  # PUB/SUB: the first messages may go before the SUB has joined
        assert time.monotonic() < deadline, "the server never took version 7"
        meta = {"version": 7, "names": names, "mac": wire.weights_mac(KEY, 7, names, arrays)}
        wire.send_msg(served.weights, wire.MsgType.WEIGHTS, meta, arrays)
        served.client.request(0, obs)
        _, _, version = served.client.actions(0)
    with torch.no_grad():
        expected = ref.values(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(served.client.value(obs), expected, rtol=1e-5, atol=1e-5)
    # weights from anyone without the run's key: a huge version, unsigned or signed with
    # another key, is dropped and counted, and the server keeps version 7
    zeros = [np.zeros_like(a) for a in arrays]
    forged = [
        {"version": 10**9, "names": names},
        {"version": 10**9, "names": names, "mac": wire.weights_mac(b"x" * 32, 10**9, names, zeros)},
        {"version": 8, "names": names, "mac": wire.weights_mac(KEY, 8, names, arrays)},  # altered
    ]
    before = served.server.weights.malformed.count
    deadline = time.monotonic() + 10
    while served.server.weights.malformed.count < before + len(forged):
        assert time.monotonic() < deadline, "the forged weights were never seen"
        for meta in forged:
            wire.send_msg(served.weights, wire.MsgType.WEIGHTS, meta, zeros)
        served.client.request(0, obs)
        _, _, version = served.client.actions(0)
        assert version == 7
    np.testing.assert_allclose(served.client.value(obs), expected, rtol=1e-5, atol=1e-5)


def test_a_malformed_request_is_counted_and_the_server_keeps_serving(served):
    wrong = np.zeros((2, served.info.obs_dim + 1), np.float32)
    wire.send_msg(served.raw, wire.MsgType.INFER, {"tag": 0, "kind": "act"}, [wrong])
    wire.send_msg(served.raw, wire.MsgType.INFER, {"tag": 1, "kind": "sing"}, [wrong[:, :-1]])
    obs = np.zeros((4, served.info.obs_dim), np.float32)
    served.client.request(0, obs)
    actions, _, _ = served.client.actions(0)
    assert actions.shape[0] == 4
    assert served.server.malformed.count == 2
    assert not served.raw.poll(200), "a malformed request must get no answer"


def test_bad_inference_settings_say_what_is_allowed():
    with pytest.raises(ConfigError, match=r"inference='gpu': allowed \('actor', 'gmi'\)"):
        TrainConfig(inference="gpu").validate()
    with pytest.raises(ConfigError, match="applies only with inference='gmi'"):
        TrainConfig(inference_mps_pct=50).validate()
    with pytest.raises(ConfigError, match=r"integer in 1\.\.100"):
        TrainConfig(inference="gmi", inference_mps_pct=0).validate()
    with pytest.raises(ConfigError, match="trainer device is cpu"):
        TrainConfig(inference="gmi", inference_mps_pct=50, trainer_device="cpu").validate()


@pytest.mark.slow
def test_a_run_with_the_inference_gmi_loses_nothing_and_acts_once_per_step():
    """Pendulum (continuous, truncated at 200 steps, so value requests too): every sampled
    step was acted on by the inference GMI exactly once, and nothing was lost."""
    cfg = TrainConfig(
        env="Pendulum-v1",
        steps=8_000,
        actors=2,
        envs_per_actor=4,
        rollout_len=16,
        batch_size=512,
        inference="gmi",
    )
    result = Runner(cfg, cfg.validate()).run()
    assert result["sampled_steps"] == result["env_steps"] + result["discarded_steps"]
    assert result["lost_steps"] == 0 and result["env_steps"] >= cfg.steps
    inf = result["inference"]
    assert inf["mode"] == "gmi" and inf["device"] == "cpu"
    assert inf["rows"] == result["sampled_steps"] and inf["value_rows"] > 0
    assert inf["version"] > 0 and inf["batches"] > 0 and inf["actor_wait_s"] > 0
    assert result["malformed"]["inference"] == 0
