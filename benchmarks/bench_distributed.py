#!/usr/bin/env python
"""Benchmark of vga_linear.distributed.all_gather_linear (tensor-parallel all-gather + linear).

Real run (one process per GPU; NCCL on GPUs, gloo on CPUs):

    torchrun --nproc_per_node 8 benchmarks/bench_distributed.py            # the anchor shapes
    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py --cpu      # tiny shapes, gloo

For each shape (bench.py's anchor shapes, with their total input width IN = R_seed * H_seed
split over the world size R: x_local is (B, IN/R), W is (K, IN)) it times, on the slowest rank
(median of --iters, ranks aligned by a barrier before every call):

  naive       dist.all_gather(list) + torch.cat(-1) + F.linear      (what users write)
  symm_mem    torch.ops.symm_mem.fused_all_gather_matmul(x, [W.T], gather_dim=1)   (CUDA, R>1)
  gather/C    all_gather_linear(strategy="gather", chunks=C)
  row/C       all_gather_linear(strategy="row_parallel", chunks=C)
  auto        all_gather_linear(strategy="auto")

and for each row its compute-only time (the same strategy code handed collectives that move
nothing, NoComm below) and the exposed communication = time - compute-only.  Speedups are naive/row and symm_mem/row.
"sim us" is --simulate's prediction of the row (this GPU's kernel times, the cost model's link), so
the model can be checked against the measurement; each shape ends with the measured-fastest of
ours and auto's time over it.  --suite train runs TRAIN_SHAPES (7B/70B-class TP layers at 4k/16k
tokens); --backward times forward + backward (grad_mode="sum", torch.distributed.nn's autograd
all_gather for naive; symm_mem has no backward).

Simulation (no process group, one GPU or none):

    python benchmarks/bench_distributed.py --simulate [--link-gbps 450] [--latency-us 10]

predicts the overlapped timelines for R in {2, 4, 8} from single-GPU kernel times measured on
this GPU (or, without a GPU or with --no-measure, from the FLOP-rate/roofline model of
vga_linear.distributed.CostModel with its stated TFLOP/s) and a stated link bandwidth.  It is a
MODEL, not a measurement, and says so in its output.
"""

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import harness  # noqa: E402
import metrics as M  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# name, R_seed, B, H_seed, K, dtype  (bench.py's anchor shapes, as measured on the H200)
SHAPES = [
    ("seed", 4, 12, 32, 56, "fp32"),
    ("decode_oproj", 32, 16, 128, 4096, "bf16"),
    ("tp_smallbatch", 8, 64, 1024, 8192, "bf16"),
    ("mid_fp32", 8, 1024, 256, 1024, "fp32"),
    ("prefill_oproj", 32, 4096, 128, 4096, "bf16"),
    ("tp_gather", 8, 8192, 1024, 8192, "bf16"),
]
# Tensor-parallel training layers (IN = R_seed * H_seed split over the world): the attention output
# projection and the MLP down projection of 7B- and 70B-class models, at 4k and 16k tokens.
TRAIN_SHAPES = [
    (f"{name}_{tokens // 1024}k", 1, tokens, IN, K, "bf16")
    for name, IN, K in (("7b_oproj", 4096, 4096), ("7b_down", 11008, 4096),
                        ("70b_oproj", 8192, 8192), ("70b_down", 28672, 8192))
    for tokens in (4096, 16384)
]
CPU_SHAPES = [
    ("cpu_seed", 4, 12, 32, 56, "fp32"),
    ("cpu_wide_in", 6, 256, 64, 64, "fp32"),  # IN = 384: splits over 2, 3, 4, 6, 8 ranks
    ("cpu_wide_out", 6, 512, 32, 512, "fp32"),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


def _vd():
    harness.import_vga_linear()
    import vga_linear.distributed as vd

    return vd


def pipeline_time(comm, comp, comm_first, overlap_cost=0.0):
    from vga_linear.distributed.planner import pipeline_time

    return pipeline_time(comm, comp, comm_first, overlap_cost)


class _Done:
    def wait(self):
        pass


class NoComm:
    """Collectives that move nothing: the strategies' compute alone (the "compute" column)."""

    def all_gather(self, out, inp, group, async_op):
        return _Done()

    def reduce_scatter(self, out, inp, group, async_op):
        return _Done()

    def all_reduce(self, t, group, async_op):
        return _Done()


NO_COMM = NoComm()


# ----------------------------------------------------------------------------------------------
# simulation
# ----------------------------------------------------------------------------------------------


class KernelTimes:
    """Single-device kernel times: measured (CUDA events, median) or from the roofline model."""

    def __init__(self, cm, measure: bool, iters: int = 20, device=None):
        self.cm = cm
        self.dev = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else None)
        self.measure = measure and self.dev is not None
        self.iters = iters
        self.cache = {}
        if self.measure:
            import vga_linear  # noqa: F401  (registers torch.ops.vga)

    @property
    def source(self) -> str:
        if self.measure:
            where = torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda" else "this CPU"
            how = "CUDA events" if self.dev.type == "cuda" else "perf_counter"
            return f"kernel times measured on {where} ({how}, median of {self.iters})"
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in self.cm.gemm_flops)
        return (f"kernel times from the roofline model: max(2MNK/peak, bytes/{self.cm.mem_bw / 1e12:g} TB/s) + "
                f"{self.cm.gemm_latency * 1e6:g} us, peak TFLOP/s: {peaks}")

    def _time(self, key, fn):
        if key not in self.cache:
            for _ in range(3):
                fn()
            ts = []
            for _ in range(self.iters):
                if self.dev.type == "cuda":
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    ts.append(s.elapsed_time(e) * 1e-3)
                else:
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
            self.cache[key] = statistics.median(ts)
        return self.cache[key]

    def op(self, R, M, H, K, dtype):
        """torch.ops.vga.gather_concat_linear on a contiguous (R, M, H) x."""
        if M <= 0:
            return 0.0
        if not self.measure:
            return self.cm.t_gemm(M, K, R * H, dtype)
        x = torch.randn(R, M, H, device=self.dev, dtype=dtype)
        w = torch.randn(K, R * H, device=self.dev, dtype=dtype)
        return self._time(("op", R, M, H, K, dtype), lambda: torch.ops.vga.gather_concat_linear(x, w, None))

    def mm(self, M, N, Kd, dtype, strided_cols=1):
        """(M, Kd) @ (Kd, N) with cuBLAS; strided_cols>1 reads W as a column block of a wider W."""
        if M <= 0:
            return 0.0
        if not self.measure:
            return self.cm.t_gemm(M, N, Kd, dtype)
        a = torch.randn(M, Kd, device=self.dev, dtype=dtype)
        wfull = torch.randn(N, Kd * strided_cols, device=self.dev, dtype=dtype)
        w = wfull[:, :Kd]
        return self._time(("mm", M, N, Kd, dtype, strided_cols), lambda: torch.mm(a, w.t()))

    def addmm(self, M, N, Kd, dtype):
        """out += a @ b (symm_mem's per-shard accumulation)."""
        if not self.measure:
            s = dtype.itemsize
            return self.cm.t_gemm(M, N, Kd, dtype) + M * N * s / self.cm.mem_bw
        a = torch.randn(M, Kd, device=self.dev, dtype=dtype)
        b = torch.randn(Kd, N, device=self.dev, dtype=dtype)
        out = torch.zeros(M, N, device=self.dev, dtype=dtype)
        return self._time(("addmm", M, N, Kd, dtype), lambda: out.addmm_(a, b))

    def copy(self, nbytes):
        if nbytes <= 0:
            return 0.0
        if not self.measure:
            return self.cm.t_copy(nbytes)
        n = int(nbytes)
        a = torch.empty(n, device=self.dev, dtype=torch.uint8)
        b = torch.empty_like(a)
        return self._time(("copy", n), lambda: b.copy_(a))


def simulate_one(kt: KernelTimes, cm, R, B, H, K, dtype, chunks=None):
    """Predicted forward times (s) per strategy for one (R, B, H, K); dict name -> (total, compute)."""
    vd = _vd()
    s = dtype.itemsize
    IN = R * H
    res = {}
    # naive: all_gather(list) (the NCCL list form flattens and copies out) + cat + F.linear
    comm = cm.t_all_gather(R * B * H * s, R)
    comp = 2 * kt.copy(B * IN * s) + kt.mm(B, K, IN, dtype)
    res["naive"] = (comm + comp, comp)
    cands = [c for c in (1, 2, 3, 4, 6, 8, 12, 16) if c <= B] if chunks is None else [chunks]
    best = {}
    for C in cands:
        sizes = [b1 - b0 for b0, b1 in vd.chunk_bounds(B, C)]
        g_comm = [cm.t_all_gather(R * bc * H * s, R) for bc in sizes]
        g_comp = [kt.op(R, bc, H, K, dtype) + (kt.copy(bc * K * s) if len(sizes) > 1 else 0.0) for bc in sizes]
        t = pipeline_time(g_comm, g_comp, True, cm.overlap_cost)
        res[f"gather/{C}"] = (t, sum(g_comp))
        if "gather" not in best or t < res[best["gather"]][0]:
            best["gather"] = f"gather/{C}"
        r_comp = [kt.mm(bc, K, H, dtype, strided_cols=R) for bc in sizes]
        r_comm = [cm.t_all_reduce(bc * K * s, R) for bc in sizes]
        t = pipeline_time(r_comm, r_comp, False, cm.overlap_cost)
        res[f"row/{C}"] = (t, sum(r_comp))
        if "row" not in best or t < res[best["row"]][0]:
            best["row"] = f"row/{C}"
    # symm_mem.fused_all_gather_matmul, gather_dim=-1: R steps; step i pulls shard i over the
    # link (copy engine) while shard i-1 is multiplied and accumulated into the output
    p2p = [0.0] + [cm.coll_latency / 2 + B * H * s / cm.link_bw for _ in range(R - 1)]
    sm_comp = [kt.mm(B, K, H, dtype)] + [kt.addmm(B, K, H, dtype) for _ in range(R - 1)]
    t = cm.coll_latency + pipeline_time(p2p, sm_comp, True, cm.overlap_cost)
    res["symm_mem"] = (t, sum(sm_comp))
    return res, best


def run_simulate(args):
    vd = _vd()
    cm = vd.default_cost_model("cuda")
    if args.link_gbps is not None or args.latency_us is not None:
        link = cm.link_bw if args.link_gbps is None else args.link_gbps * 1e9
        lat = cm.coll_latency if args.latency_us is None else args.latency_us * 1e-6
        cm = cm.replace(link_bw=link, coll_latency=lat, allreduce_latency=None if args.latency_us is not None
                        else cm.allreduce_latency, source=f"{cm.source}; link {link / 1e9:g} GB/s, {lat * 1e6:g} us/collective")
    if args.tflops_bf16:
        cm = cm.replace(gemm_flops={"bf16": args.tflops_bf16 * 1e12, "fp16": args.tflops_bf16 * 1e12})
    kt = KernelTimes(cm, measure=not args.no_measure, iters=args.iters)
    worlds = [int(w) for w in args.world.split(",")]
    print("=" * 118)
    print("MODEL, not a measurement.  Predicted forward timelines of all_gather_linear on R GPUs.")
    ar = cm.t_all_reduce(0, 1)  # the all_reduce latency (measured, or the model's default)
    print(f"  link: {cm.link_bw / 1e9:g} GB/s per direction per GPU (--link-gbps), ring collectives, "
          f"{cm.coll_latency * 1e6:g} us per all_gather (--latency-us), {ar * 1e6:g} us per all_reduce; {cm.source}")
    print(f"  {kt.source}")
    print(f"  overlapped communication still costs {cm.overlap_cost:g} of itself (NCCL beside the GEMM); x_local is (B, IN/R)")
    print("  columns: predicted us; gather/C* and row/C* are the best chunk counts; speedups are naive/best-of-ours and"
          " symm_mem/best-of-ours")
    print("=" * 118)
    hdr = (f"{'shape':<14}{'R,B,H,K':>22}{'dt':>5}{'naive':>9}{'symm_mem':>10}{'gather/1':>10}{'gather/C*':>14}"
           f"{'row/1':>9}{'row/C*':>13}{'auto (planner)':>20}{'xnaive':>8}{'xsymm':>7}")
    print(hdr)
    print("-" * len(hdr))
    rows = []
    for name, r0, B, h0, K, dts in SHAPES:
        IN = r0 * h0
        dtype = DTYPES[dts]
        for R in worlds:
            if IN % R:
                continue
            H = IN // R
            res, best = simulate_one(kt, cm, R, B, H, K, dtype)
            plan = vd.plan_all_gather_linear(R, B, H, K, dtype, cost_model=cm)
            auto_key = f"{'gather' if plan.strategy == 'gather' else 'row'}/{plan.chunks}"
            if auto_key not in res:
                res.update(simulate_one(kt, cm, R, B, H, K, dtype, chunks=plan.chunks)[0])
            ours = min(res[best["gather"]][0], res[best["row"]][0])
            t_auto = res[auto_key][0]
            us = lambda k: res[k][0] * 1e6  # noqa: E731
            bg, br = best["gather"], best["row"]
            cell_g = f"{us(bg):.1f} ({bg.split('/')[1]})"
            cell_r = f"{us(br):.1f} ({br.split('/')[1]})"
            cell_a = f"{auto_key} {t_auto * 1e6:.1f}"
            shape_s = f"{R},{B},{H},{K}"
            print(
                f"{name:<14}{shape_s:>22}{dts:>5}{us('naive'):>9.1f}{us('symm_mem'):>10.1f}"
                f"{us('gather/1'):>10.1f}{cell_g:>14}{us('row/1'):>9.1f}{cell_r:>13}"
                f"{cell_a:>20}{res['naive'][0] / ours:>8.2f}{res['symm_mem'][0] / ours:>7.2f}"
            )
            rows.append({
                "shape": name, "R": R, "B": B, "H": H, "K": K, "dtype": dts,
                "predicted_us": {k: v[0] * 1e6 for k, v in res.items()},
                "compute_us": {k: v[1] * 1e6 for k, v in res.items()},
                "best": best, "auto": auto_key, "auto_us": t_auto * 1e6,
                "speedup_vs_naive": res["naive"][0] / ours, "speedup_vs_symm_mem": res["symm_mem"][0] / ours,
                "auto_regret": t_auto / ours,
            })
    print("-" * len(hdr))
    print("MODEL, not a measurement.")
    print()
    print("Cost-model decisions (vga_linear.distributed.plan_all_gather_linear, same link numbers; "
          "fwd = inference, train = forward + backward with grads for x and W):")
    print(f"{'shape':<14}{'R,B,H,K':>22}{'forward':>16}{'train':>16}   bytes/rank gather vs row (fwd)")
    for name, r0, B, h0, K, dts in SHAPES:
        IN = r0 * h0
        for R in worlds:
            if IN % R:
                continue
            H = IN // R
            pf = vd.plan_all_gather_linear(R, B, H, K, DTYPES[dts], cost_model=cm)
            pt = vd.plan_all_gather_linear(R, B, H, K, DTYPES[dts], cost_model=cm, grad_x=True, grad_w=True)
            by = {e.strategy: e.comm_bytes for e in pf.estimates}
            print(f"{name:<14}{f'{R},{B},{H},{K}':>22}{f'{pf.strategy}/{pf.chunks}':>16}{f'{pt.strategy}/{pt.chunks}':>16}"
                  f"   {by['gather'] / 1e6:.3g} MB vs {by['row_parallel'] / 1e6:.3g} MB")
    harness.write_json(args.json, {
        "mode": "simulate", "model_not_measurement": True, "link_gbps": cm.link_bw / 1e9,
        "latency_us": cm.coll_latency * 1e6, "kernel_source": kt.source, "rows": rows,
        "meta": harness.environment("cuda" if kt.measure else "cpu"),
    })
    return 0


# ----------------------------------------------------------------------------------------------
# real run (torchrun)
# ----------------------------------------------------------------------------------------------


def run_real(args):
    import torch.distributed as dist

    from vga_linear.distributed import strategies

    vd = _vd()
    use_cuda = torch.cuda.is_available() and not args.cpu
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=dev if use_cuda else None)
    group = dist.group.WORLD
    R, rank = dist.get_world_size(), dist.get_rank()
    name_of_group = group.group_name
    cm = vd.default_cost_model(dev.type)
    if args.calibrate:
        cm = vd.calibrate(group, dev)
        if rank == 0:
            print(f"calibrated: link {cm.link_bw / 1e9:.3g} GB/s, {cm.coll_latency * 1e6:.3g} us an all_gather, "
                  f"{cm.t_all_reduce(0, 1) * 1e6:.3g} us an all_reduce, overlap cost {cm.overlap_cost:.3g}, "
                  f"copy {cm.mem_bw / 1e9:.3g} GB/s, GEMM {dict(cm.gemm_flops)}")
    if args.shapes:
        keep = set(args.shapes.split(","))
        shapes = [s for s in SHAPES + TRAIN_SHAPES + CPU_SHAPES if s[0] in keep]
    else:
        shapes = (TRAIN_SHAPES if args.suite == "train" else SHAPES) if use_cuda else CPU_SHAPES
    # the simulation's kernel times on this GPU (rank 0 prints the "sim us" column)
    kt = KernelTimes(cm, measure=True, iters=args.iters, device=dev) if use_cuda and not args.backward else None

    def sync():
        if use_cuda:
            torch.cuda.synchronize(dev)

    def bench(fn):
        for _ in range(args.warmup):
            fn()
        sync()
        ts = []
        for _ in range(args.iters):
            dist.barrier()
            sync()
            if use_cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e) * 1e-3)
            else:
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
        t = torch.tensor([statistics.median(ts)], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    symm = None
    if use_cuda and R > 1 and not args.backward:
        try:
            import torch.distributed._symmetric_memory as symm_mem_mod

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if hasattr(symm_mem_mod, "enable_symm_mem_for_group"):
                    symm_mem_mod.enable_symm_mem_for_group(name_of_group)
            symm = torch.ops.symm_mem.fused_all_gather_matmul
        except Exception as e:  # noqa: BLE001
            symm = None
            if rank == 0:
                print(f"symm_mem unavailable: {type(e).__name__}: {e}")
    results, summary = [], []
    if rank == 0:
        what = "forward + backward" if args.backward else "forward"
        print(f"bench_distributed: world size {R}, backend {backend}, device {dev}, torch {torch.__version__}; "
              f"{what}, median of {args.iters} (slowest rank); exposed comm = time - compute-only; cost model: {cm.source}")
        hdr = (f"{'shape':<14}{'R,B,H,K':>22}{'dt':>5}  {'row':<12}{'us':>10}{'compute':>10}{'exposed':>10}"
               f"{'x naive':>9}{'x symm':>8}{'model us':>10}{'sim us':>9}  check")
        print(hdr)
        print("-" * len(hdr))
    for name, r0, B, h0, K, dts in shapes:
        IN = r0 * h0
        if IN % R:
            if rank == 0:
                print(f"{name}: IN={IN} not divisible by R={R}, skipped")
            continue
        H = IN // R
        dtype = DTYPES[dts]
        g = torch.Generator(device="cpu").manual_seed(1234)
        W = (torch.randn(K, IN, generator=g) / math.sqrt(IN)).to(dev, dtype)
        xs = torch.randn(R, B, H, generator=g).to(dev, dtype)
        x = xs[rank].contiguous()
        parts = [torch.empty_like(x) for _ in range(R)]
        plan_kw = dict(device_type=dev.type, cost_model=cm, grad_x=args.backward, grad_w=args.backward,
                       grad_mode="sum" if args.backward else "replicated")
        plan = vd.plan_all_gather_linear(R, B, H, K, dtype, **plan_kw)
        gy = (torch.randn(B, K, generator=g) / math.sqrt(K)).to(dev, dtype) if args.backward else None
        # the forward is checked here (fwd+bwd too); the gradients are tests/test_distributed.py's
        ref = F.linear(torch.cat(list(xs), -1).float(), W.float())
        if args.backward:
            xg, Wg = x.detach().requires_grad_(), W.detach().requires_grad_()

            from torch.distributed.nn.functional import all_gather as autograd_all_gather

            def naive():
                y = F.linear(torch.cat(autograd_all_gather(xg), -1), Wg)
                torch.autograd.grad(y, (xg, Wg), gy)
                return y

            rows = [("naive", naive, None, None)]
        else:
            def naive():
                dist.all_gather(parts, x)
                return F.linear(torch.cat(parts, -1), W)

            def naive_compute():
                return F.linear(torch.cat(parts, -1), W)

            rows = [("naive", naive, naive_compute, None)]
        if symm is not None:
            wt = W.t()

            def symm_fn():
                # gather_dim must be non-negative here (the CUDA impl rejects -1): dim 1 = hidden
                return symm(x, [wt], x.dim() - 1, name_of_group, return_A=False)[1][0]

            rows.append(("symm_mem", symm_fn, lambda: torch.mm(torch.cat(parts, -1), wt), None))
        row_cs = sorted({1, plan.chunks if plan.strategy == "row_parallel" else 1,
                         vd.plan_all_gather_linear(R, B, H, K, dtype, strategy="row_parallel", **plan_kw).chunks})
        gat_cs = sorted({1, plan.chunks if plan.strategy == "gather" else 1,
                         vd.plan_all_gather_linear(R, B, H, K, dtype, strategy="gather", **plan_kw).chunks})
        for strat, cs in (("gather", gat_cs), ("row_parallel", row_cs)):
            for C in cs:
                if args.backward:
                    def fn(strat=strat, C=C):
                        y = vd.all_gather_linear(xg, Wg, None, group, strategy=strat, chunks=C, grad_mode="sum")
                        torch.autograd.grad(y, (xg, Wg), gy)
                        return y

                    comp = None
                else:
                    def fn(strat=strat, C=C):
                        return vd.all_gather_linear(x, W, None, group, strategy=strat, chunks=C)

                    if strat == "gather":
                        def comp(C=C):
                            return strategies.gather_forward(x, W, None, group, R, C, comm=NO_COMM)[0]
                    else:
                        def comp(C=C):
                            return strategies.row_parallel_forward(x, W, None, group, R, rank, C, False, True,
                                                                   comm=NO_COMM)

                est = vd.plan_all_gather_linear(R, B, H, K, dtype, strategy=strat, chunks=C, **plan_kw)
                model = est.chosen.total_s if args.backward else est.chosen.forward_s
                rows.append((f"{'gather' if strat == 'gather' else 'row'}/{C}", fn, comp, model))
        sim = {}
        if kt is not None and rank == 0:
            for C in sorted(set(gat_cs) | set(row_cs)):
                sim.update(simulate_one(kt, cm, R, B, H, K, dtype, chunks=C)[0])
        times = {}
        for label, fn, comp, model in rows:
            try:
                with torch.enable_grad() if args.backward else torch.no_grad():
                    out = fn()
                    err = (out.detach().float() - ref).abs().max().item() / max(1e-30, ref.abs().max().item())
                    t = bench(fn)
                    tc = bench(comp) if comp is not None else float("nan")
            except Exception as e:  # noqa: BLE001
                if rank == 0:
                    print(f"{name:<14}{label:<12} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            times[label] = t
            sim_us = sim[label][0] * 1e6 if label in sim else None
            results.append({"shape": name, "R": R, "B": B, "H": H, "K": K, "dtype": dts, "row": label,
                            "backward": args.backward, "us": t * 1e6, "compute_us": tc * 1e6,
                            "exposed_us": (t - tc) * 1e6, "model_us": None if model is None else model * 1e6,
                            "sim_us": sim_us, "rel_err": err})
            if rank == 0:
                sp_n = times["naive"] / t if "naive" in times else float("nan")
                sp_s = times["symm_mem"] / t if "symm_mem" in times else float("nan")
                # max error / max |ref|: twice the op's tolerance for the half types, whose
                # row-parallel partial sums are rounded before the reduction
                tol = M.tolerance_for(dts) * (2 if dtype in (torch.bfloat16, torch.float16) else 1)
                print(f"{name:<14}{f'{R},{B},{H},{K}':>22}{dts:>5}  {label:<12}{t * 1e6:>10.1f}{tc * 1e6:>10.1f}"
                      f"{(t - tc) * 1e6:>10.1f}{sp_n:>9.2f}{sp_s:>8.2f}"
                      f"{'' if model is None else f'{model * 1e6:.1f}':>10}"
                      f"{'' if sim_us is None else f'{sim_us:.1f}':>9}  {'ok' if err <= tol else f'ERR {err:.1e}'}")
        # auto is the planner's (strategy, chunks): its time is that row's, measured above
        ours = {k: v for k, v in times.items() if k.startswith(("gather/", "row/"))}
        auto_key = f"{'gather' if plan.strategy == 'gather' else 'row'}/{plan.chunks}"
        if ours and auto_key in ours:
            best = min(ours, key=ours.get)
            entry = {"shape": name, "R": R, "backward": args.backward, "auto": auto_key, "best": best,
                     "auto_over_best": ours[auto_key] / ours[best], "best_us": ours[best] * 1e6,
                     "naive_over_best": times.get("naive", float("nan")) / ours[best],
                     "symm_mem_over_best": times.get("symm_mem", float("nan")) / ours[best]}
            summary.append(entry)
            if rank == 0:
                print(f"{'':<14}auto plan: {auto_key} -- {plan.reason}")
                print(f"{'':<14}measured fastest of ours: {best} {ours[best] * 1e6:.1f} us; auto/fastest "
                      f"{entry['auto_over_best']:.3f}; naive/fastest {entry['naive_over_best']:.2f}; "
                      f"symm_mem/fastest {entry['symm_mem_over_best']:.2f}")
    if rank == 0 and summary:
        hits = sum(e["auto_over_best"] <= 1.05 for e in summary)
        print(f"auto within 5% of the measured fastest of ours on {hits}/{len(summary)} shapes")
    if rank == 0:
        harness.write_json(args.json, {"mode": "measured", "world": R, "backend": backend, "backward": args.backward,
                                       "cost_model": {**dataclasses.asdict(cm), "gemm_flops": dict(cm.gemm_flops)},
                                       "rows": results, "summary": summary, "meta": harness.environment(dev.type)})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--simulate", action="store_true", help="predict the timelines (a model) instead of running")
    ap.add_argument("--link-gbps", type=float, default=None, help="simulate: link GB/s per direction (default: the cost model's)")
    ap.add_argument("--latency-us", type=float, default=None,
                    help="simulate: cost of an all_gather call; an all_reduce then costs twice (default: the cost model's)")
    ap.add_argument("--tflops-bf16", type=float, default=None, help="simulate: bf16/fp16 peak for the roofline model")
    ap.add_argument("--world", default="2,4,8", help="simulate: world sizes")
    ap.add_argument("--no-measure", action="store_true", help="simulate: roofline model even when a GPU is present")
    ap.add_argument("--cpu", action="store_true", help="real run: gloo on CPU even when GPUs are present")
    ap.add_argument("--calibrate", action="store_true", help="real run: measure the cost model first (collective)")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names")
    ap.add_argument("--suite", choices=("anchors", "train"), default="anchors",
                    help="real run: bench.py's anchor shapes or the TP training layers (TRAIN_SHAPES)")
    ap.add_argument("--backward", action="store_true", help="real run: time forward + backward")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the rows as JSON")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.simulate:
        return run_simulate(args)
    return run_real(args)


if __name__ == "__main__":
    sys.exit(main())
