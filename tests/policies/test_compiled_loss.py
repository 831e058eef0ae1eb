"""The learner's loss fused by ``torch.compile`` (``policies.compiled_loss``)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys

import pytest
import torch
import torch._inductor.config as inductor
from torch._dynamo.utils import counters

from policies.actor_critic import ActorCritic
from policies.appo import APPOLearner
from policies.appo_config import APPOConfig
from policies.compiled_loss import CompiledLoss, compile_parts
from policies.graphed_step import GraphedSteps
from runtime.cache_dirs import KERNEL_CACHE_ENV, use_kernel_cache
from tests.policies.test_graphed_step import CFG, batch, cuda, learner, run

compiler = pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("c++")),
    reason="Inductor's CPU kernels need a C++ compiler",
)


def inputs(rows: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(rows)
    shapes = [(rows, 8, 5), (rows, 8, 2), (rows, 8), (rows, 8), (rows, 8)]
    return tuple(torch.randn(s, generator=g) for s in shapes)


def cpu_learner(cfg: APPOConfig = CFG) -> APPOLearner:
    torch.manual_seed(0)
    return APPOLearner(ActorCritic(5, 2, False, "auto:32:32:auto", True), cfg, torch.device("cpu"))


def plain(learn: APPOLearner, x: tuple[torch.Tensor, ...]) -> tuple[list, list]:
    """The plain loss's values and gradients for ``x`` (the learner's gradients replaced)."""
    learn.optimizer.zero_grad(set_to_none=True)
    out = learn.minibatch_loss(*x)
    out[0].backward()
    return [float(v) for v in out], [p.grad.clone() for p in learn.model.parameters()]


def fresh() -> None:
    torch._dynamo.reset()
    counters.clear()  # reset() leaves them


def test_a_compile_that_fails_leaves_the_plain_loss(caplog):
    """A real Inductor failure (no C++ compiler for the CPU kernels): the step gets the plain
    loss's values and gradients, the reason is logged once and kept, and no compile is tried
    again."""
    learn, loss, x = cpu_learner(), CompiledLoss(), inputs(4)
    for t in x:
        loss.mark(t)
    no_compiler = inductor.patch({"cpp.cxx": ("/nonexistent/c++",)})
    try:
        with no_compiler, caplog.at_level(logging.WARNING, logger="policies.compiled_loss"):
            got = loss.backward(learn, x)
            grads = [p.grad.clone() for p in learn.model.parameters()]
            again = loss.backward(learn, inputs(6))
    finally:
        fresh()
    want, want_grads = plain(learn, x)
    assert [float(v) for v in got] == want
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    assert len(again) == 4
    assert loss.failed is not None and "C++ compiler" in loss.failed
    warned = [r for r in caplog.records if "runs uncompiled" in r.getMessage()]
    assert len(warned) == 1


def test_a_backward_that_fails_to_compile_leaves_the_plain_loss_and_its_gradients(caplog):
    """A backend whose forward compiles and whose backward compiler fails (AOTAutograd
    compiles the backward at the first backward): the step still returns the plain loss's
    values and gradients, none of the failed attempt's added to them."""
    from torch._dynamo.backends.common import aot_autograd

    def fails(gm, example_inputs):
        raise RuntimeError("no kernels for this backward")

    learn, x = cpu_learner(), inputs(4)
    loss = CompiledLoss(backend=aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=fails))
    try:
        with caplog.at_level(logging.WARNING, logger="policies.compiled_loss"):
            got = loss.backward(learn, x)
    finally:
        fresh()
    grads = [p.grad.clone() for p in learn.model.parameters()]
    assert loss.failed is not None and "no kernels for this backward" in loss.failed
    want, want_grads = plain(learn, x)
    assert [float(v) for v in got] == want
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)


def test_an_out_of_memory_error_is_not_taken_for_a_failed_compile():
    """The compiled loss runs out of memory as it runs: that error is the caller's."""

    def no_memory(gm, example_inputs):
        def compiled(*args):
            raise torch.OutOfMemoryError("out of memory")

        return compiled

    loss = CompiledLoss(backend=no_memory)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            loss.backward(cpu_learner(), inputs(4))
    finally:
        fresh()
    assert loss.failed is None


def test_the_compile_is_a_learner_setting():
    assert APPOConfig().compile_loss is True
    assert "compile_loss='yes'" in APPOConfig(compile_loss="yes").problems()[0]
    for on in (True, False):
        learn = cpu_learner(APPOConfig(compile_loss=on))
        assert (GraphedSteps(learn).loss is not None) is on


def test_the_kernel_cache_sits_beside_the_probe_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(KERNEL_CACHE_ENV, "set")  # recorded, so the test's own setting is undone
    monkeypatch.delenv(KERNEL_CACHE_ENV)
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    assert use_kernel_cache() == tmp_path / "inductor"
    monkeypatch.setenv(KERNEL_CACHE_ENV, str(tmp_path / "mine"))
    assert use_kernel_cache() == tmp_path / "mine"  # the user's own setting stands


@compiler
def test_preparing_compiles_ahead_and_changes_nothing_of_the_learner():
    """``prepare`` compiles the loss on a made-up minibatch (a real compile, here Inductor's
    CPU kernels): the weights, the optimiser state and the statistics stay as they were, no
    gradient is left, and a real minibatch of another row count compiles nothing more."""
    fresh()
    learn, x = cpu_learner(), inputs(5)
    before = {k: v.clone() for k, v in learn.model.state_dict().items()}
    steps = GraphedSteps(learn)  # on the CPU a learner runs eagerly; its steps compile alike
    try:
        steps.prepare(8)
        assert steps.loss is not None and steps.loss.failed is None, steps.loss.failed
        assert counters["stats"]["unique_graphs"] == 1
        parts = compile_parts()  # where a GMI's compile_s went, for its start-up record
        assert parts["bytecode_tracing"] > 0 and parts["OutputGraph.call_user_compiler"] > 0
        for k, v in learn.model.state_dict().items():
            assert torch.equal(v, before[k]), k
        assert not learn.optimizer.state
        assert all(p.grad is None for p in learn.model.parameters())
        for t in x:
            steps.loss.mark(t)
        got = steps.loss.backward(learn, x)
        assert counters["stats"]["unique_graphs"] == 1  # compiled ahead: nothing new
    finally:
        fresh()
    grads = [p.grad.clone() for p in learn.model.parameters()]
    want, want_grads = plain(learn, x)
    assert [float(v) for v in got] == pytest.approx(want, rel=1e-5, abs=1e-6)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@cuda
def test_a_compiled_learner_trains_as_the_plain_graphs_do_and_compiles_once():
    """Graphed updates over three minibatch shapes: one trajectory per minibatch (the plain
    loss), then 8 and 12; the compiled loss was used (no fallback), one compile served both
    larger shapes, and the weights end where the uncompiled graphs' do."""
    fresh()
    batches = [batch(4, seed=7)] + [batch(32, seed=s) for s in range(4)] + [batch(48, seed=9)]
    compiled = learner("cuda")
    uncompiled = learner("cuda", cfg=APPOConfig(**{**CFG.to_dict(), "compile_loss": False}))
    run(compiled, batches[:1])
    assert counters["stats"]["unique_graphs"] == 0  # one row: nothing compiled
    run(compiled, batches[1:3])
    assert counters["stats"]["unique_graphs"] == 1
    run(compiled, batches[3:])
    assert counters["stats"]["unique_graphs"] == 1  # the third shape compiled nothing
    for part in (batches[:1], batches[1:3], batches[3:]):  # seeded as the compiled runs were
        run(uncompiled, part)
    assert compiled.graphs is not None and compiled.graphs.loss is not None
    assert compiled.graphs.loss.failed is None
    assert uncompiled.graphs is not None and uncompiled.graphs.loss is None
    for k, v in uncompiled.model.state_dict().items():
        torch.testing.assert_close(compiled.model.state_dict()[k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@cuda
def test_a_prepared_graphed_learner_compiles_nothing_at_its_first_update():
    """A CUDA learner prepared for its rollout length trains as an unprepared one, and its
    updates compile nothing more."""
    fresh()
    batches = [batch(32, seed=s) for s in range(3)]
    prepared, unprepared = learner("cuda"), learner("cuda")
    before = {k: v.clone() for k, v in prepared.model.state_dict().items()}
    prepared.prepare(8)
    assert counters["stats"]["unique_graphs"] == 1
    for k, v in prepared.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    run(prepared, batches)
    assert counters["stats"]["unique_graphs"] == 1
    run(unprepared, batches)
    for k, v in unprepared.model.state_dict().items():
        torch.testing.assert_close(prepared.model.state_dict()[k], v, rtol=1e-4, atol=1e-5)


def test_the_compile_parts_of_a_process_that_never_compiled_are_empty_and_import_nothing():
    code = (
        "import sys; from policies.compiled_loss import compile_parts; "
        "print(compile_parts(), 'torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["{}", "False"], out.stderr
