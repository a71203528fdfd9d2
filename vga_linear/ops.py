"""Everything about the ``vga`` ops that is not a CUDA kernel.

``vga_linear._C`` defines the schemas and registers the CUDA kernels. This module
defines the schemas itself when ``_C`` did not load, and registers, either way:

- the PyTorch reference as the CompositeExplicitAutograd kernel: it serves CPU (and
  every device without a dedicated kernel, CUDA included when ``_C`` is absent);
- fake (meta) implementations with ``torch._check`` on every shape relation, so
  torch.compile traces the ops with static or dynamic shapes;
- autograd: grad_x and grad_weight are ops of their own (CUDA kernels when ``_C`` is
  loaded), and so are both together (gather_concat_linear_backward, which autograd calls when
  x and weight both need a gradient: on Hopper it starts grad_weight while grad_x finishes);
  grad_bias is a column sum.

Argument errors read the same on every device; csrc/gather_concat_linear.cu words them alike.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from . import kernels_loaded
from .reference import concat_shards, gather_concat_linear_reference

SCHEMAS = {
    "gather_concat_linear": "(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor",
    "gather_concat_linear_grad_x": "(Tensor grad_out, Tensor weight, int num_shards, Tensor? x=None) -> Tensor",
    "gather_concat_linear_grad_weight": "(Tensor grad_out, Tensor x) -> Tensor",
    "gather_concat_linear_backward": "(Tensor grad_out, Tensor x, Tensor weight) -> (Tensor grad_x, Tensor grad_weight)",
}


def _built_kernel_families() -> tuple:
    """The CUDA kernel families of this package's build, in csrc/gather_concat_linear.cu's
    preference order (its kFamilies table, which setup.py records in _build_info.py); () for a
    build without kernels or a source tree that was never built."""
    try:
        from . import _build_info
    except ImportError:
        return ()
    return tuple(getattr(_build_info, "KERNEL_FAMILIES", ())) if _build_info.EXTENSION_BUILT else ()


# The private op vga::_gather_concat_linear_family(x, weight, bias, name) runs one by name.
KERNEL_FAMILIES = _built_kernel_families()
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_SUPPORTED_DTYPE_SET = frozenset(SUPPORTED_DTYPES)
_DTYPE_NAMES = "float32, float16, bfloat16 and float64"

_lib = torch.library.Library("vga", "FRAGMENT")
if not kernels_loaded():
    for _name, _schema in SCHEMAS.items():
        _lib.define(_name + _schema)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_forward_args(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """Raise a RuntimeError naming the argument when the inputs break the op's contract."""
    op = "gather_concat_linear"
    torch._check(
        x.dim() in (3, 4),
        lambda: f"{op}: x must be (R, *batch, H) with one or two batch dims (3 or 4 dims), "
        f"got shape {list(x.shape)}",
    )
    torch._check(
        weight.dim() == 2, lambda: f"{op}: weight must be 2-D (K, R*H), got shape {list(weight.shape)}"
    )
    R, H = x.shape[0], x.shape[-1]
    torch._check(
        weight.shape[1] == R * H,
        lambda: f"{op}: weight.shape[1] must equal R*H = {R}*{H} = {R * H}, "
        f"got weight shape {list(weight.shape)}",
    )
    if bias is not None:
        torch._check(
            bias.dim() == 1,
            lambda: f"{op}: bias must have shape (K,) = ({weight.shape[0]},), got {list(bias.shape)}",
        )
        torch._check(
            bias.shape[0] == weight.shape[0],
            lambda: f"{op}: bias must have shape (K,) = ({weight.shape[0]},), got {list(bias.shape)}",
        )
    torch._check(
        x.dtype in SUPPORTED_DTYPES,
        lambda: f"{op}: x has dtype {_dtype_name(x.dtype)}; supported dtypes are {_DTYPE_NAMES}",
    )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        torch._check(
            t.dtype == x.dtype,
            lambda: f"{op}: x, weight and bias must share one dtype, got x {_dtype_name(x.dtype)} "
            f"and {name} {_dtype_name(t.dtype)}",
        )
        torch._check(
            t.device == x.device,
            lambda: f"{op}: {name} is on {t.device} but x is on {x.device}; "
            "all tensors must be on one device",
        )
    torch._check(
        (H <= 1) | (x.stride(-1) == 1),
        lambda: f"{op}: x's last dim must have stride 1, got stride {x.stride(-1)}; "
        "pass x.contiguous() or a view whose rows are contiguous",
    )


def _require(relations) -> None:
    """Check (holds, message) pairs in order, raising the first failing one's message. A relation
    that is plainly True costs a comparison (the reference kernels run on concrete shapes, where a
    torch._check call costs ~1 us); a symbolic one (tracing) goes to torch._check, one relation a
    call, so that sizes are never branched on. Relations come from generators, so a pair is only
    formed once the ones before it hold (e.g. x's dims before its sizes are read)."""
    for holds, message in relations:
        if holds is not True:
            torch._check(holds, message)


def _grad_out_relations(grad_out: Tensor, op: str):
    yield (grad_out.dim() in (2, 3),
           lambda: f"{op}: grad_out must be (*batch, K) with one or two batch dims, got {grad_out.dim()} dims")


def _device_relation(a: Tensor, a_name: str, b: Tensor, b_name: str, op: str):
    return (a.device == b.device,
            lambda: f"{op}: {b_name} is on {b.device} but {a_name} is on {a.device}; all tensors must be on one device")


def _same_relations(a: Tensor, a_name: str, b: Tensor, b_name: str, op: str):
    """The CUDA entry's check_same (csrc/gather_concat_linear_backward.cu), in its words: a's dtype
    supported, b's the same, both on one device."""
    yield (a.dtype in _SUPPORTED_DTYPE_SET,
           lambda: f"{op}: {a_name} has dtype {_dtype_name(a.dtype)}; supported dtypes are {_DTYPE_NAMES}")
    yield (a.dtype == b.dtype, lambda: f"{op}: {a_name} and {b_name} must share one dtype, got "
           f"{_dtype_name(a.dtype)} and {_dtype_name(b.dtype)}")
    yield _device_relation(a, a_name, b, b_name, op)


# The reference kernels (CompositeExplicitAutograd: CPU, and any device without its own).


def _args_plainly_valid(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """check_forward_args's rules as plain comparisons on concrete shapes: about 1 us where
    the torch._check calls cost ~20 (which would double the CPU op at small shapes). False
    means "run check_forward_args", which raises the error the rules word."""
    xs, ws = x.shape, weight.shape
    if not (len(xs) in (3, 4) and len(ws) == 2 and ws[1] == xs[0] * xs[-1]):
        return False
    dtype, device = x.dtype, x.device
    if dtype not in _SUPPORTED_DTYPE_SET or weight.dtype != dtype or weight.device != device:
        return False
    if bias is not None and (bias.dtype != dtype or bias.device != device or bias.shape != (ws[0],)):
        return False
    return xs[-1] <= 1 or x.stride(-1) == 1


def _forward_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    # This real kernel sees concrete shapes (tracing with fake tensors runs _forward_fake).
    if not _args_plainly_valid(x, weight, bias):
        check_forward_args(x, weight, bias)
    if x.shape[0] == 0:
        return gather_concat_linear_reference(x, weight, bias).contiguous()
    # = gather_concat_linear_reference, inlined: CPU calls at small shapes are Python-bound.
    return F.linear(torch.cat(x.unbind(0), -1), weight, bias).contiguous()


def shards_of_concat(grad_cat: Tensor, num_shards: int) -> Tensor:
    """The (R, *batch, H) view of a (*batch, R*H) tensor: the layout grad_x is returned in when
    the op is not given x (or x is not dense).

    It is the gradient that ``cat(x.unbind(0), -1)`` (or the ``transpose(1, 2).reshape`` of an
    attention output) hands back."""
    return grad_cat.unflatten(-1, (num_shards, -1)).movedim(-2, 0)


def takes_x_layout(x: Tensor | None) -> bool:
    """Whether grad_x is returned in x's own strides: x given, non-empty, non-overlapping and
    dense, its last dim contiguous (csrc/gather_concat_linear_backward.cu decides alike). Then
    autograd hands a leaf x its gradient without a copy (AccumulateGrad copies a gradient whose
    strides differ from the leaf's), and x's producer gets its own layout back."""
    if x is None or x.numel() == 0 or (x.shape[-1] != 1 and x.stride(-1) != 1):
        return False
    dims = sorted((d for d in range(x.dim()) if x.shape[d] != 1), key=x.stride)
    expected = 1
    for d in dims:  # some order of the dims is row-major
        if x.stride(d) != expected:
            return False
        expected *= x.shape[d]
    return True


def _empty_in_layout_of(x: Tensor, like: Tensor) -> Tensor:
    """An uninitialised tensor of like's dtype and device with x's shape and strides (x
    non-overlapping and dense)."""
    return torch.empty_strided(x.shape, x.stride(), dtype=like.dtype, device=like.device)


def _grad_x_relations(grad_out: Tensor, weight: Tensor, num_shards: int, x: Tensor | None, op: str):
    yield from _grad_out_relations(grad_out, op)
    yield from _same_relations(grad_out, "grad_out", weight, "weight", op)

    def weight_message():
        return f"{op}: weight must be (K, R*H) with K = grad_out.shape[-1] = {grad_out.shape[-1]}"

    def shards_message():
        return f"{op}: weight.shape[1] = {weight.shape[1]} is not a multiple of num_shards = {num_shards}"

    yield weight.dim() == 2, weight_message
    yield weight.shape[0] == grad_out.shape[-1], weight_message
    yield num_shards > 0, shards_message
    yield weight.shape[1] % num_shards == 0, shards_message
    if x is None:
        return

    def x_message():
        return f"{op}: x must be (num_shards, *grad_out.shape[:-1], H) = the forward's input, got {tuple(x.shape)}"

    yield x.dim() == grad_out.dim() + 1, x_message
    yield x.shape[0] == num_shards, x_message
    yield x.shape[-1] * num_shards == weight.shape[1], x_message
    for d in range(grad_out.dim() - 1):
        yield x.shape[d + 1] == grad_out.shape[d], x_message
    yield _device_relation(grad_out, "grad_out", x, "x", op)


def _grad_weight_relations(grad_out: Tensor, x: Tensor, op: str):
    yield from _grad_out_relations(grad_out, op)
    yield from _same_relations(x, "x", grad_out, "grad_out", op)

    def message():
        return f"{op}: x must be (R, *batch, H) with the batch dims of grad_out (*batch, K)"

    yield x.dim() == grad_out.dim() + 1, message
    for d in range(grad_out.dim() - 1):
        yield x.shape[d + 1] == grad_out.shape[d], message
    yield ((x.shape[-1] <= 1) | (x.stride(-1) == 1),
           lambda: f"{op}: x's last dim must have stride 1, got stride {x.stride(-1)}")


# The backward op's parts, with the name of the op that checks its arguments.


def _grad_x_of(grad_out: Tensor, weight: Tensor, num_shards: int, x: Tensor | None, op: str) -> Tensor:
    _require(_grad_x_relations(grad_out, weight, num_shards, x, op))
    grad_x = shards_of_concat((grad_out @ weight).contiguous(), num_shards)
    return _empty_in_layout_of(x, grad_x).copy_(grad_x) if takes_x_layout(x) else grad_x


def _grad_weight_of(grad_out: Tensor, x: Tensor, op: str) -> Tensor:
    _require(_grad_weight_relations(grad_out, x, op))
    return grad_out.flatten(0, -2).mT @ concat_shards(x).flatten(0, -2)


def _grad_x_reference(grad_out: Tensor, weight: Tensor, num_shards: int, x: Tensor | None = None) -> Tensor:
    return _grad_x_of(grad_out, weight, num_shards, x, "gather_concat_linear_grad_x")


def _grad_weight_reference(grad_out: Tensor, x: Tensor) -> Tensor:
    return _grad_weight_of(grad_out, x, "gather_concat_linear_grad_weight")


def _backward_reference(grad_out: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    op = "gather_concat_linear_backward"
    grad_weight = _grad_weight_of(grad_out, x, op)  # (first: it checks x's dims, which grad_x's shape reads)
    return _grad_x_of(grad_out, weight, x.shape[0], x, op), grad_weight


_lib.impl("gather_concat_linear", _forward_reference, "CompositeExplicitAutograd")
_lib.impl("gather_concat_linear_grad_x", _grad_x_reference, "CompositeExplicitAutograd")
_lib.impl("gather_concat_linear_grad_weight", _grad_weight_reference, "CompositeExplicitAutograd")
_lib.impl("gather_concat_linear_backward", _backward_reference, "CompositeExplicitAutograd")


# Fake (meta) kernels: shapes only, every relation stated with torch._check.


@torch.library.register_fake("vga::gather_concat_linear")
def _forward_fake(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    check_forward_args(x, weight, bias)
    return x.new_empty((*x.shape[1:-1], weight.shape[0]))


def _grad_x_like(grad_out: Tensor, weight: Tensor, num_shards: int, x: Tensor | None, op: str) -> Tensor:
    _require(_grad_x_relations(grad_out, weight, num_shards, x, op))
    if takes_x_layout(x):
        return _empty_in_layout_of(x, grad_out)
    return shards_of_concat(grad_out.new_empty((*grad_out.shape[:-1], weight.shape[1])), num_shards)


def _grad_weight_like(grad_out: Tensor, x: Tensor, op: str) -> Tensor:
    _require(_grad_weight_relations(grad_out, x, op))
    return x.new_empty((grad_out.shape[-1], x.shape[0] * x.shape[-1]))


@torch.library.register_fake("vga::gather_concat_linear_grad_x")
def _grad_x_fake(grad_out: Tensor, weight: Tensor, num_shards: int, x: Tensor | None = None) -> Tensor:
    return _grad_x_like(grad_out, weight, num_shards, x, "gather_concat_linear_grad_x")


@torch.library.register_fake("vga::gather_concat_linear_grad_weight")
def _grad_weight_fake(grad_out: Tensor, x: Tensor) -> Tensor:
    return _grad_weight_like(grad_out, x, "gather_concat_linear_grad_weight")


@torch.library.register_fake("vga::gather_concat_linear_backward")
def _backward_fake(grad_out: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    op = "gather_concat_linear_backward"
    grad_weight = _grad_weight_like(grad_out, x, op)
    return _grad_x_like(grad_out, weight, x.shape[0], x, op), grad_weight


# Autograd.


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.num_shards = x.shape[0]
    ctx.has_bias = bias is not None


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    grad_x = grad_weight = grad_bias = None
    grad_out = grad_out.contiguous()  # e.g. the stride-0 gradient of .sum(); a no-op otherwise
    if ctx.num_shards == 0:  # no shards: x and weight are empty, and so are their gradients
        grad_x = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
    elif ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:
        grad_x, grad_weight = torch.ops.vga.gather_concat_linear_backward(grad_out, x, weight)
    elif ctx.needs_input_grad[0]:
        grad_x = torch.ops.vga.gather_concat_linear_grad_x(grad_out, weight, ctx.num_shards, x)
    elif ctx.needs_input_grad[1]:
        grad_weight = torch.ops.vga.gather_concat_linear_grad_weight(grad_out, x)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad_out.sum(dim=tuple(range(grad_out.dim() - 1)))
    return grad_x, grad_weight, grad_bias


torch.library.register_autograd(
    "vga::gather_concat_linear", _backward, setup_context=_setup_context
)


_forward_op = torch.ops.vga.gather_concat_linear.default


class _EagerAutograd(torch.autograd.Function):
    """The op's autograd for plain eager calls of ``gather_concat_linear`` (the function): the
    setup_context and backward that register_autograd installs on the op, without the generic
    wrapper it puts around them (pytree flattening, checks for mutated and aliased outputs). That
    wrapper is host time on every training step: a small shape's fwd+bwd on the CPU machine took
    131 µs through it and 113 through this class (F.linear on a concatenated input: 50); on the GPU
    machine's host, 232-282 µs and 188-238 (benchmarks/NOTES.md, run 95). The op is
    called below autograd, where its kernels run; tracing, functorch transforms, forward-mode AD,
    dispatch modes and tensor subclasses keep the registered autograd kernel. (A forward that
    takes ctx: with a separate setup_context, apply took the functorch-aware path, 35 µs a call.)"""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            out = _forward_op(x, weight, bias)
        _setup_context(ctx, (x, weight, bias), out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return _backward(ctx, grad_out)


_is_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _traced_or_transformed() -> bool:
    """A tracer, a functorch transform or a forward-mode AD level is active: the op's registered
    kernels must see the call (the eager shortcuts below would hide it from them)."""
    return (_is_compiling() or torch._C._are_functorch_transforms_active()
            or torch.autograd.forward_ad._current_level >= 0)


def _needs_grad(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Autograd has something to record: grad mode is on and an input requires grad."""
    return (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)) and _is_grad_enabled()


def _cpu_forward_direct(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The CPU kernel for a call that may skip the dispatcher: the concat as
    ``movedim(0, -2).flatten(-2)`` (one copy, or none when x is a transposed (*batch, R, H)
    tensor; the same values as cat) into ``F.linear``. Only the rules F.linear would not
    enforce itself are checked up front; any error F.linear raises is re-raised as
    check_forward_args words it."""
    if not (x.dim() in (3, 4) and weight.dim() == 2 and x.dtype in _SUPPORTED_DTYPE_SET
            and (x.is_contiguous() or x.stride(-1) == 1)
            and (bias is None or (bias.dim() == 1 and bias.numel() == weight.shape[0]))):
        check_forward_args(x, weight, bias)  # raises; the rare inputs it lets through go on below
    try:
        return F.linear(x.movedim(0, -2).flatten(-2), weight, bias).contiguous()
    except RuntimeError:
        check_forward_args(x, weight, bias)
        raise


def gather_concat_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(torch.cat(x.unbind(0), -1), weight, bias)`` without materialising the concat.

    x: (R, *batch, H) with one or two batch dims, last dim contiguous (other strides free);
    weight: (K, R*H); bias: (K,) or None. Returns a contiguous (*batch, K) tensor of x's dtype.

    Same as ``torch.ops.vga.gather_concat_linear``, with the eager call overhead cut. Plain
    CPU tensors with nothing for autograd to record, outside tracing and dispatch modes, go
    straight to the CPU computation (the dispatcher's round trip into a Python kernel costs
    more than a small shape's cat + F.linear). Otherwise, when autograd has nothing to record,
    the op is called below the autograd key, skipping the Python autograd kernel that
    ``register_autograd`` installs (about half of the eager call overhead of a small shape);
    when it has, plain tensors outside dispatch modes take the same backward through a plain
    ``torch.autograd.Function`` (``_EagerAutograd``). Tracing and transforms see the op itself.
    """
    if (
        type(x) is Tensor and x.is_cpu and type(weight) is Tensor
        and not _needs_grad(x, weight, bias)
        and not _is_compiling() and _dispatch_modes() == 0
    ):
        return _cpu_forward_direct(x, weight, bias)
    if _traced_or_transformed():
        return _forward_op(x, weight, bias)
    if not _needs_grad(x, weight, bias):
        with torch._C._AutoDispatchBelowAutograd():
            return _forward_op(x, weight, bias)
    if (_dispatch_modes() == 0 and type(x) is Tensor and type(weight) is Tensor
            and (bias is None or type(bias) is Tensor)):
        return _EagerAutograd.apply(x, weight, bias)
    return _forward_op(x, weight, bias)
