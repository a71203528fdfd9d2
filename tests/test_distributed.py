"""vga_linear.distributed: real all-gather + linear on torch.distributed.

The multi-process tests spawn their own ranks: this file re-runs itself as a worker
(``python tests/test_distributed.py --worker ...``) once per rank, rendezvous through a
FileStore in a temporary directory (no ports), gloo on CPU (NCCL for the CUDA test), and
every run is bounded by a deadline after which the workers are killed.  Each worker
checks every strategy / chunking / grad mode against the single-process reference
(float64 autograd of ``F.linear(torch.cat(xs, -1), W, b)``) and reports its failures as
JSON; the collectives are issued identically on every rank whether a check passes or not,
so a wrong value never desynchronises the group.
"""

import faulthandler
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = float(os.environ.get("VGA_DIST_TEST_DEADLINE_S", "150"))


# ----------------------------------------------------------------------------------------------
# launcher
# ----------------------------------------------------------------------------------------------


def _launch(world: int, suite: str, backend: str = "gloo", device: str = "cpu", deadline: float = DEADLINE_S):
    """Run ``suite`` on ``world`` worker processes; return their JSON reports (rank order)."""
    with tempfile.TemporaryDirectory(prefix="vga_dist_") as tmp:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.setdefault("OMP_NUM_THREADS", "1")
        if backend == "nccl":  # NVLink multicast stays off on shared hosts (NCCL, torch, NVSHMEM)
            env.setdefault("NCCL_NVLS_ENABLE", "0")
            env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
            env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
        if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in env and os.path.exists("/sys/class/net/lo"):
            env["GLOO_SOCKET_IFNAME"] = "lo"
        procs = []
        for rank in range(world):
            out = open(os.path.join(tmp, f"log{rank}.txt"), "w")
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, __file__, "--worker", suite, str(world), str(rank), tmp, backend, device,
                         str(deadline)],
                        cwd=str(REPO), env=env, stdout=out, stderr=subprocess.STDOUT,
                    ),
                    out,
                )
            )
        end = time.monotonic() + deadline
        timed_out = False
        for p, _ in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        unkillable = []
        if timed_out:
            for rank, (p, _) in enumerate(procs):
                if p.poll() is None:
                    p.kill()
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:  # stuck in the driver: report it, don't hang the suite
                        unkillable.append(rank)
        for _, out in procs:
            out.close()
        logs = [Path(tmp, f"log{r}.txt").read_text()[-4000:] for r in range(world)]
        if timed_out:
            stuck = f" (ranks {unkillable} survived SIGKILL)" if unkillable else ""
            pytest.fail(f"{suite} at world size {world} passed the {deadline:.0f} s deadline{stuck}; logs (each rank's "
                        "stacks were dumped 10 s before it):\n" + "\n".join(logs))
        reports = []
        for rank, (p, _) in enumerate(procs):
            path = Path(tmp, f"report{rank}.json")
            if p.returncode != 0 or not path.exists():
                pytest.fail(f"rank {rank} exited with {p.returncode}; logs:\n" + "\n".join(logs))
            reports.append(json.loads(path.read_text()))
        return reports


def _assert_clean(reports, min_checks):
    failures = [f for r in reports for f in r["failures"]]
    assert not failures, f"{len(failures)} failed checks, first ones:\n" + "\n".join(failures[:25])
    assert all(r["checks"] >= min_checks for r in reports), [r["checks"] for r in reports]


# ----------------------------------------------------------------------------------------------
# multi-process tests
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_gloo_matches_reference(world):
    _assert_clean(_launch(world, "core"), min_checks=500)


def test_gloo_module_and_compile():
    _assert_clean(_launch(2, "module"), min_checks=20)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_world_size_1():
    _assert_clean(_launch(1, "core", backend="nccl", device="cuda"), min_checks=500)
    _assert_clean(_launch(1, "module", backend="nccl", device="cuda"), min_checks=20)
    _assert_clean(_launch(1, "cuda_big", backend="nccl", device="cuda"), min_checks=20)


@pytest.mark.cuda
@pytest.mark.parametrize("world", [2, 4, 8])
def test_nccl_multi_gpu(world):
    """One process per GPU on real NCCL: every strategy, chunking and grad mode, forward and
    backward, against the float64 single-process reference, at each world size the machine has."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, this machine has {torch.cuda.device_count()}")
    _assert_clean(_launch(world, "core", backend="nccl", device="cuda"), min_checks=500)
    _assert_clean(_launch(world, "module", backend="nccl", device="cuda"), min_checks=20)
    _assert_clean(_launch(world, "cuda_big", backend="nccl", device="cuda"), min_checks=20)


# ----------------------------------------------------------------------------------------------
# single-process tests (no process group)
# ----------------------------------------------------------------------------------------------


def test_chunk_bounds():
    from vga_linear.distributed import chunk_bounds

    for n in range(0, 40):
        for c in range(1, 12):
            b = chunk_bounds(n, c)
            if n == 0:
                assert b == []
                continue
            assert b[0][0] == 0 and b[-1][1] == n and len(b) == min(c, n)
            assert all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1))
            sizes = [e - s for s, e in b]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


class _FakeWork:
    def __init__(self, log, tag):
        self.log, self.tag = log, tag

    def wait(self):
        self.log.append(("wait", self.tag))


class _FakeComm:
    """Stand-in collectives (vga_linear.distributed.collectives' three functions) that log the schedule."""

    def __init__(self, log, R=1):
        self.log, self.R = log, R

    def all_gather(self, out, inp, group, async_op):
        R = self.R
        out.view(R, *inp.shape).copy_(inp.expand(R, *inp.shape) * torch.arange(1, R + 1).view(R, 1, 1))
        self.log.append(("issue", len([e for e in self.log if e[0] == "issue"])))
        return _FakeWork(self.log, self.log[-1][1])

    def all_reduce(self, t, group, async_op):
        self.log.append(("reduce", t.shape[0]))
        return _FakeWork(self.log, t.shape[0])

    def reduce_scatter(self, out, inp, group, async_op):
        out.copy_(inp.view(self.R, *out.shape).sum(0))  # every "rank" holds this process's input
        self.log.append(("reduce_scatter", out.shape[0]))
        return _FakeWork(self.log, out.shape[0])


def test_gather_overlap_schedule(monkeypatch):
    """All chunk gathers are issued up front; chunk c's compute waits for chunk c only, and reads
    its (R, Bc, H) slab of the gather buffer in place (no copy)."""
    from vga_linear.distributed import strategies

    R, B, H, K, C = 3, 11, 4, 5, 4
    log, seen = [], []
    real = strategies.gather_concat_linear

    def fake_gather_concat_linear(x, w, b):
        log.append(("compute", None))
        seen.append(x)
        return real(x, w, b)

    monkeypatch.setattr(strategies, "gather_concat_linear", fake_gather_concat_linear)
    x = torch.randn(B, H, dtype=torch.float64)
    w = torch.randn(K, R * H, dtype=torch.float64)
    b = torch.randn(K, dtype=torch.float64)
    y, gathered = strategies.gather_forward(x, w, b, None, R, C, comm=_FakeComm(log, R))
    n = len(strategies.chunk_bounds(B, C))
    assert [e[0] for e in log[:n]] == ["issue"] * n
    rest = log[n:]
    assert rest == sum(([("wait", c), ("compute", None)] for c in range(n)), [])
    base, end = gathered.data_ptr(), gathered.data_ptr() + gathered.numel() * gathered.element_size()
    assert all(base <= s.data_ptr() < end and s.is_contiguous() for s in seen)
    xs = torch.stack([x * (r + 1) for r in range(R)])
    torch.testing.assert_close(y, F.linear(torch.cat(list(xs), -1), w, b))


@pytest.mark.parametrize("sum_mode", [False, True])
def test_gather_backward_runs_the_ops_products(sum_mode):
    """The all-gather strategy's backward computes grad_weight (and, where grad_y is summed, grad_x)
    with the op's own products on the gathered shards; its replicated grad_x is one shard's plain
    GEMM (no concatenation)."""
    from torch.profiler import ProfilerActivity, profile

    from vga_linear.distributed import strategies

    R, B, H, K, C = 3, 11, 4, 5, 2
    x = torch.randn(B, H, dtype=torch.float64)
    w = torch.randn(K, R * H, dtype=torch.float64)
    log = []
    _, gathered = strategies.gather_forward(x, w, None, None, R, C, comm=_FakeComm(log, R))
    gy = torch.randn(B, K, dtype=torch.float64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        gx, gw = strategies.gather_backward(gy, gathered, w, None, R, 0, C, sum_mode, True, True,
                                            comm=_FakeComm(log, R))
    ops = {event.key for event in prof.key_averages()}
    assert "vga::gather_concat_linear_grad_weight" in ops
    assert ("vga::gather_concat_linear_grad_x" in ops) == sum_mode
    xs = torch.cat([x * (r + 1) for r in range(R)], -1)  # what _FakeComm's all_gather gathers
    torch.testing.assert_close(gw, gy.t() @ xs)
    full_gx = (gy @ w).view(B, R, H)
    torch.testing.assert_close(gx, full_gx.sum(1) if sum_mode else full_gx[:, 0])


def test_row_parallel_overlap_schedule(monkeypatch):
    """Row-parallel: chunk c's all-reduce is issued right after its GEMM, before chunk c+1's
    GEMM, and nothing waits until every chunk is issued."""
    from vga_linear.distributed import strategies

    log = []
    real_mm = strategies.mm_bias

    def fake_mm(a, w, b, out):
        log.append(("mm", a.shape[0]))
        return real_mm(a, w, b, out)

    monkeypatch.setattr(strategies, "mm_bias", fake_mm)
    x = torch.randn(10, 4)
    w = torch.randn(6, 8)
    strategies.row_parallel_forward(x, w, None, None, 2, 1, 3, False, True, comm=_FakeComm(log))
    sizes = [e - s for s, e in strategies.chunk_bounds(10, 3)]
    expect = sum(([("mm", s), ("reduce", s)] for s in sizes), []) + [("wait", s) for s in sizes]
    assert log == expect


def test_cost_model_decisions():
    import vga_linear.distributed as vd

    cm = vd.default_cost_model("cuda")
    bf = torch.bfloat16
    # wide input, narrow output: all-reducing (B, K) partials is cheaper than gathering (B, R*H)
    p = vd.plan_all_gather_linear(8, 8192, 1024, 1024, bf, cost_model=cm)
    assert p.strategy == "row_parallel", str(p)
    # narrow input, wide output: the gather moves 1/16 of the bytes and wins despite R x the FLOPs
    p = vd.plan_all_gather_linear(2, 8192, 512, 16384, bf, cost_model=cm)
    assert p.strategy == "gather", str(p)
    # a slow (PCIe-like) link: gathering dominates, and pipelining it pays for the row-block copy
    p = vd.plan_all_gather_linear(4, 8192, 1024, 4096, bf, cost_model=cm.replace(link_bw=25e9))
    assert p.strategy == "gather" and p.chunks > 1 and p.chosen.exposed_comm_s < p.chosen.forward_s, str(p)
    # sharded weights and scattered outputs only run row-parallel
    p = vd.plan_all_gather_linear(4, 4096, 1024, 8192, bf, full_weight=False, cost_model=cm)
    assert p.strategy == "row_parallel" and "only feasible" in p.reason
    p = vd.plan_all_gather_linear(4, 4096, 1024, 8192, bf, scatter_output=True, cost_model=cm)
    assert p.strategy == "row_parallel" and p.chunks == 1
    # explicit strategy / chunks are honoured; tiny batches are not chunked
    p = vd.plan_all_gather_linear(4, 4096, 1024, 1024, bf, strategy="gather", chunks=3, cost_model=cm)
    assert (p.strategy, p.chunks) == ("gather", 3)
    assert vd.plan_all_gather_linear(4, 8, 1024, 8192, bf, cost_model=cm).chunks == 1
    with pytest.raises(ValueError):
        vd.plan_all_gather_linear(4, 64, 64, 64, bf, strategy="gather", full_weight=False, cost_model=cm)
    slow = cm.replace(link_bw=1e9)
    fast = cm.replace(link_bw=1e15, coll_latency=1e-6, allreduce_latency=1e-6)  # a free link: comm all but vanishes
    shape = (4, 2048, 1024, 4096)
    assert vd.plan_all_gather_linear(*shape, bf, cost_model=fast).chosen.exposed_comm_s < 1e-4
    assert vd.plan_all_gather_linear(*shape, bf, cost_model=slow).chosen.forward_s > 1e-3
    text = str(vd.plan_all_gather_linear(*shape, bf, cost_model=cm))
    assert "reason" in text and "row_parallel" in text and "gather" in text
    # the pipeline never predicts worse than its slowest stage nor better than the sum when C=1
    for e in vd.plan_all_gather_linear(*shape, bf, cost_model=cm).estimates:
        assert e.forward_s >= e.compute_s - 1e-12


def test_cost_model_collective_terms():
    """An all_reduce pays its own latency (two ring phases' worth unless measured); the part of the
    communication hidden behind compute costs overlap_cost of itself; one chunk hides nothing."""
    import vga_linear.distributed as vd
    from vga_linear.distributed.planner import pipeline_time

    cm = vd.default_cost_model("cuda").replace(coll_latency=10e-6, allreduce_latency=None)
    assert cm.t_all_reduce(0, 4) == pytest.approx(20e-6) and cm.t_all_gather(0, 4) == pytest.approx(10e-6)
    assert cm.replace(allreduce_latency=13e-6).t_all_reduce(0, 4) == pytest.approx(13e-6)
    comm, comp = [3.0, 3.0], [5.0, 5.0]
    perfect = pipeline_time(comm, comp, comm_first=True)
    assert perfect == 13.0  # gather 0, then compute 0 while gathering 1, then compute 1
    hidden = sum(comm) + sum(comp) - perfect
    assert pipeline_time(comm, comp, True, overlap_cost=0.5) == pytest.approx(perfect + 0.5 * hidden)
    assert pipeline_time([3.0], [5.0], False, overlap_cost=0.9) == 8.0


def test_cost_model_key():
    """CostModel.key (what torch.compile's planner receives) survives replace, copy and pickling."""
    import copy
    import pickle

    import vga_linear.distributed as vd
    from vga_linear.distributed.cost_model import _COST_MODEL_BY_KEY

    cm = vd.default_cost_model("cuda").replace(link_bw=123e9, gemm_flops={"bf16": 1e15})
    for other in (pickle.loads(pickle.dumps(cm)), copy.deepcopy(cm), copy.copy(cm), cm.replace()):
        assert other == cm and other.key == cm.key and isinstance(other.key, str)
        assert _COST_MODEL_BY_KEY[other.key] == cm
    assert cm.replace(link_bw=124e9).key != cm.key


def test_simulate_runs():
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_distributed.py"), "--simulate", "--no-measure"],
        cwd=str(REPO), capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MODEL, not a measurement" in r.stdout
    assert "8,8192,1024,8192" in r.stdout.replace(" ", "")


# ----------------------------------------------------------------------------------------------
# worker side
# ----------------------------------------------------------------------------------------------


class _Checker:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.checks = 0

    def close(self, name, got, want, rtol, atol):
        self.checks += 1
        try:
            if got.shape != want.shape:
                raise AssertionError(f"shape {tuple(got.shape)} != {tuple(want.shape)}")
            torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=rtol, atol=atol)
        except AssertionError as e:
            self.failures.append(f"rank {self.rank}: {name}: {str(e)[:400]}")

    def rel(self, name, got, want, tol):
        """Norm-wise relative error (for half-precision gradients, whose sums over B round)."""
        self.checks += 1
        got, want = got.double().cpu(), want.double().cpu()
        err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item() if got.shape == want.shape else math.inf
        if not err <= tol:
            self.failures.append(f"rank {self.rank}: {name}: relative error {err:.3g} > {tol}")

    def true(self, name, cond):
        self.checks += 1
        if not cond:
            self.failures.append(f"rank {self.rank}: {name}")


def _tol(dtype):
    return {
        torch.float64: (1e-9, 1e-9),
        torch.float32: (1e-4, 1e-4),
        torch.bfloat16: (3e-2, 3e-2),
        torch.float16: (1e-2, 1e-2),
    }[dtype]


def _case(ck, vd, dist, dev, R, rank, seed, batch, H, K, dtype, strategy, chunks, sharded, scatter,
          grad_mode, bias, need_x=True, need_w=True, noncontig=False):
    """One forward + backward on every rank against the float64 single-process reference."""
    name = (f"R={R} batch={batch} H={H} K={K} {dtype} {strategy} chunks={chunks} sharded={sharded} "
            f"scatter={scatter} grad={grad_mode} bias={bias} need_x={need_x} need_w={need_w} nc={noncontig}")
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    xs = torch.randn(R, *batch, H, generator=g, dtype=f64)
    W = torch.randn(K, R * H, generator=g, dtype=f64) / math.sqrt(R * H)
    b = torch.randn(K, generator=g, dtype=f64) if bias else None
    ups = torch.randn(R, *batch, K, generator=g, dtype=f64)
    B = math.prod(batch)
    # reference
    rx = xs.clone().requires_grad_()
    rW = W.clone().requires_grad_()
    rb = b.clone().requires_grad_() if bias else None
    yr = F.linear(torch.cat(list(rx), -1), rW, rb)
    if grad_mode == "sum" and not scatter:
        Lr = sum((yr * ups[q]).sum() for q in range(R))
    else:
        Lr = (yr * ups[0]).sum()
    Lr.backward()
    # distributed
    if noncontig:  # a transposed view: the wrapper must flatten it (reshape copies) correctly
        x = xs[rank].transpose(0, 1).contiguous().to(dev, dtype).transpose(0, 1)
    else:
        x = xs[rank].to(dev, dtype)
    x = x.detach().requires_grad_(need_x)
    w_src = W[:, rank * H : (rank + 1) * H] if sharded else W
    w = w_src.to(dev, dtype).contiguous().requires_grad_(need_w)
    bb = b.to(dev, dtype).requires_grad_(need_w) if bias else None
    y = vd.all_gather_linear(
        x, w, bb, strategy=strategy, chunks=chunks, scatter_output=scatter, grad_mode=grad_mode
    )
    rt, at = _tol(dtype)
    if scatter:
        bs = -(-B // R)
        lo, hi = min(B, rank * bs), min(B, (rank + 1) * bs)
        want = yr.detach().reshape(B, K)[lo:hi]
        ck.close(name + " y", y.reshape(-1, K), want, rt, at)
        if batch[0] % R == 0:
            ck.true(name + " scattered shape", tuple(y.shape) == (batch[0] // R, *batch[1:], K))
        up = ups[0].reshape(B, K)[lo:hi].to(dev, dtype)
        loss = (y.reshape(-1, K) * up).sum()
    else:
        ck.close(name + " y", y, yr.detach(), rt, at)
        ck.true(name + " contiguous", y.is_contiguous())
        up = ups[rank if grad_mode == "sum" else 0].to(dev, dtype)
        loss = (y * up).sum()
    if not (need_x or need_w):
        return
    loss.backward()
    if dtype in (torch.bfloat16, torch.float16):
        if grad_mode == "replicated":  # norm-wise: the half-precision reductions over B round
            ck.rel(name + " grad_x", x.grad, rx.grad[rank], 2e-2)
            want_w = rW.grad[:, rank * H : (rank + 1) * H] if sharded else rW.grad
            ck.rel(name + " grad_w", w.grad, want_w, 2e-2)
        return
    if need_x:
        ck.close(name + " grad_x", x.grad, rx.grad[rank], rt, at)
    if need_w:
        gw = w.grad.clone()
        gb = bb.grad.clone() if bias else None
        replica = grad_mode == "sum" and not sharded
        if replica:  # per-replica partials: their group sum is the gradient
            dist.all_reduce(gw)
        want_w = rW.grad[:, rank * H : (rank + 1) * H] if sharded else rW.grad
        ck.close(name + " grad_w", gw, want_w, rt, at)
        if bias:
            if grad_mode == "sum":
                dist.all_reduce(gb)
            ck.close(name + " grad_b", gb, rb.grad, rt, at)


def _suite_core(ck, vd, dist, dev, R, rank):
    shapes = [((7,), 5, 6), ((2, 3), 4, 9), ((1,), 3, 2), ((13,), 8, 16)]
    configs = [
        ("gather", 1, False, False), ("gather", 2, False, False), ("gather", 3, False, False),
        ("gather", 5, False, False), ("gather", None, False, False),
        ("row_parallel", 1, False, False), ("row_parallel", 3, False, False),
        ("row_parallel", 1, True, False), ("row_parallel", 2, True, False),
        ("row_parallel", 1, False, True), ("row_parallel", 1, True, True),
        ("auto", None, False, False), ("auto", None, True, False), ("auto", None, False, True),
    ]
    seed = 0
    for batch, H, K in shapes:
        for bias in (True, False):
            for grad_mode in ("replicated", "sum") if bias else ("replicated",):
                for strategy, chunks, sharded, scatter in configs:
                    seed += 1
                    _case(ck, vd, dist, dev, R, rank, seed, batch, H, K, torch.float64,
                          strategy, chunks, sharded, scatter, grad_mode, bias)
    # partial requires_grad, no grad at all, non-contiguous input, fp32 and bf16
    for strategy, sharded in (("gather", False), ("row_parallel", False), ("row_parallel", True)):
        for need_x, need_w in ((True, False), (False, True), (False, False)):
            for grad_mode in ("replicated", "sum"):
                seed += 1
                _case(ck, vd, dist, dev, R, rank, seed, (6,), 4, 5, torch.float64, strategy, 2,
                      sharded, False, grad_mode, True, need_x=need_x, need_w=need_w)
        seed += 1
        _case(ck, vd, dist, dev, R, rank, seed, (3, 4), 4, 5, torch.float64, strategy, 2,
              sharded, False, "replicated", True, noncontig=True)
    for strategy, chunks, sharded, scatter in configs:  # an empty batch
        seed += 1
        _case(ck, vd, dist, dev, R, rank, seed, (0,), 4, 5, torch.float64, strategy, chunks, sharded,
              scatter, "sum" if seed % 2 else "replicated", True)
    for dtype in (torch.float32, torch.bfloat16):
        for strategy, chunks, sharded, scatter in configs:
            seed += 1
            _case(ck, vd, dist, dev, R, rank, seed, (9,), 8, 12, dtype, strategy, chunks, sharded,
                  scatter, "replicated", True)
    # the plan is the same on every rank (auto must never split the group)
    vd.all_gather_linear(torch.randn(5, 4, device=dev), torch.randn(3, 4 * R, device=dev), strategy="auto")
    p = vd.last_plan()
    t = torch.tensor([p.chunks, ("gather", "row_parallel").index(p.strategy)], device=dev)
    t2 = t.clone()
    dist.all_reduce(t2, op=dist.ReduceOp.MAX)
    ck.true("plans agree", torch.equal(t, t2))


def _suite_cuda_big(ck, vd, dist, dev, R, rank):
    """Sizes that reach the fused CUDA kernel families (GEMM, skinny) through the distributed path."""
    torch.backends.cuda.matmul.allow_tf32 = False
    seed = 1000
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for batch, H, K in (((300,), 128, 256), ((4, 33), 64, 192), ((16,), 1024, 512)):
            for strategy, chunks, sharded, scatter in (
                ("gather", 1, False, False), ("gather", 4, False, False), ("gather", 3, False, False),
                ("row_parallel", 2, False, False), ("row_parallel", 1, True, True), ("auto", None, False, False),
            ):
                seed += 1
                # fp32 also in "sum" mode (the reduce_scatter / all_reduce adjoints); the half types'
                # gradients are checked norm-wise in "replicated" mode only
                grad_mode = "sum" if dtype == torch.float32 and seed % 2 else "replicated"
                _case(ck, vd, dist, dev, R, rank, seed, batch, H, K, dtype, strategy, chunks, sharded,
                      scatter, grad_mode, True)


def _suite_module(ck, vd, dist, dev, R, rank):
    import torch.nn as nn

    torch.manual_seed(0)  # the same nn.Linear on every rank
    H, K = 6, 7
    lin = nn.Linear(R * H, K, dtype=torch.float64, device=dev)
    g = torch.Generator().manual_seed(5)
    xs = torch.randn(R, 2, 5, H, generator=g, dtype=torch.float64).to(dev)
    yr = lin(torch.cat(list(xs), -1))
    yr.sum().backward()
    for sharded in (False, True):
        for strategy in ("gather", "row_parallel", "auto"):
            if sharded and strategy == "gather":
                continue
            m = vd.AllGatherLinear.from_linear(lin, sharded_weight=sharded, strategy=strategy)
            y = m(xs[rank])
            ck.close(f"module sharded={sharded} {strategy} y", y, yr.detach(), 1e-9, 1e-9)
            ck.true(f"module {strategy} plan", m.last_plan is not None and
                    (strategy == "auto" or m.last_plan.strategy == strategy))
            y.sum().backward()
            want = lin.weight.grad[:, rank * H : (rank + 1) * H] if sharded else lin.weight.grad
            ck.close(f"module sharded={sharded} {strategy} grad_w", m.weight.grad, want, 1e-9, 1e-9)
            ck.close(f"module sharded={sharded} {strategy} grad_b", m.bias.grad, lin.bias.grad, 1e-9, 1e-9)
            ck.close(f"module sharded={sharded} full_weight", m.full_weight(), lin.weight.detach(), 0, 0)
    # state_dict of the full-weight flavour is nn.Linear's
    m = vd.AllGatherLinear.from_linear(lin)
    lin2 = nn.Linear(R * H, K, dtype=torch.float64, device=dev)
    lin2.load_state_dict(m.state_dict())
    ck.close("state_dict round trip", lin2.weight, lin.weight, 0, 0)
    # fresh construction: identical on every rank (broadcast from group rank 0)
    torch.manual_seed(1234 + rank)  # deliberately different seeds
    m = vd.AllGatherLinear(H, K, device=dev, dtype=torch.float64)
    w0 = m.weight.detach().clone()
    dist.broadcast(w0, src=0)
    ck.close("init replicated", m.weight, w0, 0, 0)
    ms = vd.AllGatherLinear(H, K, sharded_weight=True, device=dev, dtype=torch.float64)
    ck.true("sharded shape", tuple(ms.weight.shape) == (K, H) and ms.in_features == R * H)

    # torch.compile: the custom ops trace with fullgraph, forward and backward
    torch._dynamo.reset()
    for strategy, chunks, scatter, sharded in (
        ("gather", 2, False, False), ("row_parallel", 2, False, False), ("row_parallel", 1, True, True),
    ):
        def f(x, w, b):
            return vd.all_gather_linear(x, w, b, strategy=strategy, chunks=chunks, scatter_output=scatter)

        cf = torch.compile(f, fullgraph=True, backend="aot_eager")
        x = xs[rank].detach().reshape(-1, H)
        w_src = lin.weight.detach()[:, rank * H : (rank + 1) * H] if sharded else lin.weight.detach()
        outs = []
        for fn in (f, cf):
            xx = x.clone().requires_grad_()
            ww = w_src.clone().contiguous().requires_grad_()
            bb = lin.bias.detach().clone().requires_grad_()
            y = fn(xx, ww, bb)
            (y * torch.arange(y.numel(), device=dev, dtype=y.dtype).view_as(y)).sum().backward()
            outs.append((y.detach(), xx.grad, ww.grad, bb.grad))
        for i, n in enumerate(("y", "grad_x", "grad_w", "grad_b")):
            ck.close(f"compile {strategy} scatter={scatter} {n}", outs[1][i], outs[0][i], 1e-12, 1e-12)
    cm = torch.compile(vd.AllGatherLinear.from_linear(lin, strategy="gather", chunks=2), fullgraph=True,
                       backend="aot_eager")
    ck.close("compiled module", cm(xs[rank]), yr.detach(), 1e-9, 1e-9)
    # fp32, auto with a user cost model, dynamic batch sizes (specialised: one graph per size)
    model = vd.default_cost_model(dev.type).replace(link_bw=1e8)
    w32 = lin.weight.detach().float().requires_grad_()

    def g(x):
        return vd.all_gather_linear(x, w32, None, cost_model=model)

    cg = torch.compile(g, fullgraph=True, backend="aot_eager", dynamic=True)
    for rows in (5, 8):
        x32 = torch.randn(rows, H, generator=g_rows(rows), dtype=torch.float32).to(dev)
        want = g(x32)
        got = cg(x32)
        ck.close(f"compile dynamic fp32 rows={rows}", got, want, 1e-6, 1e-6)
        got.sum().backward()
    # cost models as arguments, received from rank 0 (unpickled), dynamic=True: the compiled plan is
    # the eager plan of the model passed, an equal model reuses the graph, a different one recompiles
    objs = ([model.replace(link_bw=1e3), model.replace(link_bw=1e15, coll_latency=0.0, allreduce_latency=0.0)]
            if rank == 0 else [None, None])
    dist.broadcast_object_list(objs, src=0)
    slow, fast = objs
    wd = w32.detach()
    plans = [vd.plan_all_gather_linear(R, 5, H, K, torch.float32, device_type=dev.type, cost_model=c).strategy
             for c in (slow, fast)]
    if R > 1:  # one rank moves no bytes: every link speed gives the same plan
        ck.true(f"slow and fast links plan differently {plans}", plans[0] != plans[1])
    seen = []

    def record(gm, example_inputs):
        seen.append({str(n.target).split(".")[1] for n in gm.graph.nodes if str(n.target).startswith("vga_dist.")})
        return gm

    torch._dynamo.reset()
    ch = torch.compile(lambda x, c: vd.all_gather_linear(x, wd, None, cost_model=c), fullgraph=True,
                       backend=record, dynamic=True)
    x32 = torch.randn(5, H, generator=g_rows(5), dtype=torch.float32).to(dev)
    for c in (slow, fast, slow.replace()):
        want = vd.all_gather_linear(x32, wd, None)
        ck.close(f"compile cost model argument {c.link_bw:g}", ch(x32, c), want, 1e-6, 1e-6)
    want_ops = [{"gather": "ag_linear", "row_parallel": "rp_linear"}[p] for p in plans]
    ck.true(f"one graph per distinct cost model, with its plan: {seen}", seen == [{want_ops[0]}, {want_ops[1]}])

    # calibrate(): every number measured, finite and positive, and the same model on every rank
    cal = vd.calibrate(device=dev, iters=2, set_default=False)
    numbers = [cal.link_bw, cal.coll_latency, cal.allreduce_latency, cal.mem_bw, *dict(cal.gemm_flops).values()]
    ck.true(f"calibrated numbers positive and finite: {cal}", all(0 < v < math.inf for v in numbers))
    ck.true(f"calibrated overlap_cost in [0, 1]: {cal.overlap_cost}", 0.0 <= cal.overlap_cost <= 1.0)
    keys = [None] * R
    dist.all_gather_object(keys, cal.key)
    ck.true("calibrate gives every rank the same model", len(set(keys)) == 1)


def g_rows(rows):
    return torch.Generator().manual_seed(rows)


def _worker(argv):
    suite, world, rank, tmp, backend, device, deadline = argv
    world, rank = int(world), int(rank)
    # Where a rank is stuck, if it is: every thread's stack in its log shortly before the launcher kills it.
    faulthandler.dump_traceback_later(max(1.0, float(deadline) - 10.0), exit=False)
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    import vga_linear.distributed as vd

    ck = _Checker(rank)
    t0 = time.monotonic()
    {"core": _suite_core, "module": _suite_module, "cuda_big": _suite_cuda_big}[suite](
        ck, vd, dist, dev, world, rank
    )
    dist.barrier()
    Path(tmp, f"report{rank}.json").write_text(
        json.dumps({"failures": ck.failures, "checks": ck.checks, "seconds": time.monotonic() - t0})
    )
    dist.destroy_process_group()
    # The report is written and the group torn down. Skip the interpreter's own teardown: after
    # destroy_process_group() has returned, it aborts in torch's C++ static destructors ("terminate
    # called without an active exception") in about 1 of 5 gloo ranks here, which would fail a
    # run whose checks all passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    _worker(sys.argv[2:])
