"""Data-parallel trainer GMIs and the GMI hand-over, as real processes on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from policies.actor_critic import ActorCritic
from policies.appo import APPOConfig, APPOLearner
from runtime.config import ConfigError, TrainConfig
from runtime.gmi import placement
from runtime.runner import Runner

T, OBS, ACT = 8, 4, 2


def _batch(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(rows, T + 1, OBS)).astype(np.float32),
        "actions": rng.integers(0, ACT, size=(rows, T)),
        "rewards": rng.normal(size=(rows, T)).astype(np.float32),
        "dones": (rng.random((rows, T)) < 0.1).astype(np.uint8),
        "logp": np.full((rows, T), np.log(0.5), np.float32),
        "versions": np.zeros((rows, T), np.int32),
    }


def _learner() -> APPOLearner:
    torch.manual_seed(0)
    model = ActorCritic(OBS, ACT, True, "auto:16:auto")
    return APPOLearner(model, APPOConfig(epochs=2, minibatches=2), torch.device("cpu"))


def _rank(rank: int, rows: list[int], init_file: str, out: dict) -> None:
    from runtime.gmi.group import TrainerGroup

    torch.set_num_threads(1)
    group = TrainerGroup(rank, [list(range(len(rows)))], init_file, cuda=False)
    # the weighted mean itself: gradient (rank + 1) everywhere, weight = rows
    probe = torch.nn.Linear(2, 1)
    for p in probe.parameters():
        p.grad = torch.full_like(p, float(rank + 1))
    total = group.average_grads_(probe, float(rows[rank]))
    grads = [p.grad.clone() for p in probe.parameters()]
    # a whole learner update with uneven (and empty) shares
    learner = _learner()
    batch = _batch(rows[rank], seed=rank) if rows[rank] else None
    learner.update(batch, group)
    state = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    out[rank] = (total, grads, state, learner.trained_steps)
    group.close()


def test_gmis_with_uneven_shares_average_by_rows_and_end_bit_identical(tmp_path):
    """Ranks with 3, 1 and 0 rows: gradients are averaged weighted by rows, observation
    statistics cover all 4 rows, and every rank ends with bit-identical weights."""
    rows = [3, 1, 0]
    with mp.Manager() as manager:
        out = manager.dict()
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_rank, args=(r, rows, str(tmp_path / "pg"), out))
            for r in range(len(rows))
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs)
        results = dict(out)
    weighted = (3 * 1 + 1 * 2 + 0 * 3) / 4
    all_obs = np.concatenate([_batch(3, 0)["obs"][:, :T], _batch(1, 1)["obs"][:, :T]])
    all_obs = all_obs.reshape(-1, OBS).astype(np.float64)
    for rank in range(len(rows)):
        total, grads, state, trained = results[rank]
        assert total == pytest.approx(4.0)
        for g in grads:
            assert torch.allclose(g, torch.full_like(g, weighted))
        assert trained == 4 * T  # the step count (learning-rate schedule) is the group's
        # Chan's update from the prior (mean 0, var 1, count 1e-4) is all but the batch's stats
        np.testing.assert_allclose(state["obs_norm.mean"].numpy(), all_obs.mean(0), atol=1e-5)
        np.testing.assert_allclose(state["obs_norm.var"].numpy(), all_obs.var(0), atol=1e-4)
        for name, value in state.items():
            assert torch.equal(value, results[0][2][name]), (rank, name)


def test_placement_is_gpu_major_and_checks_percentages():
    cfg = TrainConfig(trainer_device="cpu", trainers=3)
    specs = placement.place(cfg)
    assert [(s.rank, s.gpu, s.mps_pct) for s in specs] == [
        (0, None, None),
        (1, None, None),
        (2, None, None),
    ]
    assert placement.layout(specs) == [[0, 1, 2]]
    assert not placement.wants_mps(specs)
    with pytest.raises(ValueError, match="apply to cuda"):
        placement.place(cfg, (50,))
    gpu = [placement.GMISpec(r, r // 2, p) for r, p in enumerate([50, 50, 100, 100])]
    assert placement.layout(gpu) == [[0, 1], [2, 3]]
    assert placement.wants_mps(gpu)
    assert not placement.wants_mps([placement.GMISpec(0, 0, 100), placement.GMISpec(1, 1, None)])


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"trainers": 0}, "trainers=0"),
        ({"mps_pct": (0,)}, "1..100"),
        ({"mps_pct": (101,)}, "1..100"),
        ({"trainers": 2, "mps_pct": (50, 50, 50)}, "3 values for 2 GMIs"),
        ({"gpus": (0, 0)}, "lists a GPU twice"),
        ({"gpus": ()}, "non-empty"),
    ],
)
def test_bad_gmi_settings_are_refused_with_what_is_allowed(over, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**over).validate()


def test_gpu_settings_on_a_cpu_trainer_are_refused():
    with pytest.raises(ConfigError, match="trainer device is cpu"):
        TrainConfig(trainer_device="cpu", mps_pct=(50,)).validate()


def assert_nothing_lost(result: dict) -> None:
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    ), result
    assert result["lost_steps"] == 0


def small(**over) -> TrainConfig:
    base = {
        "steps": 24_000,
        "actors": 2,
        "envs_per_actor": 4,
        "rollout_len": 16,
        "batch_size": 512,
        "trainer_device": "cpu",
    }
    return TrainConfig(**{**base, **over})


@pytest.mark.slow
def test_two_cpu_gmis_train_in_lockstep_with_identical_weights():
    cfg = small(trainers=2, steps=8_000)  # invariants of every lockstep update: no long run
    result = Runner(cfg, cfg.validate()).run()
    assert_nothing_lost(result)
    assert result["gmi_sync"] == "multi-process-reduction" and result["gmi_sharing"] == "cpu"
    assert result["weights_identical"]
    gmis = result["gmis"]
    assert len(gmis) == 2 and all(g["trained_steps"] > 0 for g in gmis)
    assert sum(g["trained_steps"] for g in gmis) == result["env_steps"]


@pytest.mark.slow
@pytest.mark.parametrize("trainers", [1, 2])
def test_gmi_hand_over_mid_run_keeps_every_step_and_the_learner(trainers):
    """Replacing the GMIs mid-run: the new ones resume the learner, nothing is dropped."""
    cfg = small(trainers=trainers, steps=10**9)
    runner = Runner(cfg, cfg.validate())

    def hand_over_once(state):
        if state.trained_steps >= 4_000 and runner.generation == 0:
            runner.request_replace()
        new = [runner.telemetry.source(f"trainer-{r}.g1") for r in range(trainers)]
        if all(n.get("trained_steps", 0) >= cfg.batch_size for n in new):
            runner.stop_requested = True  # the new generation trained: drain and end

    runner.on_progress = hand_over_once
    result = runner.run()
    assert_nothing_lost(result)
    by_gen = {g: [x for x in result["gmis"] if x["generation"] == g] for g in (0, 1)}
    # make before break: generation 0 trained on while generation 1 started
    (handover,) = result["gmi_handovers"]
    assert handover["generation"] == 1 and not handover["waited_out"]
    assert handover["standby_s"] > 0
    assert len(by_gen[0]) == len(by_gen[1]) == trainers
    assert all(x["retired"] for x in by_gen[0]) and all(x["resumed"] for x in by_gen[1])
    assert all(x["trained_steps"] > 0 for x in by_gen[0] + by_gen[1])
    assert result["weights_identical"]
    for gmi in by_gen[0] + by_gen[1]:  # where each GMI's start went, stage by stage
        s = gmi["startup"]
        assert {"boot_s", "torch_import_s", "learner_s", "compile_s", "total_s"} <= set(s)
        assert sum(v for k, v in s.items() if k != "total_s") == pytest.approx(
            s["total_s"], abs=0.01
        )
        assert gmi["cpu_s"] > 0  # the trainer process's CPU seconds, its start-up included
    # the new GMIs reported as soon as they had started: the standby is their start and little more
    assert max(x["startup"]["total_s"] for x in by_gen[1]) <= handover["standby_s"] + 0.1
    # the policy version carries on: one version per lockstep update over both generations
    assert result["updates"] * cfg.batch_size * trainers >= result["env_steps"] * 0.9
    phases = result["phases"]
    assert [p["generation"] for p in phases] == [0, 1]
    assert sum(p["trained_steps"] for p in phases) == result["env_steps"]


@pytest.mark.slow
def test_a_run_that_ends_while_new_gmis_start_hands_over_and_drains_exact():
    """The run ends while a new generation is on standby (started, the old one still
    training): the drain retires the old one first, the new one takes the learner over and
    drains, and nothing is lost."""
    cfg = small(steps=10**9)
    runner = Runner(cfg, cfg.validate())

    def replace_and_stop(state):
        if state.trained_steps >= 4_000 and runner.generation == 0:
            runner.request_replace()
        elif runner.generation == 1 and "trainer-0.g1" not in runner.telemetry.seen:
            runner.stop_requested = True  # the new GMIs started and have not reported yet

    runner.on_progress = replace_and_stop
    result = runner.run()
    assert_nothing_lost(result)
    assert result["failure"] is None
    by_gen = {g: [x for x in result["gmis"] if x["generation"] == g] for g in (0, 1)}
    assert [x["retired"] for x in by_gen[0]] == [True]
    assert [x["resumed"] for x in by_gen[1]] == [True]
    (handover,) = result["gmi_handovers"]  # retired by the drain, before the new GMI reported
    assert handover["generation"] == 1 and not handover["waited_out"]


def test_the_old_generation_retires_only_once_the_new_gmis_have_reported(tmp_path, monkeypatch):
    """Make before break: ``replace`` starts the next generation, and the migrator is told to
    retire the old one only when every new GMI has reported (or ``STANDBY_MAX_S`` passed)."""
    import zmq

    from runtime import topology, wire
    from runtime.commands import CommandIn, CommandOut
    from runtime.envs import probe_env
    from runtime.gmi import fleet as fleet_mod

    started: list[str] = []
    cfg = small(trainers=2)
    fleet = fleet_mod.GMIFleet(cfg, probe_env("CartPole-v1"), lambda name, *_: started.append(name))
    ctx = zmq.Context()
    ep = topology.Endpoints.inproc("fleet-test")
    pub, sub = CommandOut(ctx.socket(zmq.PUB), ep.run_key), ctx.socket(zmq.SUB)
    pub.sock.bind("inproc://commands")
    sub.connect("inproc://commands")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    commands, malformed = CommandIn(sub, ep.run_key), wire.MalformedCounter("test")

    def retires() -> list[dict]:  # what the migrator takes: signed, each once
        out = []
        while commands.poll(50):
            out += [m.meta for m in commands.waiting(malformed)]
        assert malformed.count == 0
        out = [{k: v for k, v in m.items() if k not in ("n", "sig")} for m in out]
        return [m for m in out if m.get("cmd") == "retire"]

    fleet.start(ep, str(tmp_path))
    fleet.replace(ep, str(tmp_path), pub, None)
    assert started == ["trainer-0.g0", "trainer-1.g0", "trainer-0.g1", "trainer-1.g1"]
    reported = {"trainer-0.g1"}
    fleet.send_retire(pub, None, reported.__contains__, force=True)
    assert retires() == [] and fleet.handovers == []  # one new GMI has not reported yet
    reported.add("trainer-1.g1")
    fleet.send_retire(pub, None, reported.__contains__)
    assert retires() == [{"cmd": "retire", "generation": 0, "next_trainers": 2}]
    (handover,) = fleet.handovers
    assert handover["generation"] == 1 and not handover["waited_out"]
    # a generation that never reports is waited for STANDBY_MAX_S, not for ever
    fleet.replace(ep, str(tmp_path), pub, None)
    monkeypatch.setattr(fleet_mod, "STANDBY_MAX_S", 0.0)
    fleet.send_retire(pub, {"retired_generations": [0]}, reported.__contains__)
    assert retires() == [{"cmd": "retire", "generation": 1, "next_trainers": 2}]
    assert fleet.handovers[-1]["waited_out"]
    # the drain retires what is on standby at once
    monkeypatch.setattr(fleet_mod, "STANDBY_MAX_S", 120.0)
    fleet.replace(ep, str(tmp_path), pub, None)
    fleet.send_retire(pub, {"retired_generations": [0, 1]}, None)
    assert retires() == [{"cmd": "retire", "generation": 2, "next_trainers": 2}]
    ctx.destroy(linger=0)
