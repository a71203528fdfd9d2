"""The ``vga_dist::*`` custom ops: each strategy's forward and backward, with fake kernels and autograd.

The process group travels by name, so ``torch.compile(fullgraph=True)`` traces the ops (forward
and backward) without a graph break; the collectives run inside them (docs/distributed.md,
"torch.compile").
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import strategies
from .collectives import resolve_group

_NS = "vga_dist"


@torch.library.custom_op(f"{_NS}::ag_linear", mutates_args=())
def _ag_linear_op(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    group_name: str,
    world: int,
    rank: int,
    chunks: int,
    sum_mode: bool,
) -> Tuple[Tensor, Tensor]:
    return strategies.gather_forward(x, weight, bias, resolve_group(group_name), world, chunks)


@_ag_linear_op.register_fake
def _(x, weight, bias, group_name, world, rank, chunks, sum_mode):
    B, H = x.shape
    return x.new_empty(B, weight.shape[0]), x.new_empty(world * B * H)


@torch.library.custom_op(f"{_NS}::ag_linear_backward", mutates_args=())
def _ag_linear_backward_op(
    grad_y: Tensor,
    gathered: Tensor,
    weight: Tensor,
    group_name: str,
    world: int,
    rank: int,
    chunks: int,
    sum_mode: bool,
    need_x: bool,
    need_w: bool,
) -> Tuple[Tensor, Tensor]:
    return strategies.gather_backward(
        grad_y, gathered, weight, resolve_group(group_name), world, rank, chunks, sum_mode, need_x, need_w
    )


@_ag_linear_backward_op.register_fake
def _(grad_y, gathered, weight, group_name, world, rank, chunks, sum_mode, need_x, need_w):
    B = grad_y.shape[0]
    H = weight.shape[1] // world
    gx = grad_y.new_empty(B, H) if need_x else grad_y.new_empty(0)
    gw = weight.new_empty(weight.shape) if need_w else grad_y.new_empty(0)
    return gx, gw


def _ag_setup(ctx, inputs, output):
    x, weight, bias, group_name, world, rank, chunks, sum_mode = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.args = (group_name, world, rank, chunks, sum_mode)


def _ag_bwd(ctx, grad_y, _grad_gathered):
    gathered, weight = ctx.saved_tensors
    group_name, world, rank, chunks, sum_mode = ctx.args
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    gx = gw = gb = None
    if need_x or need_w:
        gx, gw = torch.ops.vga_dist.ag_linear_backward(
            grad_y.contiguous(), gathered, weight, group_name, world, rank, chunks, sum_mode, need_x, need_w
        )
    if need_b:
        gb = grad_y.sum(0)
    return (gx if need_x else None), (gw if need_w else None), gb, None, None, None, None, None


_ag_linear_op.register_autograd(_ag_bwd, setup_context=_ag_setup)


@torch.library.custom_op(f"{_NS}::rp_linear", mutates_args=())
def _rp_linear_op(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    group_name: str,
    world: int,
    rank: int,
    chunks: int,
    scatter: bool,
    full_weight: bool,
    sum_mode: bool,
) -> Tensor:
    return strategies.row_parallel_forward(
        x, weight, bias, resolve_group(group_name), world, rank, chunks, scatter, full_weight
    )


@_rp_linear_op.register_fake
def _(x, weight, bias, group_name, world, rank, chunks, scatter, full_weight, sum_mode):
    B = x.shape[0]
    rows = strategies.scatter_rows(B, world, rank)[1] if scatter else B
    return x.new_empty(rows, weight.shape[0])


@torch.library.custom_op(f"{_NS}::rp_linear_backward", mutates_args=())
def _rp_linear_backward_op(
    grad_y: Tensor,
    x: Tensor,
    weight: Tensor,
    group_name: str,
    world: int,
    rank: int,
    scatter: bool,
    full_weight: bool,
    sum_mode: bool,
    need_x: bool,
    need_w: bool,
    need_b: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    return strategies.row_parallel_backward(
        grad_y, x, weight, resolve_group(group_name), world, rank, scatter, full_weight, sum_mode,
        need_x, need_w, need_b,
    )


@_rp_linear_backward_op.register_fake
def _(grad_y, x, weight, group_name, world, rank, scatter, full_weight, sum_mode, need_x, need_w, need_b):
    e = grad_y.new_empty(0)
    gx = x.new_empty(x.shape) if need_x else e
    gw = weight.new_empty(weight.shape) if need_w else e
    gb = grad_y.new_empty(weight.shape[0]) if need_b else e
    return gx, gw, gb


def _rp_setup(ctx, inputs, output):
    x, weight, bias, group_name, world, rank, chunks, scatter, full_weight, sum_mode = inputs
    ctx.save_for_backward(x, weight)
    ctx.args = (group_name, world, rank, scatter, full_weight, sum_mode)


def _rp_bwd(ctx, grad_y):
    x, weight = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    gx, gw, gb = torch.ops.vga_dist.rp_linear_backward(
        grad_y.contiguous(), x, weight, *ctx.args, need_x, need_w, need_b
    )
    return (
        (gx if need_x else None),
        (gw if need_w else None),
        (gb if need_b else None),
        None, None, None, None, None, None, None,
    )


_rp_linear_op.register_autograd(_rp_bwd, setup_context=_rp_setup)
