"""Tensor-parallel ``all_gather`` on the hidden dim fused with the linear, on torch.distributed.

Every rank ``r`` of a process group of size ``R`` holds ``x_local`` of shape ``(*batch, H)``.
:func:`all_gather_linear` returns, on every rank,

    y = F.linear(torch.cat(all_gather(x_local), -1), weight, bias)        # (*batch, K)

with ``weight`` of shape ``(K, R*H)`` (the full, replicated nn.Linear weight) or ``(K, H)``
(this rank's column block ``W[:, r*H:(r+1)*H]``, a sharded weight).

Two strategies
--------------
``"gather"`` (needs the full weight)
    ``all_gather`` the activations, then one ``torch.ops.vga.gather_concat_linear``.
    The collective's output ``(R*B, H)`` *is* the op's input ``(R, B, H)``: no concatenation.
    With ``chunks = C > 1`` the batch rows are split into ``C`` balanced row blocks; block ``c`` is
    gathered (``async_op=True``) into its own contiguous ``(R, Bc, H)`` slab of one flat buffer while
    the op computes block ``c-1`` from the previous slab.  The compute of block ``c`` waits only for
    block ``c``'s work handle (on CUDA: the current stream waits for that NCCL work's event; the NCCL
    stream keeps gathering the next blocks).  Output rows of different blocks are disjoint, each row
    is computed by exactly one full-depth op call, so chunking adds no rounding: the result is
    bit-identical to ``chunks=1`` whenever the op itself is row-batch invariant.  Assembling the
    ``C`` row blocks costs one ``B x K`` copy (the op has no ``out=``); the cost model charges it.

``"row_parallel"``
    Rank ``r`` multiplies its shard by its column block only, ``p_r = x_r @ W_r^T`` (``1/R`` of the
    FLOPs; ``W_r`` is a strided view of a full weight, or the sharded weight itself), and the
    partials are summed with ``all_reduce`` (replicated output) or ``reduce_scatter``
    (``scatter_output=True``: rank ``r`` gets rows ``[r*ceil(B/R), (r+1)*ceil(B/R))`` of the
    flattened batch).  With ``chunks = C > 1`` (all-reduce only) block ``c``'s all-reduce runs while
    block ``c+1`` is multiplied; all blocks live in one ``(B, K)`` buffer, so there is no copy at all.
    The bias is added once, by group rank 0, inside its GEMM.  The partial sums are rounded to the
    input dtype before the reduction (as in Megatron-LM): exact in fp32/fp64 up to summation order,
    about ``R`` ulps in bf16/fp16.

``strategy="auto"`` picks the cheaper one with :class:`CostModel` (see :func:`plan_all_gather_linear`,
:func:`last_plan`, :class:`Plan`); the decision and every estimate are inspectable.

Cost model (what ``auto`` minimises)
------------------------------------
Per rank, with ``s`` = bytes per element, ``bw`` = the link (NCCL bus) bandwidth, ``lat`` = a fixed
cost per collective, ring algorithms::

    all_gather(out_bytes)     lat + (R-1)/R * out_bytes / bw       gather moves (R-1)*B*H*s
    all_reduce(n_bytes)       lat + 2(R-1)/R * n_bytes / bw        row_parallel moves 2(R-1)/R*B*K*s
    reduce_scatter(in_bytes)  lat + (R-1)/R * in_bytes / bw
    gemm(M, N, Kd)            gemm_lat + max(2*M*N*Kd / peak[dtype], (M*Kd + N*Kd + M*N)*s / mem_bw)

So in bytes, ``gather`` is cheaper iff ``R*H < 2*K``; in FLOPs, ``row_parallel`` always does ``1/R``.
Together (latencies aside, the gather fully hidden, the all-reduce fully exposed): ``gather`` wins
iff ``R*H < s * peak / bw`` -- about 3100 input features in bf16 on H200 NVLink, 440 in fp32 -- so
``row_parallel`` takes the wide layers and ``gather`` the narrow ones and slow links.
The forward time of ``C`` chunks is the two-stage pipeline (collectives run back to back on the
communication stream, compute waits for its own chunk)::

    gather:        G_c = G_{c-1} + ag(c);   M_c = max(M_{c-1}, G_c) + gemm(Bc, K, R*H) [+ row copy]
    row_parallel:  M_c = M_{c-1} + gemm(Bc, K, H);  A_c = max(A_{c-1}, M_c) + all_reduce(c)

plus, when a gradient is needed, the backward (GEMMs and the collectives listed under "Autograd").
``chunks=None`` takes the ``C`` in ``{1,2,3,4,6,8,12,16,24,32}`` with the smallest predicted time.
Defaults: H200 SXM (NVLink 4: 450 GB/s per direction, 10 us per collective, 4.3 TB/s copy,
700 TFLOP/s bf16/fp16, 350 tf32, 50 fp32, 55 fp64) for CUDA, a loopback/gloo guess for CPU;
override with :func:`set_cost_model`, the environment (``VGA_DIST_LINK_GBPS``,
``VGA_DIST_LATENCY_US``) or measure them with :func:`calibrate` (collective over the group).
Not modelled: SM contention between NCCL kernels and the GEMM while they overlap, NVLS/tree
algorithms, and multi-node topologies (pass a calibrated model).

Autograd (custom ops with ``register_autograd``; the collectives are inside the ops)
-------------------------------------------------------------------------------
``grad_mode="replicated"`` (default; the tensor-parallel convention of Megatron-LM): the output is
replicated and every rank back-propagates the *same* ``grad_y`` (every rank runs the same
downstream code on the same ``y``); with ``scatter_output=True`` the objective is the sum of the
ranks' losses over their rows.  Every rank then receives the single-process gradients: ``x_local``
gets ``dL/dx_r``, a full weight and the bias get the full ``dL/dW``, ``dL/db`` (no further sync in
the group), a sharded weight gets its column block.  Collectives in the backward:

    gather:        none.  grad_x = grad_y @ W[:, r*H:(r+1)*H] (a slice: 1/R of grad_y @ W),
                   grad_W = vga.gather_concat_linear_grad_weight(grad_y, gathered buffer), read in
                   place (a strided (R, C, Bc, H) view when C divides B, else after one copy)
    row_parallel:  none for a sharded weight; a full weight all-gathers the R column blocks of
                   grad_W (overlapped with the grad_x GEMM); scatter_output all-gathers grad_y

``grad_mode="sum"``: ranks may back-propagate different ``grad_y``; the objective is
``L = sum_q L_q``, and the backward is the exact adjoint of the forward collectives (what autograd
through ``torch.distributed.nn.functional`` would give): gather -> ``reduce_scatter`` of
``grad_y @ W`` laid out ``(R, B, H)`` (overlapped with the grad_W GEMMs); all_reduce ->
``all_reduce`` of ``grad_y``; reduce_scatter -> ``all_gather``.  ``x_local`` and a sharded weight get
their exact gradients; replicated parameters (full weight, bias) get per-replica partial gradients
whose sum over the group is ``dL/dW``, ``dL/db`` -- all-reduce them as DDP would.

Every rank must make the same calls with the same shapes, dtypes and ``requires_grad`` pattern
(SPMD), as with any collective.

torch.compile
-------------
The forward and backward are ``torch.library`` custom ops (``vga_dist::ag_linear``,
``vga_dist::rp_linear`` and their ``*_backward``) taking the group by name, with fake
implementations, so ``torch.compile(fullgraph=True)`` traces ``all_gather_linear`` and
:class:`AllGatherLinear`, forward and backward, without graph breaks (tested with
``backend="aot_eager"`` on gloo, and run once with Inductor on CPU).  The plan (strategy, chunks)
is computed at trace time (``torch.compiler.assume_constant_result``) and baked into the graph,
together with the rank and world size; the sizes it depends on are specialised
(``operator.index``), so a dynamic batch size compiles one graph per batch size, subject to
Dynamo's recompile limit.  Only plain constants cross into the planner: a ``cost_model`` goes as
its :attr:`CostModel.key` string (torch 2.11's Dynamo cannot turn a frozen dataclass into a
constant, and with ``dynamic=True`` makes its float fields symbolic), so equal models share a
graph and a different model recompiles; build the model outside the compiled function.
:func:`last_plan` and :attr:`AllGatherLinear.last_plan` record eager calls only (a compiled call
stores nothing: Dynamo would have to rebuild the Plan after the graph); the plan a compiled call
runs is :func:`plan_all_gather_linear` of the same arguments.  With ``cost_model=None`` the
default model is read at trace time: :func:`set_cost_model` after compiling needs
``torch._dynamo.reset()`` to take effect.  Tested on torch 2.11 and 2.14.
What does not work / is not done: the ops are opaque to Inductor, so its own collective passes
(reordering, ``_micro_pipeline_tp`` async-TP) do not see them -- the overlap is inside the op instead;
CUDA-graph capture (``mode="reduce-overhead"``) of the c10d work handles is untested; torch's
functional collectives are not used (their autograd is always the ``"sum"`` adjoint and cannot
express the cheap ``"replicated"`` backward).
"""

import dataclasses
import functools
import math
import operator
import os
import time
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import Tensor

__all__ = [
    "all_gather_linear",
    "plan_all_gather_linear",
    "last_plan",
    "AllGatherLinear",
    "CostModel",
    "Estimate",
    "Plan",
    "default_cost_model",
    "set_cost_model",
    "calibrate",
    "chunk_bounds",
    "STRATEGIES",
]

STRATEGIES = ("gather", "row_parallel")
_ALIASES = {
    "gather": "gather",
    "all_gather": "gather",
    "allgather": "gather",
    "row_parallel": "row_parallel",
    "row": "row_parallel",
    "reduce": "row_parallel",
}
_CHUNK_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
_NS = "vga_dist"


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """Balanced row blocks ``[(b0, b1), ...]`` of ``range(n)``; sizes differ by at most one."""
    if n <= 0:
        return []
    c = max(1, min(int(chunks), n))
    return [((i * n) // c, ((i + 1) * n) // c) for i in range(c)]


def _slab(buf: Tensor, R: int, H: int, b0: int, b1: int) -> Tensor:
    """The contiguous ``(R, b1-b0, H)`` slab of row block ``[b0, b1)`` inside the flat gather buffer."""
    return buf[R * b0 * H : R * b1 * H].view(R, b1 - b0, H)


def _resolve_group(group_name: str):
    from torch.distributed import distributed_c10d as c10d

    return c10d._resolve_process_group(group_name)


def _all_gather(out: Tensor, inp: Tensor, group, async_op: bool):
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _reduce_scatter(out: Tensor, inp: Tensor, group, async_op: bool):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _all_reduce(t: Tensor, group, async_op: bool):
    return dist.all_reduce(t, group=group, async_op=async_op)


def _gcl(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    return torch.ops.vga.gather_concat_linear(x, weight, bias)


def _mm_bias(a: Tensor, w_rows: Tensor, bias: Optional[Tensor], out: Tensor) -> None:
    """out = a @ w_rows^T (+ bias), written in place (out is a contiguous row block)."""
    if bias is None:
        torch.mm(a, w_rows.t(), out=out)
    else:
        torch.addmm(bias, a, w_rows.t(), out=out)


def _scatter_rows(B: int, R: int, rank: int) -> tuple[int, int]:
    """(rows per rank incl. padding, rows this rank really owns) for scatter_output."""
    bs = -(-B // R) if B > 0 else 0
    own = max(0, min(B, (rank + 1) * bs) - rank * bs)
    return bs, own


# ----------------------------------------------------------------------------------------------
# forward / backward implementations (eager; also used by the benchmark with comm=False)
# ----------------------------------------------------------------------------------------------


def _ag_forward(x, weight, bias, group, R, chunks, *, comm=True):
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
        works.append(_all_gather(out, x[b0:b1], group, async_op=True) if comm else None)
    if len(bounds) <= 1:
        if works and works[0] is not None:
            works[0].wait()
        return _gcl(gathered.view(R, B, H), weight, bias), gathered
    y = x.new_empty(B, K)
    for (b0, b1), work in zip(bounds, works):
        if work is not None:
            work.wait()  # only this chunk's gather; later chunks keep streaming
        y[b0:b1].copy_(_gcl(_slab(gathered, R, H, b0, b1), weight, bias))
    return y, gathered


def _ag_backward(gy, gathered, weight, group, R, rank, chunks, sum_mode, need_x, need_w):
    B, K = gy.shape
    H = weight.shape[1] // R
    gx = gy.new_empty(0)
    gw = gy.new_empty(0)
    work = None
    if need_x:
        if sum_mode:  # adjoint of the gather: reduce_scatter of grad_y @ W laid out (R, B, H)
            G = torch.ops.vga.gather_concat_linear_grad_x(gy, weight, R)
            gx = gy.new_empty(B, H)
            if B > 0:
                work = _reduce_scatter(gx, G.reshape(R * B, H), group, async_op=True)
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


def _rp_forward(x, weight, bias, group, R, rank, chunks, scatter, full_weight, *, comm=True):
    B, H = x.shape
    K = weight.shape[0]
    w_r = weight[:, rank * H : (rank + 1) * H] if full_weight else weight
    b = bias if rank == 0 else None  # the bias enters the sum exactly once
    if scatter:
        bs, own = _scatter_rows(B, R, rank)
        P = x.new_empty(bs * R, K)
        if B > 0:
            _mm_bias(x, w_r, b, P[:B])
        P[B:].zero_()
        y = x.new_empty(bs, K)
        if comm and bs > 0:
            _reduce_scatter(y, P, group, async_op=False)
        return y if own == bs else y[:own].clone()
    P = x.new_empty(B, K)
    works = []
    for b0, b1 in chunk_bounds(B, chunks):
        out = P[b0:b1]
        _mm_bias(x[b0:b1], w_r, b, out)
        if comm:
            works.append(_all_reduce(out, group, async_op=True))
    for work in works:
        work.wait()
    return P


def _rp_backward(gy, x, weight, group, R, rank, scatter, full_weight, sum_mode, need_x, need_w, need_b):
    B, H = x.shape
    K = weight.shape[0]
    if scatter:  # adjoint of reduce_scatter: all_gather grad_y
        bs, own = _scatter_rows(B, R, rank)
        gpad = gy.new_zeros(bs, K)
        gpad[:own] = gy
        G = gy.new_empty(bs * R, K)
        if bs > 0:
            _all_gather(G, gpad, group, async_op=False)
        gp = G[:B]
    elif sum_mode:  # adjoint of all_reduce: all_reduce grad_y
        gp = gy.contiguous().clone()
        if B > 0:
            _all_reduce(gp, group, async_op=False)
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
            work = _all_gather(gw_all, gw_r, group, async_op=True)
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


# ----------------------------------------------------------------------------------------------
# custom ops (compile-traceable; the group travels by name)
# ----------------------------------------------------------------------------------------------


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
    return _ag_forward(x, weight, bias, _resolve_group(group_name), world, chunks)


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
    return _ag_backward(
        grad_y, gathered, weight, _resolve_group(group_name), world, rank, chunks, sum_mode, need_x, need_w
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
    return _rp_forward(x, weight, bias, _resolve_group(group_name), world, rank, chunks, scatter, full_weight)


@_rp_linear_op.register_fake
def _(x, weight, bias, group_name, world, rank, chunks, scatter, full_weight, sum_mode):
    B = x.shape[0]
    rows = _scatter_rows(B, world, rank)[1] if scatter else B
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
    return _rp_backward(
        grad_y, x, weight, _resolve_group(group_name), world, rank, scatter, full_weight, sum_mode,
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


# ----------------------------------------------------------------------------------------------
# cost model
# ----------------------------------------------------------------------------------------------


def _dtype_key(dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.float64:
        return "fp64"
    if dtype == torch.float32:
        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    return "fp32"


_COST_MODEL_BY_KEY: dict[str, "CostModel"] = {}  # CostModel.key -> a model with that key


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Machine numbers the planner uses (all per rank).

    link_bw: bytes/s of the ring (NCCL "bus bandwidth"); coll_latency: s per collective call;
    mem_bw: bytes/s moved by a copy (read + write); gemm_flops: ((dtype key, FLOP/s), ...);
    gemm_latency: s per GEMM launch; source: where the numbers come from.
    key: (not a field) an exact string of all the fields, what torch.compile hands the planner;
    models built through ``__init__`` (also by ``replace``, copy, pickle) are registered under it.
    """

    link_bw: float
    coll_latency: float
    mem_bw: float
    gemm_flops: tuple[tuple[str, float], ...]
    gemm_latency: float
    source: str = "defaults"

    def __post_init__(self) -> None:
        # ``key``: an exact, hashable string of every field (repr round-trips floats), registered
        # so that :func:`_decide` can get the model back.  torch.compile hands the model to the
        # planner as this string: the arguments of an ``assume_constant_result`` function must be
        # constants to Dynamo, and torch <= 2.11 can neither convert a frozen dataclass instance
        # ("can't reconstruct arbitrary frozen dataclass instances") nor, with dynamic=True, keep
        # the float fields constant (they become SymFloats); a str is always a constant, and
        # guarding on it recompiles for a different model.  Equal models share a key.
        key = repr((self.link_bw, self.coll_latency, self.mem_bw, self.gemm_flops, self.gemm_latency, self.source))
        object.__setattr__(self, "key", key)
        _COST_MODEL_BY_KEY.setdefault(key, self)

    def __reduce__(self):
        # pickle / copy through __init__, so that a model received from another rank registers its key
        return (type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))

    def peak(self, dtype: torch.dtype) -> float:
        d = dict(self.gemm_flops)
        return d.get(_dtype_key(dtype), d.get("fp32", 1e12))

    def replace(self, **kw) -> "CostModel":
        if "gemm_flops" in kw and isinstance(kw["gemm_flops"], dict):
            kw["gemm_flops"] = tuple(sorted({**dict(self.gemm_flops), **kw["gemm_flops"]}.items()))
        return dataclasses.replace(self, **kw)

    # primitive times (seconds)
    def t_gemm(self, M: int, N: int, Kd: int, dtype: torch.dtype) -> float:
        if M <= 0 or N <= 0:
            return 0.0
        s = _itemsize(dtype)
        flops = 2.0 * M * N * Kd
        nbytes = (M * Kd + N * Kd + M * N) * s
        return self.gemm_latency + max(flops / self.peak(dtype), nbytes / self.mem_bw)

    def t_copy(self, nbytes: float) -> float:
        return 2.0 * nbytes / self.mem_bw if nbytes > 0 else 0.0

    def t_all_gather(self, out_bytes: float, R: int) -> float:
        if R <= 1:
            return self.coll_latency + self.t_copy(out_bytes)
        return self.coll_latency + (R - 1) / R * out_bytes / self.link_bw

    def t_all_reduce(self, nbytes: float, R: int) -> float:
        if R <= 1:
            return self.coll_latency
        return self.coll_latency + 2.0 * (R - 1) / R * nbytes / self.link_bw

    def t_reduce_scatter(self, in_bytes: float, R: int) -> float:
        if R <= 1:
            return self.coll_latency + self.t_copy(in_bytes)
        return self.coll_latency + (R - 1) / R * in_bytes / self.link_bw


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


_H200 = CostModel(
    link_bw=450e9,  # NVLink 4 on H200 SXM: 900 GB/s bidirectional = 450 GB/s per direction
    coll_latency=10e-6,
    mem_bw=4.3e12,  # measured copy bandwidth (read + write) on the H200, /work/shared/DESIGN.md
    gemm_flops=(("bf16", 700e12), ("fp16", 700e12), ("tf32", 350e12), ("fp32", 50e12), ("fp64", 55e12)),
    gemm_latency=4e-6,
    source="defaults: H200 SXM, NVLink 4 450 GB/s/direction (assumed, not measured)",
)
_CPU = CostModel(
    link_bw=2e9,  # gloo over loopback TCP, order of magnitude
    coll_latency=200e-6,  # an async gloo collective on a busy host costs 0.1-1 ms
    mem_bw=10e9,
    gemm_flops=(("bf16", 10e9), ("fp16", 5e9), ("tf32", 50e9), ("fp32", 50e9), ("fp64", 25e9)),
    gemm_latency=5e-6,
    source="defaults: CPU + gloo (rough guess, not measured)",
)
_COST_MODELS: dict[str, CostModel] = {}


def _env_override(cm: CostModel) -> CostModel:
    kw = {}
    if os.environ.get("VGA_DIST_LINK_GBPS"):
        kw["link_bw"] = float(os.environ["VGA_DIST_LINK_GBPS"]) * 1e9
    if os.environ.get("VGA_DIST_LATENCY_US"):
        kw["coll_latency"] = float(os.environ["VGA_DIST_LATENCY_US"]) * 1e-6
    if kw:
        kw["source"] = cm.source + " + env overrides"
        cm = dataclasses.replace(cm, **kw)
    return cm


def default_cost_model(device_type: str = "cuda") -> CostModel:
    """The model ``auto`` uses for ``device_type`` (set by :func:`set_cost_model` / :func:`calibrate`)."""
    if device_type in _COST_MODELS:
        return _COST_MODELS[device_type]
    return _env_override(_H200 if device_type == "cuda" else _CPU)


def set_cost_model(cm: Optional[CostModel], device_type: str = "cuda") -> None:
    """Install ``cm`` as the default for ``device_type`` (``None`` restores the built-in default)."""
    if cm is None:
        _COST_MODELS.pop(device_type, None)
    else:
        _COST_MODELS[device_type] = cm
    _plan_cached.cache_clear()


def _timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median seconds of ``fn`` on ``device`` (CUDA events or perf_counter)."""
    fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def calibrate(
    group=None,
    device: Optional[torch.device] = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    message_bytes: Optional[int] = None,
    iters: int = 5,
    set_default: bool = True,
) -> CostModel:
    """Measure the link bandwidth, collective latency, copy bandwidth and GEMM rate; collective.

    Every rank of ``group`` must call it.  The slowest rank's numbers are kept (a max-reduce of the
    times), so all ranks end up with the same model and therefore the same plans.
    """
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    R = dist.get_world_size(group)
    base = default_cost_model(device.type)
    if device.type != "cuda" and dtype in (torch.bfloat16, torch.float16):
        dtype = torch.float32
    nbytes = message_bytes or (64 << 20 if device.type == "cuda" else 4 << 20)
    elem = _itemsize(dtype)
    n = max(1, nbytes // (R * elem))
    inp = torch.randn(n, device=device).to(dtype)
    out = torch.empty(n * R, device=device, dtype=dtype)
    tiny = torch.zeros(1, device=device, dtype=dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def ag():
        _all_gather(out, inp, group, async_op=False)

    def ar_tiny():
        dist.all_reduce(tiny, group=group)

    dist.barrier(group=group)
    t_lat = _timed(lambda: (ar_tiny(), sync()), device, iters)
    t_ag = _timed(lambda: (ag(), sync()), device, iters)
    m = 4096 if device.type == "cuda" else 384
    a = torch.randn(m, m, device=device).to(dtype)
    b = torch.randn(m, m, device=device).to(dtype)
    t_mm = _timed(lambda: torch.mm(a, b), device, iters)
    big = torch.empty(nbytes // elem, device=device, dtype=dtype)
    big2 = torch.empty_like(big)
    t_cp = _timed(lambda: big2.copy_(big), device, iters)
    t = torch.tensor([t_lat, t_ag, t_mm, t_cp], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    t_lat, t_ag, t_mm, t_cp = t.tolist()
    link = ((R - 1) / R * out.numel() * elem / max(t_ag - t_lat, 1e-9)) if R > 1 else base.link_bw
    cm = base.replace(
        link_bw=link,
        coll_latency=t_lat,
        mem_bw=2.0 * big.numel() * elem / t_cp,
        gemm_flops={_dtype_key(dtype): 2.0 * m**3 / t_mm},
        source=f"calibrated on {device.type} (R={R}, {nbytes >> 20} MiB messages, {m}^3 {dtype} GEMM)",
    )
    if set_default:
        set_cost_model(cm, device.type)
    return cm


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Predicted cost of one strategy at one chunk count (seconds, bytes and FLOPs per rank)."""

    strategy: str
    chunks: int
    forward_s: float
    backward_s: float
    compute_s: float  # forward compute alone
    exposed_comm_s: float  # forward_s - compute_s
    comm_bytes: float  # forward bytes sent per rank (ring)
    comm_bytes_bwd: float
    flops: float  # forward FLOPs per rank
    feasible: bool = True
    note: str = ""

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``all_gather_linear`` runs and why.  ``str(plan)`` prints the comparison."""

    strategy: str
    chunks: int
    R: int
    B: int
    H: int
    K: int
    dtype: str
    backward: bool
    estimates: tuple[Estimate, ...]
    reason: str
    cost_model: str

    @property
    def chosen(self) -> Estimate:
        for e in self.estimates:
            if e.strategy == self.strategy and e.chunks == self.chunks:
                return e
        raise LookupError(self.strategy)

    def __str__(self) -> str:
        lines = [
            f"all_gather_linear plan: R={self.R} B={self.B} H={self.H} K={self.K} {self.dtype} "
            f"backward={self.backward} -> {self.strategy} chunks={self.chunks}",
            f"  cost model: {self.cost_model}",
            f"  {'strategy':<13}{'chunks':>7}{'fwd us':>10}{'exposed':>10}{'bwd us':>10}{'MB sent':>10}{'GFLOP':>9}",
        ]
        for e in self.estimates:
            if not e.feasible:
                lines.append(f"  {e.strategy:<13}{'-':>7}  infeasible: {e.note}")
                continue
            lines.append(
                f"  {e.strategy:<13}{e.chunks:>7}{e.forward_s * 1e6:>10.1f}{e.exposed_comm_s * 1e6:>10.1f}"
                f"{e.backward_s * 1e6:>10.1f}{(e.comm_bytes + e.comm_bytes_bwd) / 1e6:>10.2f}{e.flops / 1e9:>9.2f}"
            )
        lines.append(f"  reason: {self.reason}")
        return "\n".join(lines)


def _pipeline(comm: Sequence[float], comp: Sequence[float], comm_first: bool) -> float:
    """Finish time of a two-stage pipeline whose stages each run their items back to back."""
    a = b = 0.0
    if comm_first:  # gather c, then compute c
        for g, m in zip(comm, comp):
            a += g
            b = max(b, a) + m
        return b
    for m, g in zip(comp, comm):  # compute c, then reduce c
        a += m
        b = max(b, a) + g
    return b


def _estimate_gather(cm, R, B, H, K, dtype, C, need_x, need_w, sum_mode) -> Estimate:
    s = _itemsize(dtype)
    sizes = [b1 - b0 for b0, b1 in chunk_bounds(B, C)] or [0]
    C = len(sizes)
    comm = [cm.t_all_gather(R * bc * H * s, R) for bc in sizes]
    comp = [cm.t_gemm(bc, K, R * H, dtype) + (cm.t_copy(bc * K * s) if C > 1 else 0.0) for bc in sizes]
    fwd = _pipeline(comm, comp, comm_first=True)
    bwd = 0.0
    bytes_bwd = 0.0
    if need_x or need_w:
        t_gx = t_rs = t_gw = 0.0
        if need_x:
            if sum_mode:
                t_gx = cm.t_gemm(B, R * H, K, dtype)
                t_rs = cm.t_reduce_scatter(R * B * H * s, R)
                bytes_bwd += (R - 1) * B * H * s
            else:
                t_gx = cm.t_gemm(B, H, K, dtype)
        if need_w:
            t_gw = cm.t_gemm(K, R * H, B, dtype) + (cm.t_copy(B * R * H * s) if B % C else 0.0)
        bwd = t_gx + max(t_gw, t_rs)
    return Estimate(
        "gather", C, fwd, bwd, sum(comp), fwd - sum(comp), (R - 1) * B * H * s, bytes_bwd, 2.0 * B * K * R * H
    )


def _estimate_row_parallel(cm, R, B, H, K, dtype, C, need_x, need_w, sum_mode, scatter, full_weight) -> Estimate:
    s = _itemsize(dtype)
    if scatter:
        C = 1
        bs = -(-B // R)
        comp_t = cm.t_gemm(B, K, H, dtype)
        comm_t = cm.t_reduce_scatter(bs * R * K * s, R)
        fwd = comp_t + comm_t
        nbytes = (R - 1) * bs * K * s
    else:
        sizes = [b1 - b0 for b0, b1 in chunk_bounds(B, C)] or [0]
        C = len(sizes)
        comp = [cm.t_gemm(bc, K, H, dtype) for bc in sizes]
        comm = [cm.t_all_reduce(bc * K * s, R) for bc in sizes]
        fwd = _pipeline(comm, comp, comm_first=False)
        comp_t = sum(comp)
        nbytes = 2.0 * (R - 1) / R * B * K * s
    bwd = 0.0
    bytes_bwd = 0.0
    if need_x or need_w:
        pre = 0.0
        if scatter:
            pre = cm.t_all_gather(bs * R * K * s, R)
            bytes_bwd += (R - 1) * bs * K * s
        elif sum_mode:
            pre = cm.t_all_reduce(B * K * s, R)
            bytes_bwd += 2.0 * (R - 1) / R * B * K * s
        t_gx = cm.t_gemm(B, H, K, dtype) if need_x else 0.0
        t_gw = cm.t_gemm(K, H, B, dtype) if need_w else 0.0
        t_agw = 0.0
        if need_w and full_weight and not sum_mode:
            t_agw = cm.t_all_gather(R * K * H * s, R) + cm.t_copy(R * K * H * s)
            bytes_bwd += (R - 1) * K * H * s
        bwd = pre + t_gw + max(t_gx, t_agw)
    return Estimate("row_parallel", C, fwd, bwd, comp_t, fwd - comp_t, nbytes, bytes_bwd, 2.0 * B * K * H)


def _candidates(B: int, chunks: Optional[int]) -> list[int]:
    if chunks is not None:
        return [max(1, min(int(chunks), max(B, 1)))]
    return [c for c in _CHUNK_CANDIDATES if c <= max(B, 1)]


@functools.lru_cache(maxsize=4096)
def _plan_cached(*args) -> Plan:
    return _plan_impl(*args)


def _plan_impl(R, B, H, K, dtype, cm, strategy, chunks, scatter, full_weight, need_x, need_w, sum_mode) -> Plan:
    ests: list[Estimate] = []
    best: dict[str, Estimate] = {}
    if full_weight and not scatter:
        for c in _candidates(B, chunks):
            e = _estimate_gather(cm, R, B, H, K, dtype, c, need_x, need_w, sum_mode)
            ests.append(e)
            if "gather" not in best or e.total_s < best["gather"].total_s:
                best["gather"] = e
    else:
        why = "needs the full weight" if not full_weight else "scatter_output is row_parallel only"
        ests.append(Estimate("gather", 0, math.inf, math.inf, 0, 0, 0, 0, 0, feasible=False, note=why))
    for c in [1] if scatter else _candidates(B, chunks):
        e = _estimate_row_parallel(cm, R, B, H, K, dtype, c, need_x, need_w, sum_mode, scatter, full_weight)
        ests.append(e)
        if "row_parallel" not in best or e.total_s < best["row_parallel"].total_s:
            best["row_parallel"] = e
    if strategy == "auto":
        pick = min(best.values(), key=lambda e: (e.total_s, e.strategy != "gather"))
        others = [e for k, e in best.items() if k != pick.strategy]
        if others:
            o = others[0]
            reason = (
                f"auto: {pick.strategy}(C={pick.chunks}) {pick.total_s * 1e6:.1f} us < "
                f"{o.strategy}(C={o.chunks}) {o.total_s * 1e6:.1f} us predicted; bytes/rank "
                f"{(pick.comm_bytes + pick.comm_bytes_bwd) / 1e6:.3g} MB vs {(o.comm_bytes + o.comm_bytes_bwd) / 1e6:.3g} MB, "
                f"fwd GFLOP/rank {pick.flops / 1e9:.3g} vs {o.flops / 1e9:.3g}"
            )
        else:
            reason = f"auto: {pick.strategy} is the only feasible strategy ({ests[0].note})"
    else:
        if strategy not in best:
            raise ValueError(f"strategy={strategy!r} is not possible here: {ests[0].note}")
        pick = best[strategy]
        reason = f"strategy={strategy!r} requested" + ("" if chunks is not None else f"; chunks={pick.chunks} from the cost model")
    return Plan(
        pick.strategy, pick.chunks, R, B, H, K, str(dtype).replace("torch.", ""), need_x or need_w,
        tuple(ests), reason, cm.source,
    )


def plan_all_gather_linear(
    R: int,
    B: int,
    H: int,
    K: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    device_type: str = "cuda",
    strategy: str = "auto",
    chunks: Optional[int] = None,
    scatter_output: bool = False,
    full_weight: bool = True,
    grad_x: bool = False,
    grad_w: bool = False,
    grad_mode: str = "replicated",
    cost_model: Optional[CostModel] = None,
) -> Plan:
    """The plan :func:`all_gather_linear` would run for these sizes (no process group needed)."""
    strategy = _canon_strategy(strategy)
    cm = cost_model if cost_model is not None else default_cost_model(device_type)
    args = (R, B, H, K, dtype, cm, strategy, chunks, bool(scatter_output), bool(full_weight),
            bool(grad_x), bool(grad_w), grad_mode == "sum")
    return _plan_cached(*args)


def _plan_from_args(R, B, H, K, dtype, device_type, strategy, chunks, scatter, full_weight, gx, gw, grad_mode, cm):
    return plan_all_gather_linear(
        R, B, H, K, dtype, device_type=device_type, strategy=strategy, chunks=chunks, scatter_output=scatter,
        full_weight=full_weight, grad_x=gx, grad_w=gw, grad_mode=grad_mode, cost_model=cm,
    )


@torch.compiler.assume_constant_result
def _decide(*args) -> Tuple[str, int]:
    """(strategy, chunks) for torch.compile: evaluated once at trace time, baked into the graph.

    Every argument is a plain constant (int, bool, str, dtype, None): the cost model arrives as
    its :attr:`CostModel.key` string (or None) and is looked up here, outside the trace.
    """
    *rest, cm_key = args
    cm = None
    if cm_key is not None:
        if cm_key not in _COST_MODEL_BY_KEY:
            raise RuntimeError(f"CostModel with key {cm_key} was not built through CostModel.__init__")
        cm = _COST_MODEL_BY_KEY[cm_key]
    p = _plan_from_args(*rest, cm)
    return p.strategy, p.chunks


def _canon_strategy(strategy: str) -> str:
    if strategy == "auto":
        return strategy
    try:
        return _ALIASES[strategy]
    except KeyError:
        raise ValueError(f"strategy must be 'auto', 'gather' or 'row_parallel', got {strategy!r}") from None


_LAST_PLAN: Optional[Plan] = None


def last_plan() -> Optional[Plan]:
    """The plan of the latest eager :func:`all_gather_linear` call in this process.

    Calls inside torch.compile do not update it (see the module docstring); their plan is
    :func:`plan_all_gather_linear` of the same arguments.
    """
    return _LAST_PLAN


# ----------------------------------------------------------------------------------------------
# public functional API
# ----------------------------------------------------------------------------------------------


def _group_info(group):
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    return group, dist.get_world_size(group), dist.get_rank(group), group.group_name


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
        grad_mode: ``"replicated"`` or ``"sum"``; see the module docstring.
        weight_sharded: force the interpretation of ``weight`` (default: from its shape).
        cost_model: overrides :func:`default_cost_model` for ``auto``.
    """
    global _LAST_PLAN
    if grad_mode not in ("replicated", "sum"):
        raise ValueError(f"grad_mode must be 'replicated' or 'sum', got {grad_mode!r}")
    group, R, rank, name = _group_info(group)
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


# ----------------------------------------------------------------------------------------------
# module
# ----------------------------------------------------------------------------------------------


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
        _, R, rank, _ = _group_info(group)
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
        group, R, rank, _ = _group_info(self.group)
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
        _, R, rank, _ = _group_info(group)
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
        group, R, _, _ = _group_info(self.group)
        K, H = self.weight.shape
        buf = self.weight.new_empty(R * K, H)
        _all_gather(buf, self.weight.detach().contiguous(), group, async_op=False)
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
