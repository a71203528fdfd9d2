"""torch.compile traces the op (and its backward) with no graph break."""

import pytest
import torch

import vga_linear
from utils import assert_close_to_float64, make_params, make_x


def _fn(x, w, b):
    return torch.relu(vga_linear.gather_concat_linear(x, w, b)) * 2


def _compile_and_check(backend, device, dynamic, dtype=torch.float32, mode=None):
    torch._dynamo.reset()
    compiled = torch.compile(_fn, backend=backend, fullgraph=True, dynamic=dynamic, mode=mode)
    for R, batch, H, K in [(3, (5,), 8, 7), (3, (9,), 8, 7), (2, (4, 3), 16, 5)]:
        x = make_x(R, batch, H, dtype, device)
        w, b = make_params(R, H, K, dtype, device)
        out = compiled(x, w, b)
        expected = _fn(x, w, b)
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dynamic", [False, True])
def test_fullgraph_cpu(dynamic):
    _compile_and_check("aot_eager", "cpu", dynamic)


def test_fullgraph_backward_cpu():
    torch._dynamo.reset()
    compiled = torch.compile(_fn, backend="aot_eager", fullgraph=True, dynamic=True)
    x = make_x(3, (6,), 8, torch.float64, "cpu").requires_grad_()
    w, b = make_params(3, 8, 4, torch.float64, "cpu")
    w.requires_grad_()
    compiled(x, w, b).sum().backward()
    x64, w64 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    _fn(x64, w64, b).sum().backward()
    torch.testing.assert_close(x.grad, x64.grad)
    torch.testing.assert_close(w.grad, w64.grad)


@pytest.mark.cuda
@pytest.mark.parametrize("dynamic", [False, True])
def test_inductor_fullgraph_cuda(dynamic):
    _compile_and_check("inductor", "cuda", dynamic, dtype=torch.bfloat16 if dynamic else torch.float32)


@pytest.mark.cuda
def test_reduce_overhead_cuda():
    torch._dynamo.reset()
    compiled = torch.compile(vga_linear.gather_concat_linear, mode="reduce-overhead", fullgraph=True)
    x = make_x(4, (12,), 32, torch.float32, "cuda")
    w, b = make_params(4, 32, 56, torch.float32, "cuda")
    for _ in range(4):  # warm-up, record, replay
        x.copy_(torch.randn_like(x))
        out = compiled(x, w, b).clone()
        assert_close_to_float64(out, x, w, b)
