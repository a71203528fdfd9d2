"""The op's contract against the float64 reference, on every device: shapes, dtypes, strides,
errors, autograd. Each CUDA kernel family forced on its own: tests/test_families.py."""

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vga_linear
from conftest import DEVICES
from utils import (  # noqa: F401  (highest_fp32_precision: an autouse fixture)
    DTYPES,
    SHAPES,
    TOLERANCE,
    assert_close_scaled,
    assert_close_to_float64,
    highest_fp32_precision,
    make_params,
    make_x,
    poison_next_outputs,
    reference_grads,
    run_op,
)

LAYOUTS = ["contiguous", "sdpa", "padded", "shard_last"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_float64_reference(device, dtype, shape, bias):
    R, batch, H, K = shape
    x = make_x(R, batch, H, dtype, device)
    weight, b = make_params(R, H, K, dtype, device, bias)
    assert_close_to_float64(run_op(x, weight, b), x, weight, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_strided_views_need_no_copy(device, layout, dtype):
    x = make_x(4, (3, 10), 16, dtype, device, layout)
    weight, b = make_params(4, 16, 24, dtype, device)
    assert_close_to_float64(run_op(x, weight, b), x, weight, b)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_weight_and_bias(device):
    x = make_x(3, (6,), 8, torch.float32, device)
    weight = torch.randn(40, 24, device=device)[::2]  # (20, 24), row stride 48
    b = torch.randn(40, device=device)[::2]
    assert_close_to_float64(run_op(x, weight, b), x, weight, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("empty", ["batch", "K", "R", "H"])
def test_empty_dims(device, empty):
    R, B, H, K = 2, 3, 4, 5
    R, B, H, K = [0 if name == empty else v for name, v in zip(["R", "batch", "H", "K"], [R, B, H, K])]
    x = torch.randn(R, B, H, device=device)
    weight, b = make_params(R, H, K, torch.float32, device)
    out = run_op(x, weight, b)
    assert out.shape == (B, K)
    # With an empty reduction (R*H == 0) the output is the bias, broadcast.
    assert_close_to_float64(out, x, weight, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("empty", ["R", "batch", "H", "K"])
def test_empty_dims_backward(device, dtype, empty):
    # No rows: grad_weight and grad_bias are sums over nothing (zeros); K == 0: grad_x is one; no
    # shards or empty ones: x and weight are empty. On a poisoned allocator, so a product that
    # launches nothing where it must write zeros shows NaN.
    R, B, H, K = [0 if name == empty else v for name, v in zip(["R", "batch", "H", "K"], [3, 4, 64, 32])]
    x = make_x(R, (B,), H, dtype, device).requires_grad_()
    w, b = make_params(R, H, K, dtype, device)
    w.requires_grad_()
    b.requires_grad_()
    grad_out = torch.randn((B, K), dtype=dtype, device=device)
    poison_next_outputs([x.shape, w.shape, b.shape], dtype, device)
    vga_linear.gather_concat_linear(x, w, b).backward(grad_out)
    for t in (x, w):
        assert t.grad.shape == t.shape and torch.equal(t.grad, torch.zeros_like(t)), t.shape
    assert torch.equal(b.grad, grad_out.sum(0))
    if R == 0:  # (autograd's backward returns the empty gradients itself: the ops need a shard)
        with pytest.raises(RuntimeError, match="is not a multiple of num_shards = 0"):
            torch.ops.vga.gather_concat_linear_backward(grad_out, x.detach(), w.detach())
        return
    poison_next_outputs([x.shape, w.shape], dtype, device)
    grad_x, grad_w = torch.ops.vga.gather_concat_linear_backward(grad_out, x.detach(), w.detach())
    assert torch.equal(grad_x, torch.zeros_like(x)) and torch.equal(grad_w, torch.zeros_like(w))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_propagate_like_linear(device):
    x = make_x(2, (4,), 8, torch.float32, device)
    weight, b = make_params(2, 8, 6, torch.float32, device)
    x[1, 2, 3] = float("nan")
    weight[4, 1] = float("inf")
    out = run_op(x, weight, b)
    ref = vga_linear.reference.gather_concat_linear_reference(x, weight, b)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isinf(), ref.isinf())
    finite = ref.isfinite()
    torch.testing.assert_close(out[finite], ref[finite], atol=1e-4, rtol=1e-4)


# -- bad input: a RuntimeError that names the argument, on every device -------------


def _bad_inputs(device):
    x = torch.randn(2, 3, 4, device=device)
    w = torch.randn(5, 8, device=device)
    b = torch.randn(5, device=device)
    other = "cpu" if device != "cpu" else "meta"
    return [
        ("x must be \\(R, \\*batch, H\\)", (torch.randn(3, 4, device=device), w, b)),
        ("x must be \\(R, \\*batch, H\\)", (torch.randn(2, 1, 1, 3, 4, device=device), w, b)),
        ("weight must be 2-D", (x, torch.randn(5, 8, 1, device=device), b)),
        ("weight.shape\\[1\\] must equal R\\*H = 2\\*4 = 8", (x, torch.randn(5, 9, device=device), b)),
        ("bias must have shape \\(K,\\) = \\(5,\\)", (x, w, torch.randn(6, device=device))),
        ("bias must have shape \\(K,\\) = \\(5,\\)", (x, w, torch.randn(5, 1, device=device))),
        ("must share one dtype, got x float32 and weight float16", (x, w.half(), b)),
        ("must share one dtype, got x float32 and bias float64", (x, w, b.double())),
        ("x has dtype int64; supported dtypes are", (x.long(), w.long(), b.long())),
        ("weight is on .* but x is on", (x, w.to(other), b)),
        ("bias is on .* but x is on", (x, w, b.to(other))),
        ("x's last dim must have stride 1, got stride 2", (torch.randn(2, 3, 8, device=device)[..., ::2], w, b)),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_names_the_argument(device):
    for pattern, args in _bad_inputs(device):
        with pytest.raises(RuntimeError, match=pattern):
            torch.ops.vga.gather_concat_linear(*args)


# -- hypothesis: random shapes, strides and dtypes ----------------------------------


@st.composite
def problems(draw, dtypes=(torch.float32, torch.float16, torch.bfloat16)):
    R = draw(st.integers(1, 9))
    two_batch = draw(st.booleans())
    batch = (draw(st.integers(1, 40)),) + ((draw(st.integers(1, 5)),) if two_batch else ())
    H = draw(st.one_of(st.integers(1, 40), st.sampled_from([8, 16, 64, 128, 136])))
    K = draw(st.integers(1, 150))
    layout = draw(st.sampled_from(LAYOUTS))
    dtype = draw(st.sampled_from(dtypes))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return R, batch, H, K, layout, dtype, bias, seed


def _check_problem(problem, device):
    R, batch, H, K, layout, dtype, bias, seed = problem
    g = torch.Generator(device=device).manual_seed(seed)
    x = make_x(R, batch, H, dtype, device, layout, generator=g)
    weight, b = make_params(R, H, K, dtype, device, bias, generator=g)
    assert_close_to_float64(run_op(x, weight, b), x, weight, b)


@given(problems())
def test_hypothesis_cpu(problem):
    _check_problem(problem, "cpu")


# One sweep per dtype, so the "device" profile runs 1,000 random problems of each.
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_hypothesis_cuda(dtype):
    given(problems(dtypes=(dtype,)))(lambda problem: _check_problem(problem, "cuda"))()


@st.composite
def layer_problems(draw):
    """Hopper-sized half-precision problems: the dispatcher's plans (tile widths, splits, packed
    tails, span copies, swapped tokens) at random sizes and layouts, misaligned ones included."""
    R = draw(st.integers(1, 40))
    H = draw(st.sampled_from([8, 16, 48, 64, 80, 96, 112, 128, 136, 256]))
    rows = draw(st.integers(1, 4096))
    batch = (rows,) if draw(st.booleans()) else (draw(st.integers(1, 4)), max(1, rows // 4))
    K = draw(st.one_of(st.integers(1, 2048), st.integers(1, 256).map(lambda v: 8 * v)))
    layout = draw(st.sampled_from(LAYOUTS + ["misaligned", "odd_pitch"]))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return R, batch, H, K, layout, dtype, bias, seed


def _check_layer_problem(problem):
    R, batch, H, K, layout, dtype, bias, seed = problem
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = make_x(R, batch, H, dtype, "cuda", layout, generator=g)
    weight, b = make_params(R, H, K, dtype, "cuda", bias, generator=g)
    assert_close_to_float64(run_op(x, weight, b), x, weight, b)
    grad_out = torch.randn((*batch, K), dtype=dtype, device="cuda", generator=g)
    poison_next_outputs([x.shape, weight.shape], dtype, "cuda")
    grad_x, grad_w = torch.ops.vga.gather_concat_linear_backward(grad_out, x, weight)
    ref_x, ref_w = reference_grads(grad_out, x, weight)
    assert_close_scaled(grad_x, ref_x)
    assert_close_scaled(grad_w, ref_w)


# At most 200 problems of these sizes, also under the "device" profile.
@pytest.mark.cuda
def test_hypothesis_cuda_layer_sizes():
    runs = settings(settings(), max_examples=min(settings().max_examples, 200))
    runs(given(layer_problems())(_check_layer_problem))()


# -- opcheck and autograd -------------------------------------------------------------


def _opcheck_samples(device):
    for requires_grad in (False, True):
        for dtype in (torch.float32, torch.float64):
            x = make_x(3, (4,), 8, dtype, device).requires_grad_(requires_grad)
            w, b = make_params(3, 8, 5, dtype, device)
            yield (x, w.requires_grad_(requires_grad), b.requires_grad_(requires_grad))
            yield (x, w, None)
            x4 = make_x(2, (3, 2), 8, dtype, device, "sdpa").detach().requires_grad_(requires_grad)
            yield (x4, make_params(2, 8, 3, dtype, device, False)[0], None)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for args in _opcheck_samples(device):
        torch.library.opcheck(torch.ops.vga.gather_concat_linear.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_ops(device):
    grad_out = torch.randn(4, 5, device=device, dtype=torch.float64)
    weight = torch.randn(5, 3 * 8, device=device, dtype=torch.float64)
    x = torch.randn(3, 4, 8, device=device, dtype=torch.float64)
    torch.library.opcheck(torch.ops.vga.gather_concat_linear_grad_x.default, (grad_out, weight, 3))
    # grad_x in x's strides (dense x: contiguous, or the transpose of a (batch, R, H) tensor), else the concat view
    for like in (x, torch.randn(4, 3, 8, device=device, dtype=torch.float64).transpose(0, 1),
                 torch.randn(3, 4, 16, device=device, dtype=torch.float64)[..., :8]):
        torch.library.opcheck(torch.ops.vga.gather_concat_linear_grad_x.default, (grad_out, weight, 3, like))
    torch.library.opcheck(torch.ops.vga.gather_concat_linear_grad_weight.default, (grad_out, x))
    for like in (x, torch.randn(4, 3, 8, device=device, dtype=torch.float64).transpose(0, 1),
                 torch.randn(3, 4, 16, device=device, dtype=torch.float64)[..., :8]):
        torch.library.opcheck(torch.ops.vga.gather_concat_linear_backward.default, (grad_out, like, weight))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_op_returns_what_its_two_products_do(device):
    for layout, batch in (("contiguous", (6,)), ("sdpa", (2, 5)), ("padded", (7,))):
        x = make_x(3, batch, 8, torch.float64, device, layout)
        weight = make_params(3, 8, 5, torch.float64, device, bias=False)[0]
        grad_out = torch.randn(*batch, 5, dtype=torch.float64, device=device)
        grad_x, grad_weight = torch.ops.vga.gather_concat_linear_backward(grad_out, x, weight)
        alone = torch.ops.vga.gather_concat_linear_grad_x(grad_out, weight, 3, x)
        assert grad_x.stride() == alone.stride() and torch.equal(grad_x, alone)
        assert torch.equal(grad_weight, torch.ops.vga.gather_concat_linear_grad_weight(grad_out, x))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_op_bad_input_names_the_op(device):
    grad_out = torch.randn(4, 5, device=device)
    weight = torch.randn(5, 3 * 8, device=device)
    cases = [("gather_concat_linear_backward: x must be \\(R, \\*batch, H\\) with the batch dims of grad_out",
              (grad_out, torch.randn(3, 6, 8, device=device), weight)),
             ("gather_concat_linear_backward: x must be \\(R, \\*batch, H\\)", (grad_out, torch.randn(3, 8, device=device), weight)),
             ("gather_concat_linear_backward: grad_out must be", (grad_out[0], torch.randn(3, 4, 8, device=device), weight)),
             ("gather_concat_linear_backward: x must be \\(num_shards", (grad_out, torch.randn(3, 4, 7, device=device), weight)),
             ("gather_concat_linear_backward: weight must be \\(K, R\\*H\\) with K = grad_out.shape\\[-1\\] = 5",
              (grad_out, torch.randn(3, 4, 8, device=device), weight[:4])),
             ("gather_concat_linear_backward: weight.shape\\[1\\] = 24 is not a multiple of num_shards = 5",
              (grad_out, torch.randn(5, 4, 8, device=device), weight))]
    for pattern, args in cases:
        with pytest.raises(RuntimeError, match=pattern):
            torch.ops.vga.gather_concat_linear_backward(*args)
    # dtypes, devices and the shard count, on each backward op (the CUDA entry and the reference
    # path word them alike)
    x = torch.randn(3, 4, 8, device=device)
    ops = torch.ops.vga
    calls = [("gather_concat_linear_backward: x and grad_out must share one dtype, got float64 and float32",
              lambda: ops.gather_concat_linear_backward(grad_out, x.double(), weight)),
             ("gather_concat_linear_grad_x: grad_out and weight must share one dtype, got float32 and bfloat16",
              lambda: ops.gather_concat_linear_grad_x(grad_out, weight.bfloat16(), 3)),
             ("gather_concat_linear_grad_weight: x and grad_out must share one dtype, got float16 and float32",
              lambda: ops.gather_concat_linear_grad_weight(grad_out, x.half())),
             ("gather_concat_linear_grad_x: grad_out has dtype int32; supported dtypes are",
              lambda: ops.gather_concat_linear_grad_x(grad_out.int(), weight.int(), 3)),
             ("gather_concat_linear_grad_x: weight.shape\\[1\\] = 24 is not a multiple of num_shards = 0",
              lambda: ops.gather_concat_linear_grad_x(grad_out, weight, 0)),
             ("gather_concat_linear_grad_weight: x's last dim must have stride 1, got stride 4",
              lambda: ops.gather_concat_linear_grad_weight(grad_out, torch.randn(3, 8, 4, device=device).transpose(1, 2)))]
    if device == "cuda":
        calls += [("gather_concat_linear_grad_x: weight is on cpu but grad_out is on cuda:0",
                   lambda: ops.gather_concat_linear_grad_x(grad_out, weight.cpu(), 3)),
                  ("gather_concat_linear_grad_x: x is on cpu but grad_out is on cuda:0",
                   lambda: ops.gather_concat_linear_grad_x(grad_out, weight, 3, x.cpu())),
                  ("gather_concat_linear_grad_weight: grad_out is on cpu but x is on cuda:0",
                   lambda: ops.gather_concat_linear_grad_weight(grad_out.cpu(), x))]
    for pattern, call in calls:
        with pytest.raises(RuntimeError, match=pattern):
            call()


@pytest.mark.parametrize("needs", [("x", "weight"), ("x",), ("weight",)])
def test_autograd_runs_both_products_in_one_op_when_both_are_needed(needs):
    x = make_x(3, (4,), 8, torch.float32, "cpu").requires_grad_("x" in needs)
    weight, bias = make_params(3, 8, 5, torch.float32, "cpu")
    weight.requires_grad_("weight" in needs)
    bias.requires_grad_()
    out = vga_linear.gather_concat_linear(x, weight, bias)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out.sum().backward()
    ran = {e.key.removeprefix("vga::") for e in prof.key_averages() if e.key.startswith("vga::")}
    expected = ({"gather_concat_linear_backward"} if len(needs) == 2 else
                {"gather_concat_linear_grad_x"} if needs == ("x",) else {"gather_concat_linear_grad_weight"})
    assert ran == expected, ran


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("two_batch", [False, True])
def test_gradcheck_float64_cpu(bias, two_batch):
    batch = (3, 2) if two_batch else (4,)
    x = make_x(3, batch, 5, torch.float64, "cpu", "sdpa" if two_batch else "contiguous")
    w, b = make_params(3, 5, 4, torch.float64, "cpu", bias)
    inputs = [t.detach().requires_grad_() for t in (x, w, b) if t is not None]
    fn = (lambda x, w, b: vga_linear.gather_concat_linear(x, w, b)) if bias else (
        lambda x, w: vga_linear.gather_concat_linear(x, w))
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("needs", ["all", "x", "weight", "bias", "x_bias"])
@pytest.mark.parametrize("layout", ["contiguous", "sdpa"])
def test_gradients_match_reference(device, dtype, needs, layout):
    R, batch, H, K = 3, (5, 2), 12, 7
    x = make_x(R, batch, H, dtype, device, layout).detach()
    w, b = make_params(R, H, K, dtype, device)
    grads_wanted = {"x": needs in ("all", "x", "x_bias"), "w": needs in ("all", "weight"),
                    "b": needs in ("all", "bias", "x_bias")}
    x.requires_grad_(grads_wanted["x"])
    w.requires_grad_(grads_wanted["w"])
    b.requires_grad_(grads_wanted["b"])
    grad_out = torch.randn((*batch, K), dtype=dtype, device=device)
    vga_linear.gather_concat_linear(x, w, b).backward(grad_out)

    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    vga_linear.reference.gather_concat_linear_reference(x64, w64, b64).backward(grad_out.double())
    tol = TOLERANCE[dtype] * 4  # reductions over the batch in the input dtype
    for name, t, ref in (("x", x, x64), ("w", w, w64), ("b", b, b64)):
        if grads_wanted[name]:
            assert t.grad is not None and t.grad.dtype == dtype
            torch.testing.assert_close(t.grad.double(), ref.grad, atol=tol, rtol=tol)
        else:
            assert t.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_of_an_expanded_grad_out(device):
    # .sum() hands the backward a stride-0 grad_out.
    x = make_x(2, (3,), 4, torch.float64, device).requires_grad_()
    w, b = make_params(2, 4, 3, torch.float64, device)
    w.requires_grad_()
    vga_linear.gather_concat_linear(x, w, b).sum().backward()
    x64, w64 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    vga_linear.reference.gather_concat_linear_reference(x64, w64, b).sum().backward()
    torch.testing.assert_close(x.grad, x64.grad)
    torch.testing.assert_close(w.grad, w64.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("needs", [(True, True, True), (True, False, False), (False, True, False), (False, False, True)],
                         ids=str)
def test_eager_autograd_path_gives_the_registered_gradients(device, needs):
    # vga_linear.gather_concat_linear trains through _EagerAutograd (a plain autograd.Function);
    # torch.ops.vga.gather_concat_linear through the kernel register_autograd installs. Same
    # setup_context and backward: bitwise-equal gradients, whichever inputs need them.
    x = make_x(3, (2, 5), 8, torch.float32, device)
    w, b = make_params(3, 8, 6, torch.float32, device)
    g = torch.randn(2, 5, 6, device=device)
    grads = []
    for call in (vga_linear.gather_concat_linear, torch.ops.vga.gather_concat_linear):
        leaves = [t.detach().clone().requires_grad_(n) for t, n in zip((x, w, b), needs)]
        out = call(*leaves)
        out.backward(g)
        grads.append([t.grad for t in leaves])
        if call is vga_linear.gather_concat_linear:
            assert type(out.grad_fn).__name__ == "_EagerAutogradBackward"
    for eager, registered in zip(*grads):
        assert (eager is None) == (registered is None)
        if eager is not None:
            assert torch.equal(eager, registered)


# -- the Python entry point's no-autograd fast path ------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_functional_fast_path_keeps_autograd_semantics(device):
    x = make_x(3, (4,), 8, torch.float64, device)
    w, b = make_params(3, 8, 5, torch.float64, device)
    out = vga_linear.gather_concat_linear(x, w, b)
    assert out.grad_fn is None and not out.requires_grad
    assert_close_to_float64(out, x, w, b)
    with torch.no_grad():
        assert not vga_linear.gather_concat_linear(x, w.requires_grad_(), b).requires_grad
    out = vga_linear.gather_concat_linear(x, w, b)  # w requires grad now: the autograd path
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    assert w.grad is not None


# -- first calls from several host threads at once ----------------------------------------

_FIRST_CALLS_SCRIPT = r"""
import threading, torch, vga_linear
torch.manual_seed(0)
# R, rows, H, K and the forward each reaches (checked after the threads): a core plan that splits in clusters, a
# decode split (sm90_skinny's 16-row kernels), packed 80-wide tails, a swapped width, the narrow tiles (m64),
# sm90_skinny's 64-row kernels, the narrow tiles split in the cluster (2 and 4)
SHAPES = [(32, 256, 128, 4096), (32, 16, 128, 4096), (16, 333, 80, 1280), (32, 333, 128, 4096), (12, 333, 64, 768),
          (8, 64, 1024, 2048), (16, 100, 80, 1280), (12, 128, 64, 768)]
REACHES = ["sm90_gemm/n128/c2", "sm90_skinny", "sm90_gemm/n64/c2", "sm90_gemm/n96", "sm90_gemm/n64/s1/m64",
           "sm90_skinny", "sm90_gemm/n64/c2/m64", "sm90_gemm/n64/c4/m64"]
inputs = [(torch.randn(R, B, H, device="cuda", dtype=torch.bfloat16),
           torch.randn(K, R * H, device="cuda", dtype=torch.bfloat16) / (R * H) ** 0.5,
           torch.randn(B, K, device="cuda", dtype=torch.bfloat16)) for R, B, H, K in SHAPES]

def calls():
    outs = []
    for x, w, g in inputs:
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = vga_linear.gather_concat_linear(x, w, None)
        outs += [y.detach(), *torch.autograd.grad(y, (x, w), g)]
    torch.cuda.synchronize()
    return outs

THREADS = 8
barrier = threading.Barrier(THREADS)
results = [None] * THREADS
errors = []
def work(t):
    try:
        barrier.wait()
        results[t] = calls()
    except Exception as e:  # reported below
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
again = calls()
for t, outs in enumerate(results):
    for i, (a, b) in enumerate(zip(outs, again)):
        assert torch.equal(a, b), f"thread {t}, result {i} differs from a later single-thread call"
reached = [torch.ops.vga._gather_concat_linear_choice(x, w, None) for x, w, _ in inputs]
assert reached == REACHES, f"the shapes no longer reach the kernels they stand for: {reached}"
print("ok", len(again))
"""


@pytest.mark.cuda
def test_first_calls_from_many_threads_agree_bitwise():
    # The launch path caches per-device queries (traits, shared-memory opt-ins, resident clusters) on
    # a device's first call; host threads racing on that call must see whole values, so every plan,
    # and every result, is the same as a later single-thread call's. A fresh process: empty caches.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", _FIRST_CALLS_SCRIPT], cwd=root, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stdout + p.stderr
