"""The PyTorch reference: what the fused op computes, written the way a user would.

This is the seed's Model semantics: concatenate the R shards along the hidden dim,
then one ``F.linear``. It materialises the (B, R*H) concatenation, which is exactly
what the CUDA kernels avoid; it is the CPU implementation, the fallback wherever
the kernels can't run, and the baseline of every test and benchmark.
"""

import torch
import torch.nn.functional as F


def concat_shards(x: torch.Tensor) -> torch.Tensor:
    """``torch.cat([x[i] for i in range(R)], -1)``: (R, *batch, H) -> (*batch, R*H), R = 0 included."""
    if x.shape[0] == 0:
        return x.new_empty((*x.shape[1:-1], 0))
    return torch.cat(x.unbind(0), dim=-1)


def gather_concat_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(torch.cat([x[i] for i in range(R)], -1), weight, bias)`` for x of shape (R, *batch, H)."""
    return F.linear(concat_shards(x), weight, bias)


def gather_concat_linear_float64(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference computed in float64 on the inputs' device: the yardstick for accuracy."""
    return gather_concat_linear_reference(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
