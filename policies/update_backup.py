"""The learner as it was before an eager update, put back when the update fails.

An update's minibatch steps are applied one by one; a non-finite gradient in a later step
ends the update (``NonFiniteUpdate``), and without this the steps before it would stay in the
weights under the version number of the weights before them: the weights published as that
version, and a checkpoint saved at the run's stop, would then disagree. The graphed CUDA step
keeps its own backup (``policies.graphed_step``: its graphs need the same tensors written
back); this one is for the eager loop, made at every update: tensor copies, no more.
"""

from __future__ import annotations

import torch
from torch import nn


def _copied(value: object) -> object:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


class UpdateBackup:
    """The model's parameters and buffers (observation statistics included) and the
    optimiser's per-parameter state, copied when made; ``restore`` puts them back."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        with torch.no_grad():
            self.tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.state = {
                p: {k: _copied(v) for k, v in s.items()} for p, s in optimizer.state.items()
            }

    def restore(self) -> None:
        with torch.no_grad():
            for name, live in self.model.state_dict().items():
                live.copy_(self.tensors[name])
        self.optimizer.state.clear()  # a parameter that had no state before has none again
        self.optimizer.state.update(self.state)
