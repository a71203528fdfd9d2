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
        if R <= 1:
            return self.coll_latency
        return self.coll_latency + 2.0 * (R - 1) / R * nbytes / self.link_bw

    def t_reduce_scatter(self, in_bytes: float, R: int) -> float:
        if R <= 1:
            return self.coll_latency + self.t_copy(in_bytes)
        return self.coll_latency + (R - 1) / R * in_bytes / self.link_bw


_H200 = CostModel(
    link_bw=450e9,  # NVLink 4 on H200 SXM: 900 GB/s bidirectional = 450 GB/s per direction
    coll_latency=10e-6,
    mem_bw=4.3e12,  # copy bandwidth (read + write) of an H200 as benchmarks/bench.py measures it
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
    elem = dtype.itemsize
    n = max(1, nbytes // (R * elem))
    inp = torch.randn(n, device=device).to(dtype)
    out = torch.empty(n * R, device=device, dtype=dtype)
    tiny = torch.zeros(1, device=device, dtype=dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def ag():
        collectives.all_gather(out, inp, group, async_op=False)

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
