"""``VGALinear``: the nn.Module front end of the op, interchangeable with nn.Linear."""

import torch
from torch import Tensor, nn

from .ops import gather_concat_linear


class VGALinear(nn.Module):
    """A linear layer over R shards of width H: ``y = cat(x.unbind(0), -1) @ W^T + b``.

    Its parameters, their names, shapes and initialisation are those of
    ``nn.Linear(num_shards * shard_features, out_features)``, so state dicts move
    between the two freely. ``forward`` takes x of shape (R, *batch, H) with one or
    two batch dims (any strides but a contiguous last dim) and returns (*batch, K).
    """

    def __init__(
        self,
        num_shards: int,
        shard_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if num_shards < 1 or shard_features < 1 or out_features < 1:
            raise ValueError(
                "VGALinear: num_shards, shard_features and out_features must be positive, got "
                f"{num_shards}, {shard_features}, {out_features}"
            )
        factory = {"device": device, "dtype": dtype}
        self.num_shards = num_shards
        self.shard_features = shard_features
        self.in_features = num_shards * shard_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, self.in_features, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation (Kaiming-uniform weight, uniform bias in ±1/sqrt(fan_in))."""
        nn.Linear.reset_parameters(self)

    @classmethod
    def from_linear(cls, linear: nn.Linear, num_shards: int) -> "VGALinear":
        """A VGALinear sharing ``linear``'s parameters (no copy), its input split into ``num_shards``."""
        if linear.in_features % num_shards != 0:
            raise ValueError(
                f"VGALinear.from_linear: in_features = {linear.in_features} is not divisible by "
                f"num_shards = {num_shards}"
            )
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.num_shards = num_shards
        module.shard_features = linear.in_features // num_shards
        module.in_features = linear.in_features
        module.out_features = linear.out_features
        module.weight = linear.weight
        module.bias = linear.bias
        return module

    def forward(self, x: Tensor) -> Tensor:
        return gather_concat_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"num_shards={self.num_shards}, shard_features={self.shard_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )
