"""The learner as it was before an eager update, put back when the update fails.

An update's minibatch steps are applied one by one; a non-finite gradient in a later step
ends the update (``NonFiniteUpdate``), and without this the steps before it would stay in the
weights under the version number of the weights before them: the weights published as that
version, and a checkpoint saved at the run's stop, would then disagree. The graphed CUDA step
keeps its own backup (``policies.graphed_step``); this one is for the eager loop.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class UpdateBackup:
    """The model's parameters and buffers (observation statistics included) and the
    optimiser's state, copied when made; ``restore`` puts them back in place."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        with torch.no_grad():
            self.tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.optimizer_state = copy.deepcopy(optimizer.state_dict())

    def restore(self) -> None:
        with torch.no_grad():
            for name, live in self.model.state_dict().items():
                live.copy_(self.tensors[name])
        self.optimizer.load_state_dict(self.optimizer_state)
