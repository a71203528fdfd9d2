"""What :func:`all_gather_linear` will run: the predicted cost of each strategy at each chunk count
(:class:`Estimate`), and the choice with its reasons (:class:`Plan`, :func:`plan_all_gather_linear`).
Plans are cached by their arguments, the cost model's value included.
"""

import dataclasses
import functools
import math
from typing import Optional, Sequence, Tuple

import torch

from .cost_model import _COST_MODEL_BY_KEY, CostModel, default_cost_model
from .strategies import chunk_bounds

STRATEGIES = ("gather", "row_parallel")
_CHUNK_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


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


def pipeline_time(comm: Sequence[float], comp: Sequence[float], comm_first: bool, overlap_cost: float = 0.0) -> float:
    """Finish time of a two-stage pipeline whose stages each run their items back to back.

    ``overlap_cost``: the fraction of the communication hidden behind compute that is paid anyway
    (NCCL's kernels take SMs and HBM bandwidth from the GEMM running beside them); 0 is a perfect overlap.
    """
    a = b = 0.0
    if comm_first:  # gather c, then compute c
        for g, m in zip(comm, comp):
            a += g
            b = max(b, a) + m
    else:
        for m, g in zip(comp, comm):  # compute c, then reduce c
            a += m
            b = max(b, a) + g
    hidden = sum(comm) + sum(comp) - b
    return b + overlap_cost * hidden


def _estimate_gather(cm, R, B, H, K, dtype, C, need_x, need_w, sum_mode) -> Estimate:
    s = dtype.itemsize
    sizes = [b1 - b0 for b0, b1 in chunk_bounds(B, C)] or [0]
    C = len(sizes)
    comm = [cm.t_all_gather(R * bc * H * s, R) for bc in sizes]
    comp = [cm.t_gemm(bc, K, R * H, dtype) + (cm.t_copy(bc * K * s) if C > 1 else 0.0) for bc in sizes]
    fwd = pipeline_time(comm, comp, comm_first=True, overlap_cost=cm.overlap_cost)
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
    s = dtype.itemsize
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
        fwd = pipeline_time(comm, comp, comm_first=False, overlap_cost=cm.overlap_cost)
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
    if strategy in STRATEGIES:
        return strategy
    raise ValueError(f"strategy must be 'auto', 'gather' or 'row_parallel', got {strategy!r}")
