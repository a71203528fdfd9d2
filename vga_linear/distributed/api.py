"""The public entry points: :func:`all_gather_linear`, :func:`last_plan` and :class:`AllGatherLinear`.

They check the arguments, ask the planner for (strategy, chunks) -- at trace time under
torch.compile -- and call the ``vga_dist`` custom op of that strategy.
"""

import math
import operator
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

from . import collectives, ops  # noqa: F401  (ops registers torch.ops.vga_dist.*)
from .collectives import group_info
from .cost_model import CostModel
from .planner import Plan, _canon_strategy, _decide, _plan_from_args

_LAST_PLAN: Optional[Plan] = None


def last_plan() -> Optional[Plan]:
    """The plan of the latest eager :func:`all_gather_linear` call in this process.

    Calls inside torch.compile do not update it (docs/distributed.md, "torch.compile"); their plan is
    :func:`plan_all_gather_linear` of the same arguments.
    """
    return _LAST_PLAN


def all_gather_linear(
    x_local: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    group=None,
    *,
    strategy: str = "auto",
    chunks: Optional[int] = None,
    scatter_output: bool = False,
    grad_mode: str = "replicated",
    weight_sharded: Optional[bool] = None,
    cost_model: Optional[CostModel] = None,
) -> Tensor:
    """``F.linear(torch.cat(all_gather(x_local), -1), weight, bias)`` on every rank of ``group``.

    Args:
        x_local: ``(*batch, H)``, the same shape on every rank (any strides; it is flattened to
            ``(B, H)`` with ``reshape``, which copies only if it must).
        weight: ``(K, R*H)`` full (replicated) weight, or ``(K, H)`` this rank's column block.
        bias: ``(K,)`` or None (replicated).
        group: the tensor-parallel process group (default: WORLD).  Its rank order is the
            concatenation order.
        strategy: ``"auto"`` | ``"gather"`` | ``"row_parallel"``.
        chunks: row blocks for the comm/compute overlap; None = cost model; 1 = no pipelining.
        scatter_output: return only this rank's ``ceil(B/R)`` rows of the flattened batch
            (``row_parallel`` with ``reduce_scatter``); the result has shape ``(rows, K)``, or
            ``(batch[0]/R, *batch[1:], K)`` when ``batch[0]`` is divisible by ``R``.
        grad_mode: ``"replicated"`` or ``"sum"``; see docs/distributed.md, "Autograd".
        weight_sharded: force the interpretation of ``weight`` (default: from its shape).
        cost_model: overrides :func:`default_cost_model` for ``auto``.
    """
    global _LAST_PLAN
    if grad_mode not in ("replicated", "sum"):
        raise ValueError(f"grad_mode must be 'replicated' or 'sum', got {grad_mode!r}")
    group, R, rank, name = group_info(group)
    if x_local.dim() < 1:
        raise ValueError("x_local must have a hidden dim")
    H = x_local.shape[-1]
    batch = tuple(x_local.shape[:-1])
    B = math.prod(batch)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (K, R*H) or (K, H), got {tuple(weight.shape)}")
    K, in_w = weight.shape
    if weight_sharded is None:
        if in_w == R * H:
            weight_sharded = False
        elif in_w == H:
            weight_sharded = True
        else:
            raise ValueError(f"weight {tuple(weight.shape)} fits neither (K, R*H)=({K}, {R * H}) nor (K, H)=({K}, {H})")
    elif in_w != (H if weight_sharded else R * H):
        raise ValueError(f"weight {tuple(weight.shape)} does not match weight_sharded={weight_sharded}, H={H}, R={R}")
    if bias is not None and tuple(bias.shape) != (K,):
        raise ValueError(f"bias must be ({K},), got {tuple(bias.shape)}")
    for t, n in ((weight, "weight"), (bias, "bias")):
        if t is not None and (t.dtype != x_local.dtype or t.device != x_local.device):
            raise ValueError(f"{n} must have x_local's dtype and device ({x_local.dtype}, {x_local.device})")
    grad_on = torch.is_grad_enabled()
    plan_args = (
        R, B, H, K, x_local.dtype, x_local.device.type, strategy, chunks, bool(scatter_output),
        not weight_sharded, grad_on and x_local.requires_grad,
        grad_on and (weight.requires_grad or (bias is not None and bias.requires_grad)),
        grad_mode, cost_model,
    )
    if torch.compiler.is_compiling():
        # The plan depends on the sizes: operator.index specialises a symbolic size (a guard).
        # Rebuilding every argument also turns Dynamo's lazy closure constants into plain ones.
        plan_args = (
            *(operator.index(v) for v in plan_args[:4]), plan_args[4], str(plan_args[5]),
            _canon_strategy(strategy), None if chunks is None else operator.index(chunks),
            *(bool(v) for v in plan_args[8:12]), "sum" if grad_mode == "sum" else "replicated",
            None if cost_model is None else cost_model.key,
        )
        strat, n_chunks = _decide(*plan_args)  # a constant of the trace
    else:
        _LAST_PLAN = _plan_from_args(*plan_args)
        strat, n_chunks = _LAST_PLAN.strategy, _LAST_PLAN.chunks
    x2 = x_local.reshape(B, H)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    sum_mode = grad_mode == "sum"
    if strat == "gather":
        y, _ = torch.ops.vga_dist.ag_linear(x2, weight, bias, name, R, rank, n_chunks, sum_mode)
        return y.view(*batch, K)
    y = torch.ops.vga_dist.rp_linear(
        x2, weight, bias, name, R, rank, n_chunks, bool(scatter_output), not weight_sharded, sum_mode
    )
    if not scatter_output:
        return y.view(*batch, K)
    if len(batch) >= 1 and batch[0] % R == 0:
        return y.view(batch[0] // R, *batch[1:], K)
    return y


class AllGatherLinear(nn.Module):
    """Tensor-parallel :class:`vga_linear.VGALinear`: ``y = Linear(cat(all_gather(x_local), -1))``.

    ``in_features = R * shard_features`` with ``R`` = the group size.  With ``sharded_weight=False``
    ``weight`` is the full nn.Linear weight ``(K, R*H)`` (state_dict interchangeable with
    ``nn.Linear(R*H, K)``), replicated on every rank; with ``sharded_weight=True`` it is this rank's
    column block ``(K, H)`` (state_dict holds the block; :meth:`full_weight` gathers it).  ``bias`` is
    replicated.  Construction initialises like nn.Linear on group rank 0 and broadcasts (a
    collective); :meth:`from_linear` copies an existing (identical on every rank) nn.Linear instead.
    """

    def __init__(
        self,
        shard_features: int,
        out_features: int,
        bias: bool = True,
        group=None,
        *,
        sharded_weight: bool = False,
        strategy: str = "auto",
        chunks: Optional[int] = None,
        scatter_output: bool = False,
        grad_mode: str = "replicated",
        cost_model: Optional[CostModel] = None,
        device=None,
        dtype=None,
        _init: bool = True,
    ):
        super().__init__()
        self.group = group
        _, R, rank, _ = group_info(group)
        self.world_size, self.rank = R, rank
        self.shard_features = shard_features
        self.in_features = R * shard_features
        self.out_features = out_features
        self.sharded_weight = sharded_weight
        self.strategy = _canon_strategy(strategy)
        self.chunks = chunks
        self.scatter_output = scatter_output
        self.grad_mode = grad_mode
        self.cost_model = cost_model
        self.last_plan: Optional[Plan] = None  # of the latest eager forward (compiled ones do not set it)
        fk = {"device": device, "dtype": dtype}
        cols = shard_features if sharded_weight else self.in_features
        self.weight = nn.Parameter(torch.empty(out_features, cols, **fk))
        self.bias = nn.Parameter(torch.empty(out_features, **fk)) if bias else None
        if _init:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nn.Linear's init of the full (K, R*H) weight on group rank 0, broadcast to the group."""
        if self.weight.device.type == "meta":
            return
        full = torch.empty(self.out_features, self.in_features, device=self.weight.device, dtype=self.weight.dtype)
        nn.init.kaiming_uniform_(full, a=math.sqrt(5))
        group, R, rank, _ = group_info(self.group)
        if R > 1:
            dist.broadcast(full, src=dist.get_global_rank(group, 0), group=group)
        H = self.shard_features
        self.weight.copy_(full[:, rank * H : (rank + 1) * H] if self.sharded_weight else full)
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
            nn.init.uniform_(self.bias, -bound, bound)
            if R > 1:
                dist.broadcast(self.bias.data, src=dist.get_global_rank(group, 0), group=group)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, *, sharded_weight: bool = False, **kwargs) -> "AllGatherLinear":
        """Shard an nn.Linear (the same one on every rank) over ``group``'s ranks along in_features."""
        _, R, rank, _ = group_info(group)
        if linear.in_features % R:
            raise ValueError(f"in_features={linear.in_features} is not divisible by the group size {R}")
        H = linear.in_features // R
        w = linear.weight.detach()
        m = cls(
            H, linear.out_features, bias=linear.bias is not None, group=group, sharded_weight=sharded_weight,
            device=w.device, dtype=w.dtype, _init=False, **kwargs,
        )
        with torch.no_grad():
            m.weight.copy_(w[:, rank * H : (rank + 1) * H] if sharded_weight else w)
            if linear.bias is not None:
                m.bias.copy_(linear.bias.detach())
        return m

    @torch.no_grad()
    def full_weight(self) -> Tensor:
        """The full ``(K, R*H)`` weight (all-gathers the blocks when sharded; a collective then)."""
        if not self.sharded_weight:
            return self.weight.detach()
        group, R, _, _ = group_info(self.group)
        K, H = self.weight.shape
        buf = self.weight.new_empty(R * K, H)
        collectives.all_gather(buf, self.weight.detach().contiguous(), group, async_op=False)
        return buf.view(R, K, H).permute(1, 0, 2).reshape(K, R * H)

    def forward(self, x_local: Tensor) -> Tensor:
        y = all_gather_linear(
            x_local, self.weight, self.bias, self.group,
            strategy=self.strategy, chunks=self.chunks, scatter_output=self.scatter_output,
            grad_mode=self.grad_mode, weight_sharded=self.sharded_weight, cost_model=self.cost_model,
        )
        if not torch.compiler.is_compiling():
            self.last_plan = _LAST_PLAN
        return y

    def extra_repr(self) -> str:
        return (
            f"shard_features={self.shard_features}, out_features={self.out_features}, "
            f"world_size={self.world_size}, bias={self.bias is not None}, sharded_weight={self.sharded_weight}, "
            f"strategy={self.strategy}, chunks={self.chunks}, scatter_output={self.scatter_output}, "
            f"grad_mode={self.grad_mode}"
        )
