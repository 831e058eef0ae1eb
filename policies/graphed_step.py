"""A GPU learner's minibatch steps replayed from CUDA graphs.

A learner update is ``epochs x minibatches`` optimiser steps of a small MLP; on the GPU each
step is about 160 kernels of a few microseconds, so the update is bound by their launches, not
by the GPU: on an H200, a 256:128:64 policy's update of 10 x 32 steps took 1.7-1.9 s at every
batch from 4,096 to 65,536 samples, with the GPU busy for 126 ms of it. A CUDA graph launches
a step's kernels as one. ``GraphedSteps`` captures one graph per minibatch shape: the loss
and its backward (fused by ``torch.compile``: ``policies.compiled_loss``), a copy of the
gradient for the noise scale (``policies.noise_scale``), the gradient clip and the Adam step
(fused and ``capturable``, its learning rate a device tensor the schedule fills). Each
minibatch is gathered into the graph's input tensors and the graph replayed; the first steps of
a new shape run eagerly (a warm-up, as ``torch.cuda.graphs`` asks) and train like any other.

A non-finite gradient cannot be seen without a sync per step, which would cost what the graph
saves. Each step folds its gradient norm's finiteness into a flag on the device instead;
``finish`` reads it once per update and, where a step went non-finite, puts the weights and the
optimiser state back as they were before the update (``NonFiniteUpdate``: the update is not
applied at all).

Used for a single trainer on CUDA with float32 matmuls; a trainer group (its gradient
all-reduce runs between backward and step, and may skip a step) and bfloat16 autocast keep the
eager loop in ``policies.appo``.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from policies.compiled_loss import CompiledLoss
from policies.nonfinite import NonFiniteUpdate

if TYPE_CHECKING:
    from policies.appo import APPOLearner

WARMUP_STEPS = 3
"""Eager steps of a new minibatch shape before it is captured."""
MAX_SHAPES = 4
"""Graphs kept (one per minibatch shape; a tuner's batch-size changes make new ones): the
oldest is dropped past this, with its memory."""


def make_optimizer(model: nn.Module, lr: float, device: torch.device, graphs: bool) -> Any:
    """The learner's Adam. On a CUDA device it is ``fused`` (one kernel for every parameter's
    step, where the default launches several per parameter group), and for CUDA graphs
    (``graphs``) also ``capturable``, its learning rate a device tensor (a graph reads it at
    every replay). On the CPU, the plain one."""
    if device.type != "cuda":
        return torch.optim.Adam(model.parameters(), lr=lr, eps=1e-5)
    if not graphs:
        return torch.optim.Adam(model.parameters(), lr=lr, eps=1e-5, fused=True)
    rate = torch.tensor(lr, dtype=torch.float32, device=device)
    return torch.optim.Adam(model.parameters(), lr=rate, eps=1e-5, capturable=True, fused=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Sets every group's learning rate (in place where it is a device tensor)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def portable_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with plain-number learning rates and no ``capturable`` or
    ``fused`` flag, so a learner on any device can load it (``adopt_state``)."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        group["lr"] = float(group["lr"])
        group.pop("capturable", None)
        group.pop("fused", None)
    return state


def adopt_state(optimizer: torch.optim.Adam, state: dict[str, Any], device: torch.device) -> None:
    """Loads ``state`` (from ``portable_state`` or an older plain ``state_dict``) and puts back
    this optimizer's own form: a ``capturable`` one keeps its device-tensor learning rate, a
    ``fused`` or ``capturable`` one its step counts on the device (as float32); a plain one,
    numbers and step counts on the CPU."""
    capturable = bool(optimizer.param_groups[0].get("capturable"))
    fused = bool(optimizer.param_groups[0].get("fused"))
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        group["capturable"], group["fused"] = capturable, fused or None
        group["lr"] = torch.tensor(lr, dtype=torch.float32, device=device) if capturable else lr
    for per_param in optimizer.state.values():
        step = per_param.get("step")
        if isinstance(step, torch.Tensor):
            on_device = capturable or fused
            per_param["step"] = (
                step.to(device=device, dtype=torch.float32) if on_device else step.cpu()
            )


def wanted(model: nn.Module, device: torch.device, group: bool) -> bool:
    """Whether a learner of ``model`` on ``device`` replays graphs: a single trainer (no
    ``group``) on CUDA with float32 matmuls (see the module docstring)."""
    return device.type == "cuda" and not group and getattr(model, "matmul_dtype", None) is None


class _Graph:
    """One captured step and its input tensors, for minibatches of ``rows`` trajectories."""

    def __init__(self, inputs: dict[str, torch.Tensor]) -> None:
        self.inputs = inputs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0


class GraphedSteps:
    """The minibatch steps of ``learner``'s updates (see the module docstring). Per update:
    ``begin``, ``step`` for each minibatch, ``finish``. The learner's config is read at
    capture (clip, loss weights, gradient clip): it is fixed for the learner's life."""

    def __init__(self, learner: APPOLearner) -> None:
        self._learner = weakref.ref(learner)  # the learner holds this: no cycle keeps its pools
        dev = learner.device
        self.params = list(learner.model.parameters())
        self.flat = torch.zeros(sum(p.numel() for p in self.params), device=dev)
        """The last step's gradient before its clip (for the noise scale)."""
        self.sums = torch.zeros(3, device=dev)  # policy loss, value loss, entropy
        self.bad = torch.zeros((), dtype=torch.bool, device=dev)
        self.steps = 0
        self.graphs: dict[tuple[int, ...], _Graph] = {}
        self._backup: list[torch.Tensor] = []
        self._live: list[torch.Tensor] = []
        self._had_state = False
        self._side: torch.cuda.Stream | None = None
        self.loss = CompiledLoss() if learner.config.compile_loss else None
        """The loss fused by ``torch.compile`` (``policies.compiled_loss``), or None: the
        plain loss (``learner.compile_loss`` off)."""

    @property
    def learner(self) -> APPOLearner:
        learner = self._learner()
        if learner is None:
            raise RuntimeError("the learner of these graphs is gone")
        return learner

    def reset(self) -> None:
        """Drops the captured graphs (the optimiser state they point at was replaced)."""
        self.graphs.clear()

    def begin(self) -> None:
        """Zeroes the sums and the flag and keeps a copy of the weights and optimiser state."""
        self.sums.zero_()
        self.bad.zero_()
        self.steps = 0
        opt = self.learner.optimizer
        self._had_state = bool(opt.state)
        self._live = list(self.params)
        for p in self.params:
            self._live += [t for t in opt.state.get(p, {}).values() if isinstance(t, torch.Tensor)]
        self._backup = [t.detach().clone() for t in self._live]

    def prepare(self, rollout_len: int) -> None:
        """Compiles the loss (``policies.compiled_loss``) before the first update, on a made-up
        minibatch of two trajectories of ``rollout_len`` steps shaped and typed as a batch's,
        and drops its gradients: the weights, the optimiser state and the observation
        statistics stay as they were. A trainer does this as it starts, so a GMI generation
        that takes over (``runtime.gmi.fleet``) compiles before it reports, while the old one
        still trains, and a run's first update does not wait for the compile."""
        if self.loss is None:
            return
        learner = self.learner
        model, dev = learner.model, learner.device
        obs_dim = model.obs_norm.mean.shape[0]
        act = (2, rollout_len) if model.discrete else (2, rollout_len, model.log_std.shape[0])
        x = {
            "obs": torch.zeros((2, rollout_len, obs_dim), device=dev),
            "actions": torch.zeros(act, dtype=torch.int64 if model.discrete else None, device=dev),
            **{k: torch.zeros((2, rollout_len), device=dev) for k in ("logp", "adv", "vs")},
        }
        for t in x.values():
            self.loss.mark(t)
        self.loss.backward(learner, (x["obs"], x["actions"], x["logp"], x["adv"], x["vs"]))
        learner.optimizer.zero_grad(set_to_none=True)

    def step(self, batch: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
        """One optimiser step on the trajectories ``idx`` of ``batch`` (``obs`` without the
        bootstrap step, ``actions``, ``logp``, ``adv``, ``vs``); returns the gradient before
        its clip (valid until the next step)."""
        key = (len(idx), *batch["obs"].shape[1:], *(str(v.dtype) for v in batch.values()))
        g = self.graphs.get(key)
        if g is not None:
            self.graphs[key] = self.graphs.pop(key)  # the most recently used goes last
        else:
            if len(self.graphs) >= MAX_SHAPES:
                self.graphs.pop(next(iter(self.graphs)))
            g = self.graphs[key] = _Graph(
                {
                    k: torch.empty((len(idx), *v.shape[1:]), dtype=v.dtype, device=v.device)
                    for k, v in batch.items()
                }
            )
            if self.loss is not None:
                for t in g.inputs.values():
                    self.loss.mark(t)
        for k, v in batch.items():
            torch.index_select(v, 0, idx, out=g.inputs[k])
        self.steps += 1
        if g.graph is not None:
            g.graph.replay()
            return self.flat
        if g.eager_steps < WARMUP_STEPS:
            side = self._side = self._side or torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._body(g.inputs)
            torch.cuda.current_stream().wait_stream(side)
            g.eager_steps += 1
            return self.flat
        self.learner.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body(g.inputs)
        g.graph = graph  # only a capture that succeeded is replayed
        graph.replay()  # capture records the kernels; the replay runs this step
        return self.flat

    def _body(self, x: dict[str, torch.Tensor]) -> None:
        learner = self.learner
        learner.optimizer.zero_grad(set_to_none=False)
        inputs = (x["obs"], x["actions"], x["logp"], x["adv"], x["vs"])
        if self.loss is not None:
            _, loss_pi, loss_v, entropy = self.loss.backward(learner, inputs)
        else:
            loss, loss_pi, loss_v, entropy = learner.minibatch_loss(*inputs)
            loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        torch.cat([g.reshape(-1) for g in grads], out=self.flat)
        norm = nn.utils.clip_grad_norm_(self.params, learner.config.max_grad_norm)
        self.bad.logical_or_(~torch.isfinite(norm))
        learner.optimizer.step()
        self.sums.add_(torch.stack([loss_pi.detach(), loss_v.detach(), entropy.detach()]))

    def finish(self) -> tuple[float, float, float]:
        """The update's mean policy loss, value loss and entropy, after checking its steps.

        Raises:
            NonFiniteUpdate: a step's gradient was not finite; the weights and the optimiser
                state are back as before the update.
        """
        live, backup, self._backup, self._live = self._live, self._backup, [], []
        if bool(self.bad):  # the update's one sync in its steps (its KL, after them, is another)
            with torch.no_grad():
                for t, saved in zip(live, backup, strict=True):
                    t.copy_(saved)  # in place: the graphs still point at them
            if not self._had_state:
                self.learner.optimizer.state.clear()
                self.reset()  # they point at the state just dropped
            raise NonFiniteUpdate(
                f"non-finite gradient in the update to version {self.learner.version + 1}; "
                "the update was not applied (the weights and optimiser state are as before it)"
            )
        mean = (self.sums / max(self.steps, 1)).tolist()
        return mean[0], mean[1], mean[2]
