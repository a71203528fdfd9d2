"""The two strategies, eager: ``gather`` and ``row_parallel``, forward and backward.

Each function works on this rank's flattened ``(B, H)`` input and issues its collectives through
``comm`` (:mod:`.collectives` unless a caller passes a stand-in). docs/distributed.md describes
what each strategy computes, its overlap schedule and its backward.
"""

from typing import Optional

import torch
from torch import Tensor

from . import collectives


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """Balanced row blocks ``[(b0, b1), ...]`` of ``range(n)``; sizes differ by at most one."""
    if n <= 0:
        return []
    c = max(1, min(int(chunks), n))
    return [((i * n) // c, ((i + 1) * n) // c) for i in range(c)]


def scatter_rows(B: int, R: int, rank: int) -> tuple[int, int]:
    """(rows per rank incl. padding, rows this rank really owns) for ``scatter_output``."""
    bs = -(-B // R) if B > 0 else 0
    own = max(0, min(B, (rank + 1) * bs) - rank * bs)
    return bs, own


def gather_concat_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The fused op on one gathered ``(R, Bc, H)`` slab."""
    return torch.ops.vga.gather_concat_linear(x, weight, bias)


def mm_bias(a: Tensor, w_rows: Tensor, bias: Optional[Tensor], out: Tensor) -> None:
    """out = a @ w_rows^T (+ bias), written in place (out is a contiguous row block)."""
    if bias is None:
        torch.mm(a, w_rows.t(), out=out)
    else:
        torch.addmm(bias, a, w_rows.t(), out=out)


def _slab(buf: Tensor, R: int, H: int, b0: int, b1: int) -> Tensor:
    """The contiguous ``(R, b1-b0, H)`` slab of row block ``[b0, b1)`` inside the flat gather buffer."""
    return buf[R * b0 * H : R * b1 * H].view(R, b1 - b0, H)


# ----------------------------------------------------------------------------------------------
# gather: all_gather the activations, then the fused op
# ----------------------------------------------------------------------------------------------


def gather_forward(x, weight, bias, group, R, chunks, *, comm=collectives):
    """Chunked all-gather + gather_concat_linear.  x: (B, H) contiguous.  Returns (y, gathered)."""
    B, H = x.shape
    K = weight.shape[0]
    gathered = x.new_empty(R * B * H)
    if B == 0:  # every rank has B == 0 (the shapes agree), so every rank skips the collective
        return x.new_empty(0, K), gathered
    bounds = chunk_bounds(B, chunks)
    works = []
    for b0, b1 in bounds:  # issue every gather up front: they run back to back on the comm stream
        out = gathered[R * b0 * H : R * b1 * H].view(R * (b1 - b0), H)
        works.append(comm.all_gather(out, x[b0:b1], group, async_op=True))
    if len(bounds) <= 1:
        works[0].wait()
        return gather_concat_linear(gathered.view(R, B, H), weight, bias), gathered
    y = x.new_empty(B, K)
    for (b0, b1), work in zip(bounds, works):
        work.wait()  # only this chunk's gather; later chunks keep streaming
        y[b0:b1].copy_(gather_concat_linear(_slab(gathered, R, H, b0, b1), weight, bias))
    return y, gathered


def gather_backward(gy, gathered, weight, group, R, rank, chunks, sum_mode, need_x, need_w, *, comm=collectives):
    B, K = gy.shape
    H = weight.shape[1] // R
    gx = gy.new_empty(0)
    gw = gy.new_empty(0)
    work = None
    if need_x:
        if sum_mode:  # adjoint of the gather: reduce_scatter of grad_y @ W laid out (R, B, H)
            # Gathered in one slab, the buffer is (R, B, H)-contiguous: given as x, it makes grad_x come
            # back in that layout, which the reduce_scatter reads without the copy the concat's layout needs.
            one_slab = len(chunk_bounds(B, chunks)) == 1
            x_layout = _slab(gathered, R, H, 0, B) if one_slab else None
            G = torch.ops.vga.gather_concat_linear_grad_x(gy, weight, R, x_layout)
            gx = gy.new_empty(B, H)
            if B > 0:
                work = comm.reduce_scatter(gx, G.reshape(R * B, H), group, async_op=True)
        else:  # replicated grad_y: this rank's slice of grad_y @ W, no communication
            gx = torch.mm(gy, weight[:, rank * H : (rank + 1) * H])
    if need_w:
        if B == 0:
            gw = weight.new_zeros(K, R * H)
        else:
            gw = torch.ops.vga.gather_concat_linear_grad_weight(*_gathered_as_x(gy, gathered, R, H, chunks))
    if work is not None:
        work.wait()
    return gx, gw


def _gathered_as_x(gy, gathered, R, H, chunks):
    """(grad_out, x) for gather_concat_linear_grad_weight over the whole batch, reading the gather
    buffer in place: one slab -> (R, B, H); equal slabs -> the strided (R, C, Bc, H) view with
    grad_out (C, Bc, K); unequal slabs -> one (R, B, H) copy (no extra rounding either way)."""
    B, K = gy.shape
    bounds = chunk_bounds(B, chunks)
    C = len(bounds)
    if C <= 1:
        return gy, gathered.view(R, B, H)
    if B % C == 0:
        bc = B // C
        return gy.view(C, bc, K), gathered.view(C, R, bc, H).permute(1, 0, 2, 3)
    x = gathered.new_empty(R, B, H)
    for b0, b1 in bounds:
        x[:, b0:b1].copy_(_slab(gathered, R, H, b0, b1))
    return gy, x


# ----------------------------------------------------------------------------------------------
# row_parallel: each rank multiplies its column block, the partial sums are reduced
# ----------------------------------------------------------------------------------------------


def row_parallel_forward(x, weight, bias, group, R, rank, chunks, scatter, full_weight, *, comm=collectives):
    B, H = x.shape
    K = weight.shape[0]
    w_r = weight[:, rank * H : (rank + 1) * H] if full_weight else weight
    b = bias if rank == 0 else None  # the bias enters the sum exactly once
    if scatter:
        bs, own = scatter_rows(B, R, rank)
        P = x.new_empty(bs * R, K)
        if B > 0:
            mm_bias(x, w_r, b, P[:B])
        P[B:].zero_()
        y = x.new_empty(bs, K)
        if bs > 0:
            comm.reduce_scatter(y, P, group, async_op=False)
        return y if own == bs else y[:own].clone()
    P = x.new_empty(B, K)
    works = []
    for b0, b1 in chunk_bounds(B, chunks):
        out = P[b0:b1]
        mm_bias(x[b0:b1], w_r, b, out)
        works.append(comm.all_reduce(out, group, async_op=True))
    for work in works:
        work.wait()
    return P


def row_parallel_backward(gy, x, weight, group, R, rank, scatter, full_weight, sum_mode, need_x, need_w, need_b,
                          *, comm=collectives):
    B, H = x.shape
    K = weight.shape[0]
    if scatter:  # adjoint of reduce_scatter: all_gather grad_y
        bs, own = scatter_rows(B, R, rank)
        gpad = gy.new_zeros(bs, K)
        gpad[:own] = gy
        G = gy.new_empty(bs * R, K)
        if bs > 0:
            comm.all_gather(G, gpad, group, async_op=False)
        gp = G[:B]
    elif sum_mode:  # adjoint of all_reduce: all_reduce grad_y
        gp = gy.contiguous().clone()
        if B > 0:
            comm.all_reduce(gp, group, async_op=False)
    else:  # replicated grad_y: identity
        gp = gy
    w_r = weight[:, rank * H : (rank + 1) * H] if full_weight else weight
    gx = gy.new_empty(0)
    gw = gy.new_empty(0)
    gb = gy.new_empty(0)
    work = gw_all = None
    if need_w:
        if full_weight and not sum_mode:  # replicated full weight: everyone needs every block
            gw_r = torch.mm(gp.t(), x)
            gw_all = gy.new_empty(R * K, H)
            work = comm.all_gather(gw_all, gw_r, group, async_op=True)
        elif full_weight:  # per-replica partial: only this rank's block is nonzero
            gw = gy.new_zeros(K, R * H)
            torch.mm(gp.t(), x, out=gw[:, rank * H : (rank + 1) * H])
        else:
            gw = torch.mm(gp.t(), x)
    if need_x:
        gx = torch.mm(gp, w_r)
    if need_b:
        gb = (gp if (scatter and not sum_mode) else gy).sum(0)
    if work is not None:
        work.wait()
        gw = gw_all.view(R, K, H).permute(1, 0, 2).reshape(K, R * H)
    return gx, gw, gb
