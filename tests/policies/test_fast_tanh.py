"""``policies.fast_tanh.Tanh`` is ``nn.Tanh`` to float32 rounding, forward and backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from policies.actor_critic import ActorCritic
from policies.fast_tanh import SMALL, Tanh


@pytest.mark.parametrize("shape", [(3, 5), (64, 256), (4, 33, 128)])
def test_forward_and_gradient_match_torch_tanh(shape):
    torch.manual_seed(0)
    x = (torch.randn(*shape) * 3).requires_grad_()
    ref = x.detach().clone().requires_grad_()
    y, y_ref = Tanh()(x), torch.tanh(ref)
    assert torch.allclose(y, y_ref, atol=5e-7, rtol=0)
    g = torch.randn(*shape)
    y.backward(g)
    y_ref.backward(g)
    assert torch.allclose(x.grad, ref.grad, atol=2e-6, rtol=0)


def test_large_inputs_take_the_sigmoid_path_and_saturate_exactly():
    x = torch.tensor([-1e4, -30.0, -1e-3, 0.0, 1e-3, 30.0, 1e4]).repeat(SMALL)
    y = Tanh()(x)
    assert y[[0, 1, 3, 5, 6]].tolist() == [-1.0, -1.0, 0.0, 1.0, 1.0]  # no overflow, exact 0
    assert torch.allclose(y, torch.tanh(x), atol=5e-7, rtol=0)
    with torch.no_grad():
        assert torch.allclose(Tanh()(x), torch.tanh(x), atol=5e-7, rtol=0)


def test_float64_and_small_batches_use_torch_tanh_exactly():
    x = torch.randn(SMALL * 2, dtype=torch.float64)
    assert torch.equal(Tanh()(x), torch.tanh(x))
    small = torch.randn(8, 16)
    assert torch.equal(Tanh()(small), torch.tanh(small))


def test_state_dict_is_the_same_as_with_nn_tanh():
    """Checkpoints written before the fast activation load unchanged."""
    model = ActorCritic(105, 8, False, "auto:256:128:64:auto")
    old = ActorCritic(105, 8, False, "auto:256:128:64:auto")
    for net in (old.pi, old.v):
        for i, layer in enumerate(net):
            if isinstance(layer, Tanh):
                net[i] = nn.Tanh()
    assert list(model.state_dict()) == list(old.state_dict())
    model.load_state_dict(old.state_dict(), strict=True)


@pytest.mark.gpu
def test_cuda_tensors_use_torch_tanh():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    x = torch.randn(SMALL * 4, device="cuda")
    assert torch.equal(Tanh()(x), torch.tanh(x))
