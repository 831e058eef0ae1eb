"""The CUDA-graph learner steps (``policies.graphed_step``) against the eager loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.actor_critic import ActorCritic
from policies.appo import APPOLearner
from policies.appo_config import APPOConfig
from policies.graphed_step import MAX_SHAPES, WARMUP_STEPS
from policies.nonfinite import NonFiniteUpdate

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CFG = APPOConfig(lr=1e-3, epochs=3, minibatches=4, lr_schedule="constant")


def batch(n: int, t: int = 8, obs_dim: int = 5, act_dim: int = 2, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, t + 1, obs_dim)).astype(np.float32),
        "actions": rng.standard_normal((n, t, act_dim)).astype(np.float32),
        "rewards": rng.standard_normal((n, t)).astype(np.float32),
        "dones": (rng.random((n, t)) < 0.05).astype(np.uint8),
        "logp": np.full((n, t), -2.0, np.float32),
        "versions": np.zeros((n, t), np.int32),
    }


def learner(device: str, graphs: bool = True, cfg: APPOConfig = CFG) -> APPOLearner:
    torch.manual_seed(0)
    model = ActorCritic(5, 2, False, "auto:32:32:auto", True)
    return APPOLearner(model, cfg, torch.device(device), group=not graphs)


def run(learn: APPOLearner, batches: list[dict]) -> list:
    out = []
    for i, b in enumerate(batches):
        torch.manual_seed(100 + i)  # the same minibatch permutations for both learners
        out.append(learn.update(b))
    return out


@pytest.mark.gpu
@cuda
def test_graphed_updates_train_as_the_eager_loop_does():
    """Over updates that warm up, capture and replay (and a second minibatch shape), the graphed
    learner ends with the eager learner's weights, losses and noise scale."""
    batches = [batch(32, seed=s) for s in range(4)] + [batch(48, seed=9)]
    graphed, eager = learner("cuda"), learner("cuda", graphs=False)
    got, want = run(graphed, batches), run(eager, batches)
    assert graphed.graphs is not None
    assert all(g.graph is not None for g in graphed.graphs.graphs.values())
    assert len(graphed.graphs.graphs) == 2
    for k, v in eager.model.state_dict().items():
        torch.testing.assert_close(graphed.model.state_dict()[k], v, rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want, strict=True):
        assert a.loss_pi == pytest.approx(b.loss_pi, rel=1e-3, abs=1e-5)
        assert a.loss_v == pytest.approx(b.loss_v, rel=1e-3, abs=1e-5)
        assert a.entropy == pytest.approx(b.entropy, rel=1e-4)
    assert got[-1].noise_scale == pytest.approx(want[-1].noise_scale, rel=1e-3)


@pytest.mark.gpu
@cuda
def test_a_non_finite_step_rolls_the_whole_update_back():
    """A non-finite gradient in a replayed step: the weights and the optimiser state are those
    from before the update, the version does not move, and the learner trains on after."""
    learn = learner("cuda")
    run(learn, [batch(32, seed=s) for s in range(3)])  # captured by now
    assert all(g.graph is not None for g in learn.graphs.graphs.values())
    before = {k: v.clone() for k, v in learn.model.state_dict().items()}
    moments = [
        [t.clone() for t in s.values() if isinstance(t, torch.Tensor)]
        for s in learn.optimizer.state.values()
    ]
    version, noise = learn.version, learn.noise.state()
    bad = batch(32, seed=7)
    bad["rewards"][3, 2] = np.inf
    with pytest.raises(NonFiniteUpdate, match=r"non-finite gradient.*not applied"):
        learn.update(bad)
    assert learn.version == version and learn.noise.state() == noise
    for k, v in learn.model.state_dict().items():
        if not k.startswith("obs_norm"):  # the statistics took the (finite) observations
            assert torch.equal(v, before[k]), k
    for saved, s in zip(moments, learn.optimizer.state.values(), strict=True):
        now = [t for t in s.values() if isinstance(t, torch.Tensor)]
        assert all(torch.equal(a, b) for a, b in zip(saved, now, strict=True))
    stats = learn.update(batch(32, seed=8))
    assert np.isfinite(stats.loss_pi) and learn.version == version + 1


@pytest.mark.gpu
@cuda
def test_state_hands_over_between_a_graphed_and_a_cpu_learner():
    """A CUDA learner's state loads on the CPU and back; the learning rate stays a number in
    the saved state, and the CUDA learner captures anew after loading."""
    gpu = learner("cuda")
    run(gpu, [batch(32, seed=s) for s in range(2)])
    state = gpu.state()
    for g in state["optimizer"]["param_groups"]:
        assert isinstance(g["lr"], float) and "fused" not in g and "capturable" not in g
    cpu = learner("cpu")
    cpu.load_state(state)
    cpu.update(batch(32, seed=3))
    back = learner("cuda")
    run(back, [batch(32, seed=s) for s in range(2)])  # graphs captured, then replaced state
    assert back.graphs.graphs
    back.load_state(cpu.state())
    assert not back.graphs.graphs  # they pointed at the optimiser state just replaced
    assert back.optimizer.param_groups[0]["capturable"] and back.optimizer.param_groups[0]["fused"]
    eager = learner("cuda", graphs=False)
    eager.load_state(cpu.state())
    group = eager.optimizer.param_groups[0]
    assert not group["capturable"] and group["fused"] and isinstance(group["lr"], float)
    steps = [s["step"] for s in eager.optimizer.state.values()]  # fused keeps them on the GPU
    assert steps and all(t.is_cuda and t.dtype == torch.float32 for t in steps)
    later = [batch(32, seed=s) for s in range(4, 4 + WARMUP_STEPS)]
    run(back, later), run(eager, later)
    for k, v in eager.model.state_dict().items():
        assert back.model.state_dict()[k].is_cuda, k
        torch.testing.assert_close(back.model.state_dict()[k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@cuda
def test_a_non_finite_first_update_leaves_no_optimiser_state():
    """Rolled back before any update held: no Adam state is left, and the learner trains on,
    capturing anew."""
    learn = learner("cuda")
    bad = batch(32, seed=1)
    bad["rewards"][0, 0] = np.nan
    with pytest.raises(NonFiniteUpdate):
        learn.update(bad)
    assert not learn.optimizer.state and not learn.graphs.graphs and learn.version == 0
    stats = run(learn, [batch(32, seed=s) for s in range(2)])
    assert np.isfinite(stats[-1].loss_pi) and learn.version == 2
    assert all(g.graph is not None for g in learn.graphs.graphs.values())


@pytest.mark.gpu
@cuda
def test_the_learning_rate_schedule_reaches_a_captured_step():
    """A captured Adam step reads the learning rate the schedule sets at each update: at a
    learning rate of 0 (the linear schedule's end) the weights stop moving."""
    cfg = APPOConfig(lr=1e-3, epochs=3, minibatches=4, lr_schedule="linear")
    learn = learner("cuda", cfg=cfg)
    learn.total_steps = 10**9
    run(learn, [batch(32, seed=s) for s in range(3)])
    learn.trained_steps = learn.total_steps  # the schedule's end
    before = [p.detach().clone() for p in learn.model.parameters()]
    learn.update(batch(32, seed=5))
    assert all(torch.equal(a, b) for a, b in zip(before, learn.model.parameters(), strict=True))


@pytest.mark.gpu
@cuda
def test_graphs_are_kept_for_a_bounded_number_of_shapes():
    learn = learner("cuda", cfg=APPOConfig(lr=1e-3, epochs=1, minibatches=2))
    for rows in range(MAX_SHAPES + 2):
        for _ in range(3):
            learn.update(batch(2 * (rows + 4), seed=rows))
    assert len(learn.graphs.graphs) == MAX_SHAPES


@pytest.mark.gpu
@cuda
def test_a_minibatch_floor_splits_graphed_and_eager_updates_alike():
    """Under ``min_minibatch`` a small batch takes fewer, bigger minibatches: the graphed
    learner captures that shape and ends with the eager learner's weights."""
    cfg = APPOConfig(lr=1e-3, epochs=2, minibatches=4, min_minibatch=96, lr_schedule="constant")
    batches = [batch(32, seed=s) for s in range(3)] + [batch(48, seed=9)]  # 256, then 384 samples
    graphed, eager = learner("cuda", cfg=cfg), learner("cuda", graphs=False, cfg=cfg)
    got, want = run(graphed, batches), run(eager, batches)
    assert [s.minibatches for s in got] == [s.minibatches for s in want] == [2, 2, 2, 4]
    for k, v in eager.model.state_dict().items():
        torch.testing.assert_close(graphed.model.state_dict()[k], v, rtol=1e-4, atol=1e-5)
