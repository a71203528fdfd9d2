"""The machine numbers the planner prices a strategy with: :class:`CostModel`, the built-in defaults,
:func:`set_cost_model` / :func:`default_cost_model`, and :func:`calibrate`, which measures them
over a process group. The formulas they feed are in docs/distributed.md ("Cost model").
"""

import dataclasses
import os
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from . import collectives


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

    link_bw: bytes/s of the ring (NCCL "bus bandwidth"); coll_latency: s per all_gather or
    reduce_scatter call; mem_bw: bytes/s moved by a copy (read + write); gemm_flops: ((dtype key,
    FLOP/s), ...); gemm_latency: s per GEMM launch; source: where the numbers come from;
    allreduce_latency: s per all_reduce call (None: 2 * coll_latency, a ring all-reduce being a
    reduce-scatter and an all-gather); overlap_cost: the fraction of the communication hidden
    behind compute that is paid anyway (see planner.pipeline_time).
    key: (not a field) an exact string of all the fields, what torch.compile hands the planner;
    models built through ``__init__`` (also by ``replace``, copy, pickle) are registered under it.
    """

    link_bw: float
    coll_latency: float
    mem_bw: float
    gemm_flops: tuple[tuple[str, float], ...]
    gemm_latency: float
    source: str = "defaults"
    allreduce_latency: Optional[float] = None
    overlap_cost: float = 0.0

    def __post_init__(self) -> None:
        # ``key``: an exact, hashable string of every field (repr round-trips floats), registered
        # so that :func:`_decide` can get the model back.  torch.compile hands the model to the
        # planner as this string: the arguments of an ``assume_constant_result`` function must be
        # constants to Dynamo, and torch <= 2.11 can neither convert a frozen dataclass instance
        # ("can't reconstruct arbitrary frozen dataclass instances") nor, with dynamic=True, keep
        # the float fields constant (they become SymFloats); a str is always a constant, and
        # guarding on it recompiles for a different model.  Equal models share a key.
        key = repr(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
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
        s = dtype.itemsize
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
        latency = 2.0 * self.coll_latency if self.allreduce_latency is None else self.allreduce_latency
        if R <= 1:
            return latency
        return latency + 2.0 * (R - 1) / R * nbytes / self.link_bw

    def t_reduce_scatter(self, in_bytes: float, R: int) -> float:
        if R <= 1:
            return self.coll_latency + self.t_copy(in_bytes)
        return self.coll_latency + (R - 1) / R * in_bytes / self.link_bw


_H200 = CostModel(
    # Fitted to bench_distributed on 2 NVLink-connected H200s (benchmarks/results/run34-*: TP2, the
    # anchor and training shapes, forward and fwd+bwd): the link as calibrate() measured it there
    # (266-352 GB/s over four calls), the per-call costs of a collective issued from Python (NCCL's
    # launch and proxy included: a tiny all_gather exposed 80-90 us, an all_reduce 110-140 us), and
    # the share of the hidden communication that slows the GEMM beside it. calibrate() measures
    # all of them on the user's machine.
    link_bw=305e9,
    coll_latency=100e-6,
    mem_bw=4.3e12,  # copy bandwidth (read + write) of an H200 as benchmarks/bench.py measures it
    gemm_flops=(("bf16", 700e12), ("fp16", 700e12), ("tf32", 350e12), ("fp32", 50e12), ("fp64", 55e12)),
    gemm_latency=4e-6,
    source="defaults: 2x H200 NVLink, fitted to bench_distributed TP2 (run 34); calibrate() measures yours",
    allreduce_latency=150e-6,
    overlap_cost=0.3,
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
    """Measure the link bandwidth, the all_gather and all_reduce latencies, how much of a gather
    running beside a GEMM is hidden, the copy bandwidth and the GEMM rate; collective.

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
    elem = dtype.itemsize
    n = max(1, nbytes // (R * elem))
    inp = torch.randn(n, device=device).to(dtype)
    out = torch.empty(n * R, device=device, dtype=dtype)
    tiny = torch.zeros(1, device=device, dtype=dtype)
    tiny_out = torch.empty(R, device=device, dtype=dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def ag():
        collectives.all_gather(out, inp, group, async_op=False)

    m = 4096 if device.type == "cuda" else 384
    a = torch.randn(m, m, device=device).to(dtype)
    b = torch.randn(m, m, device=device).to(dtype)

    def ag_beside_mm():  # the gather on NCCL's stream while the GEMM runs on this one
        work = collectives.all_gather(out, inp, group, async_op=True)
        torch.mm(a, b)
        work.wait()

    dist.barrier(group=group)
    t_ag_tiny = _timed(lambda: (collectives.all_gather(tiny_out, tiny, group, async_op=False), sync()), device, 4 * iters)
    t_ar_tiny = _timed(lambda: (dist.all_reduce(tiny, group=group), sync()), device, 4 * iters)
    t_ag = _timed(lambda: (ag(), sync()), device, iters)
    t_mm = _timed(lambda: torch.mm(a, b), device, iters)  # the GEMM rate
    t_mm_sync = _timed(lambda: (torch.mm(a, b), sync()), device, iters)  # timed as t_ag and t_both are
    t_both = _timed(lambda: (ag_beside_mm(), sync()), device, iters) if R > 1 else 0.0
    big = torch.empty(nbytes // elem, device=device, dtype=dtype)
    big2 = torch.empty_like(big)
    t_cp = _timed(lambda: big2.copy_(big), device, iters)
    t = torch.tensor([t_ag_tiny, t_ar_tiny, t_ag, t_mm, t_mm_sync, t_both, t_cp], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    t_ag_tiny, t_ar_tiny, t_ag, t_mm, t_mm_sync, t_both, t_cp = t.tolist()
    link = ((R - 1) / R * out.numel() * elem / max(t_ag - t_ag_tiny, 1e-9)) if R > 1 else base.link_bw
    # Of the shorter of the two, the part that the overlap did not hide: 0 = perfect, 1 = serial.
    overlap = min(1.0, max(0.0, (t_both - max(t_ag, t_mm_sync)) / min(t_ag, t_mm_sync))) if R > 1 else base.overlap_cost
    cm = base.replace(
        link_bw=link,
        coll_latency=t_ag_tiny,
        allreduce_latency=t_ar_tiny,
        overlap_cost=overlap,
        mem_bw=2.0 * big.numel() * elem / t_cp,
        gemm_flops={_dtype_key(dtype): 2.0 * m**3 / t_mm},
        source=f"calibrated on {device.type} (R={R}, {nbytes >> 20} MiB messages, {m}^3 {dtype} GEMM)",
    )
    if set_default:
        set_cost_model(cm, device.type)
    return cm
