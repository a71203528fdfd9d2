"""VGALinear: nn.Linear-compatible parameters, state dicts and initialisation."""

import pytest
import torch
from torch import nn

from conftest import DEVICES
from vga_linear import VGALinear
from vga_linear.reference import gather_concat_linear_reference


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_round_trips_with_linear(device, bias):
    vga = VGALinear(4, 8, 6, bias=bias, device=device)
    linear = nn.Linear(32, 6, bias=bias, device=device)
    assert vga.state_dict().keys() == linear.state_dict().keys()
    linear.load_state_dict(vga.state_dict())
    x = torch.randn(4, 5, 8, device=device)
    torch.testing.assert_close(vga(x), linear(torch.cat(x.unbind(0), -1)))
    vga.load_state_dict(nn.Linear(32, 6, bias=bias, device=device).state_dict())


def test_initialisation_matches_linear():
    torch.manual_seed(0)
    vga = VGALinear(3, 5, 7, dtype=torch.float64)
    torch.manual_seed(0)
    linear = nn.Linear(15, 7, dtype=torch.float64)
    torch.testing.assert_close(vga.weight, linear.weight)
    torch.testing.assert_close(vga.bias, linear.bias)


def test_from_linear_shares_parameters():
    linear = nn.Linear(12, 5)
    vga = VGALinear.from_linear(linear, num_shards=3)
    assert vga.weight is linear.weight and vga.bias is linear.bias
    x = torch.randn(3, 2, 4, 4)
    torch.testing.assert_close(vga(x), gather_concat_linear_reference(x, linear.weight, linear.bias))
    assert "num_shards=3, shard_features=4" in repr(vga)
    with pytest.raises(ValueError, match="not divisible by num_shards"):
        VGALinear.from_linear(linear, num_shards=5)


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="must be positive"):
        VGALinear(0, 4, 4)


def test_trains():
    torch.manual_seed(0)
    module = VGALinear(2, 4, 3)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    x = torch.randn(2, 16, 4)
    target = torch.randn(16, 3)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = (module(x) - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.9
