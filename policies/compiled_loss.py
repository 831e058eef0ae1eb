"""The minibatch loss fused by ``torch.compile``, for a learner that replays CUDA graphs.

A graphed step (``policies.graphed_step``) is about 160 kernels of a few microseconds each, and
the loss's forward and backward are most of them: a kernel for every bias, activation,
normalisation and term of the surrogate beside the MLP's matmuls. TorchInductor fuses the
elementwise work into a few Triton kernels. The learner's update then runs on fewer, larger
kernels: on an H200, 1.36-1.70x the samples/s of the plain graphs at batches from 4,096 to
65,536 (Ant-v5, a 256:128:64 policy, 10 x 32 steps per update; ``bench.learner_limit``).

One compile serves every minibatch size: the row dimension is marked dynamic. (A minibatch of
one trajectory runs the plain loss: a compile would specialise to that one row, and the next
size would compile again; the learner probe times batches of two per minibatch or more,
``runtime.probes.learner_batches``.) On an H200 host the update that compiles took 5-6 s
from an empty cache and 3-3.5 s once TorchInductor's cache held the kernels
(``runtime.cache_dirs.use_kernel_cache`` puts that cache beside the probe cache); the first
process on a fresh machine took 13-16 s. A trainer compiles as it starts
(``GraphedSteps.prepare``, on a made-up minibatch), before it reports: a GMI generation that
takes over compiles while the old one still trains. Otherwise the compile happens in the
warm-up steps before a graph is captured; never inside a capture. One compile thread: no
worker pool beside the actors (16 threads compiled no faster there). A compile that fails (no
Triton for this GPU, an operator Inductor cannot lower) is logged once, and the learner steps
on the plain loss: the same arithmetic, unfused.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from policies.appo import APPOLearner

logger = logging.getLogger(__name__)

Losses = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _loss(
    learner: APPOLearner,
    obs: torch.Tensor,
    actions: torch.Tensor,
    logp: torch.Tensor,
    adv: torch.Tensor,
    vs: torch.Tensor,
) -> Losses:
    return learner.minibatch_loss(obs, actions, logp, adv, vs)


class CompiledLoss:
    """``learner.minibatch_loss`` and its backward, compiled at the first call of two rows or
    more; the plain loss for one row, and once a compile has failed (``failed`` says why).
    ``mark`` marks a minibatch input's rows dynamic. ``backend``: ``torch.compile``'s."""

    def __init__(self, backend: str | Callable = "inductor") -> None:
        self._fn = None
        self.backend = backend
        self.failed: str | None = None

    @staticmethod
    def mark(tensor: torch.Tensor) -> None:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)

    def backward(self, learner: APPOLearner, inputs: tuple[torch.Tensor, ...]) -> Losses:
        """The losses of the minibatch ``inputs`` (``obs``, ``actions``, ``logp``, ``adv``,
        ``vs``), their gradients accumulated into the learner's parameters. The backward is
        compiled at its first call (lazily, by AOTAutograd), so both halves are tried here: a
        compile that fails in either leaves no gradient behind and the step runs the plain
        loss. An out-of-memory error, and any error while a CUDA graph is being captured (a
        compile there would be a fault of its own), are raised."""
        if self.failed is None and inputs[0].shape[0] > 1:
            try:
                out = self._compiled()(learner, *inputs)
                out[0].backward()
                return out
            except Exception as exc:  # a compile that fails leaves the arithmetic to eager
                if isinstance(exc, torch.OutOfMemoryError) or _capturing():
                    raise
                cause = getattr(exc, "inner_exception", None) or exc.__cause__ or exc
                self.failed = f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}"
                logger.warning("the learner's loss runs uncompiled: %s", self.failed)
                learner.optimizer.zero_grad(set_to_none=False)
        out = learner.minibatch_loss(*inputs)
        out[0].backward()
        return out

    def _compiled(self):
        if self._fn is None:
            import torch._inductor.config as inductor

            inductor.compile_threads = 1
            # float32 matmuls stay float32 (TF32 would change the learner's arithmetic)
            warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
            self._fn = torch.compile(_loss, fullgraph=True, backend=self.backend)
        return self._fn


def compile_parts() -> dict[str, float]:
    """Seconds this process has spent so far in each stage of TorchDynamo's compiles (its own
    ``compile_times``, summed per stage: tracing, the backend, loading cached kernels...):
    where a GMI's ``compile_s`` went. Empty where nothing imported TorchDynamo, which this
    never imports itself."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    try:
        headers, values = utils.compile_times(repr="csv", aggregate=True)
        return {str(h): round(float(v), 3) for h, v in zip(headers, values, strict=True)}
    except Exception:  # its format is TorchDynamo's to change: the parts are only a record
        return {}


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
