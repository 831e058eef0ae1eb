"""``Tanh``: ``nn.Tanh`` computed as ``2 * sigmoid(2x) - 1`` on the CPU.

PyTorch's CPU ``tanh`` kernel is several times slower than its ``sigmoid`` kernel (measured with
torch 2.13 on AVX-512: 3 ns against 0.4 ns per float32 element), so in a CPU trainer the MLP's
activations cost as much as its matrix products: ~29 % of an Ant-v5 update of 16,384 rows
(``bench/trainer_update.py``). The identity ``tanh(x) = 2 * sigmoid(2x) - 1`` holds to float32
rounding (|error| < 2e-7); the backward pass is tanh's own, ``grad * (1 - y^2)``. On other
devices, and for tensors too small for the difference to matter, it is ``torch.tanh``.

It has no parameters, so a model's ``state_dict`` is the same as with ``nn.Tanh``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SMALL = 4096
"""Element count under which ``torch.tanh`` is used as is (an actor's inference batch: the
custom autograd function's Python overhead would outweigh the faster kernel)."""


class _SigmoidTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = sigmoid_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x)`` as ``2 * sigmoid(2x) - 1``, with one temporary (no autograd)."""
    y = x.mul(2.0).sigmoid_()
    return y.mul_(2.0).sub_(1.0)


class Tanh(nn.Module):
    """Drop-in ``nn.Tanh`` that is faster on the CPU for batches of training size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.numel() < SMALL or x.dtype != torch.float32:
            return torch.tanh(x)
        if torch.is_grad_enabled() and x.requires_grad:
            return _SigmoidTanh.apply(x)
        return sigmoid_tanh(x)
