"""torch.compile traces the op (and its backward) with no graph break."""

import warnings

import pytest
import torch

import vga_linear
import vga_linear.compile as vc
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
@pytest.mark.parametrize("dynamic", [False, True])
def test_inductor_fullgraph_backward_cuda(dynamic):
    # Inductor traces the op's backward (on Hopper, the fused backward op on the GEMM core for these
    # bf16 shapes) over shapes that change between calls, 3-D and 4-D x; gradients as the eager op's.
    torch._dynamo.reset()
    compiled = torch.compile(_fn, backend="inductor", fullgraph=True, dynamic=dynamic)
    for R, batch, H, K in [(4, (256,), 64, 128), (4, (300,), 64, 128), (8, (2, 130), 64, 256)]:
        leaves = [make_x(R, batch, H, torch.bfloat16, "cuda"), *make_params(R, H, K, torch.bfloat16, "cuda")]
        grad_out = torch.randn((*batch, K), dtype=torch.bfloat16, device="cuda")
        grads = []
        for fn in (compiled, _fn):
            inputs = [t.detach().clone().requires_grad_() for t in leaves]
            fn(*inputs).backward(grad_out)
            grads.append([t.grad for t in inputs])
        for got, eager in zip(*grads):
            torch.testing.assert_close(got, eager, atol=2e-2, rtol=2e-2)


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


def test_rewrite_fails_soft_on_untested_torch(monkeypatch):
    # (here: test_compile_rewrite.py skips itself on exactly such a torch) One warning, and nothing
    # installed in Inductor's config.
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(torch, "__version__", "2.99.0")
    monkeypatch.delenv("VGA_LINEAR_COMPILE_ANY_TORCH", raising=False)
    monkeypatch.setattr(vc, "_warned", set())
    assert vc.supported() is not None
    before = inductor_config.pre_grad_custom_pass
    with pytest.warns(RuntimeWarning, match="outside the tested range"):
        assert vc.enable() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning only
        assert vc.enable() is False
        assert vc.options() == {}
        with vc.enabled():
            assert not vc.is_enabled()
            assert inductor_config.pre_grad_custom_pass is before
    assert not vc.is_enabled() and inductor_config.pre_grad_custom_pass is before
    monkeypatch.setenv("VGA_LINEAR_COMPILE_ANY_TORCH", "1")
    assert vc.supported() is None
