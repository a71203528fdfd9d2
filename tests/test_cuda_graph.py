"""The kernels are safe under CUDA-graph capture: no sync, no allocation of their own."""

import pytest
import torch

import vga_linear
from utils import assert_close_scaled, assert_close_to_float64, make_params, make_x, reference_grads


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(4, (12,), 32, 56), (32, (16,), 128, 512), (8, (256,), 64, 384)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_capture_and_replay_on_fresh_inputs(shape, dtype):
    R, batch, H, K = shape
    x = make_x(R, batch, H, dtype, "cuda")
    w, b = make_params(R, H, K, dtype, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        vga_linear.gather_concat_linear(x, w, b)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = vga_linear.gather_concat_linear(x, w, b)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        w.copy_(torch.randn_like(w) / (R * H) ** 0.5)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_float64(out, x, w, b)


@pytest.mark.cuda
def test_runs_on_the_current_stream():
    x = make_x(4, (64,), 32, torch.float32, "cuda")
    w, b = make_params(4, 32, 56, torch.float32, "cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = vga_linear.gather_concat_linear(x, w, b)
    side.synchronize()
    assert_close_to_float64(out, x, w, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_training_step_capture_and_replay_on_fresh_inputs(dtype):
    # Forward and autograd backward captured whole, as CUDA-graph training captures a step: a leaf x
    # in the SDPA layout (its gradient in its own strides), W's gradient over 2048 rows (where the
    # plan splits the reduction, its workspace comes from the graph's pool), the bias's. Replayed on
    # fresh inputs with the output and every gradient poisoned first.
    R, batch, H, K = 8, (2, 1024), 64, 384
    x = make_x(R, batch, H, dtype, "cuda", "sdpa").requires_grad_()
    w, b = make_params(R, H, K, dtype, "cuda")
    w.requires_grad_()
    b.requires_grad_()
    grad_out = torch.randn((*batch, K), dtype=dtype, device="cuda")
    leaves = (x, w, b)

    def step():
        out = vga_linear.gather_concat_linear(x, w, b)
        out.backward(grad_out)
        return out

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the capture
            step()
            for t in leaves:
                t.grad = None
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            w.copy_(torch.randn_like(w) / (R * H) ** 0.5)
            b.copy_(torch.randn_like(b))
            grad_out.copy_(torch.randn_like(grad_out))
            for t in (out, *(leaf.grad for leaf in leaves)):
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_float64(out.detach(), x.detach(), w.detach(), b.detach())
        ref_x, ref_w = reference_grads(grad_out, x.detach(), w.detach())
        ref_b = grad_out.double().sum((0, 1))
        for t, ref in zip(leaves, (ref_x, ref_w, ref_b)):
            assert_close_scaled(t.grad, ref)
