"""The learner's loss fused by ``torch.compile`` (``policies.compiled_loss``)."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
import torch._inductor.config as inductor

from policies.actor_critic import ActorCritic
from policies.appo import APPOLearner
from policies.appo_config import APPOConfig
from policies.compiled_loss import CompiledLoss
from runtime.cache_dirs import KERNEL_CACHE_ENV, use_kernel_cache
from tests.policies.test_graphed_step import CFG, batch, cuda, learner, run


def inputs(rows: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(rows)
    shapes = [(rows, 8, 5), (rows, 8, 2), (rows, 8), (rows, 8), (rows, 8)]
    return tuple(torch.randn(s, generator=g) for s in shapes)


def test_a_compile_that_fails_leaves_the_plain_loss(caplog):
    """A real Inductor failure (no C++ compiler for the CPU kernels): the step gets the plain
    loss's values, the reason is logged once and kept, and no compile is tried again."""
    torch.manual_seed(0)
    learn = APPOLearner(ActorCritic(5, 2, False, "auto:32:32:auto", True), CFG, torch.device("cpu"))
    loss = CompiledLoss()
    x = inputs(4)
    for t in x:
        loss.mark(t)
    no_compiler = inductor.patch({"cpp.cxx": ("/nonexistent/c++",)})
    try:
        with no_compiler, caplog.at_level(logging.WARNING, logger="policies.compiled_loss"):
            got = loss(learn, *x)
            again = loss(learn, *inputs(6))
    finally:
        torch._dynamo.reset()
    want = learn.minibatch_loss(*x)
    assert [float(v) for v in got] == [float(v) for v in want]
    assert len(again) == 4
    assert loss.failed is not None and "C++ compiler" in loss.failed
    warned = [r for r in caplog.records if "runs uncompiled" in r.getMessage()]
    assert len(warned) == 1


def test_the_compile_is_a_learner_setting():
    assert APPOConfig().compile_loss is True
    assert "compile_loss='yes'" in APPOConfig(compile_loss="yes").problems()[0]
    learn = APPOLearner(
        ActorCritic(5, 2, False, "auto:32:32:auto", True),
        APPOConfig(compile_loss=False),
        torch.device("cpu"),
    )
    assert learn.graphs is None  # on the CPU nothing is graphed, so nothing is compiled


def test_the_kernel_cache_sits_beside_the_probe_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(KERNEL_CACHE_ENV, raising=False)
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    assert use_kernel_cache() == tmp_path / "inductor"
    monkeypatch.setenv(KERNEL_CACHE_ENV, str(tmp_path / "mine"))
    assert use_kernel_cache() == tmp_path / "mine"  # the user's own setting stands


@pytest.mark.gpu
@cuda
def test_a_compiled_learner_trains_as_the_plain_graphs_do_and_compiles_once():
    """Graphed updates over three minibatch shapes: one trajectory per minibatch (the plain
    loss), then 8 and 12; the compiled loss was used (no fallback), one compile served both
    larger shapes, and the weights end where the uncompiled graphs' do."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    batches = [batch(4, seed=7)] + [batch(32, seed=s) for s in range(4)] + [batch(48, seed=9)]
    compiled = learner("cuda")
    plain = learner("cuda", cfg=APPOConfig(**{**CFG.to_dict(), "compile_loss": False}))
    run(compiled, batches[:1])
    assert counters["stats"]["unique_graphs"] == 0  # one row: nothing compiled
    run(compiled, batches[1:3])
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    run(compiled, batches[3:])
    assert counters["stats"]["unique_graphs"] == graphs  # the third shape compiled nothing
    for part in (batches[:1], batches[1:3], batches[3:]):  # seeded as the compiled runs were
        run(plain, part)
    assert compiled.graphs is not None and compiled.graphs.loss is not None
    assert compiled.graphs.loss.failed is None
    assert plain.graphs is not None and plain.graphs.loss is None
    for k, v in plain.model.state_dict().items():
        torch.testing.assert_close(compiled.model.state_dict()[k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("c++")),
    reason="Inductor's CPU kernels need a C++ compiler",
)
def test_preparing_compiles_ahead_and_changes_nothing_of_the_learner():
    """``prepare`` compiles the loss on a made-up minibatch (a real compile, here Inductor's
    CPU kernels): the weights, the optimiser state and the statistics stay as they were, no
    gradient is left, and a real minibatch of another row count compiles nothing more."""
    from torch._dynamo.utils import counters

    from policies.graphed_step import GraphedSteps

    torch._dynamo.reset()
    torch.manual_seed(0)
    learn = APPOLearner(ActorCritic(5, 2, False, "auto:32:32:auto", True), CFG, torch.device("cpu"))
    before = {k: v.clone() for k, v in learn.model.state_dict().items()}
    steps = GraphedSteps(learn)  # on the CPU a learner runs eagerly; its steps compile alike
    try:
        steps.prepare(8)
        graphs = counters["stats"]["unique_graphs"]
        assert steps.loss is not None and steps.loss.failed is None, steps.loss.failed
        assert graphs >= 1
        x = inputs(5)
        for t in x:
            steps.loss.mark(t)
        got = steps.loss(learn, *x)
        assert counters["stats"]["unique_graphs"] == graphs  # compiled ahead: nothing new
    finally:
        torch._dynamo.reset()
    for k, v in learn.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not learn.optimizer.state
    assert all(p.grad is None for p in learn.model.parameters())
    want = learn.minibatch_loss(*x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@cuda
def test_a_prepared_graphed_learner_compiles_nothing_at_its_first_update():
    """A CUDA learner prepared for its rollout length trains as an unprepared one, and its
    updates compile nothing more."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    batches = [batch(32, seed=s) for s in range(3)]
    prepared, plain = learner("cuda"), learner("cuda")
    before = {k: v.clone() for k, v in prepared.model.state_dict().items()}
    prepared.prepare(8)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    for k, v in prepared.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    run(prepared, batches)
    assert counters["stats"]["unique_graphs"] == graphs
    run(plain, batches)
    for k, v in plain.model.state_dict().items():
        torch.testing.assert_close(prepared.model.state_dict()[k], v, rtol=1e-4, atol=1e-5)
