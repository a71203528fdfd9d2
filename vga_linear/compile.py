"""Opt-in torch.compile rewrite: ``linear(concat of shards)`` -> ``torch.ops.vga.gather_concat_linear``.

After :func:`enable` (or inside :func:`enabled`, or with ``torch.compile(model,
options=vga_linear.compile.options())``), torch.compile with the Inductor backend replaces,
with no change to the model's code:

- ``F.linear(torch.cat([x[0], ..., x[R-1]], -1), W, b)`` and ``torch.cat(x.unbind(0), -1)``
  (also ``x.select(0, i)``) followed by a linear, 2-D or 3-D activations, bias or not;
- the attention output projection ``F.linear(attn.transpose(1, 2).reshape(b, s, h * d), W, b)``
  and its ``permute(...).reshape(...)``, ``.contiguous().view(...)``, ``.flatten(2)`` and
  ``reshape(b * s, -1)`` variants, with the linear written as ``F.linear`` / ``nn.Linear`` /
  ``torch.mm`` / ``torch.addmm`` / ``torch.matmul`` / ``@`` against ``W.t()`` (``.T``,
  ``transpose(0, 1)``, ``permute(1, 0)``);

by ``torch.ops.vga.gather_concat_linear`` on a view of the input (no copy), so both the
forward and (the op has registered autograd) the backward use the op's kernels.

Where it runs: as Inductor's ``pre_grad_custom_pass``, on Dynamo's graph before AOT autograd
traces it, which is what lets training use the op's backward (a post-grad pass would see the
backward already written as aten mm). The pass is a ``CustomGraphPass`` whose ``uuid()``
hashes this file, the package version and the pass's options, so the FX graph and AOT autograd
caches keep working and are never reused across a change of either.

What it rewrites: only where the concatenation would be materialised (a ``cat``, or a
reshape/contiguous that copies; a reshape that is already a view of contiguous rows is left to
cuBLAS) and the op is expected to win: CUDA tensors of float16/bfloat16/float32, one dtype and
device for x, weight and bias, x rows of ``H * itemsize % 16 == 0`` bytes with 16-byte aligned
strides and offset, weight rows contiguous and 16-byte aligned, one or two batch dims, R and H
known at compile time (batch sizes may be dynamic), not under autocast. It leaves the pattern
alone when the concatenated tensor (or a copy in the chain) has other users.
``torch._dynamo.utils.counters["vga_linear"]`` counts rewrites and reasons for declining.

These hooks are private torch API: the pass is tested on torch 2.11 and 2.14
(:data:`TESTED_TORCH`). On other versions :func:`enable` warns once and does nothing, unless
the environment sets ``VGA_LINEAR_COMPILE_ANY_TORCH=1``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import operator
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import fx

__all__ = [
    "TESTED_TORCH",
    "GatherConcatLinearPass",
    "disable",
    "enable",
    "enabled",
    "is_enabled",
    "options",
    "supported",
]

log = logging.getLogger(__name__)

# (major, minor) of the first and last torch versions the hooks are tested on.
TESTED_TORCH = ((2, 11), (2, 14))
DEFAULT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DEFAULT_DEVICES = ("cuda",)
_ALIGN_BYTES = 16

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def supported() -> str | None:
    """None when this torch has the hooks the rewrite was tested with, else why not."""
    version = _torch_version()
    lo, hi = TESTED_TORCH
    if not lo <= version <= hi and os.environ.get("VGA_LINEAR_COMPILE_ANY_TORCH") != "1":
        return (
            f"torch {torch.__version__} is outside the tested range "
            f"{lo[0]}.{lo[1]}-{hi[0]}.{hi[1]} (set VGA_LINEAR_COMPILE_ANY_TORCH=1 to try anyway)"
        )
    try:
        import torch._inductor.config as inductor_config
        from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (pragma: no cover - depends on the torch build)
        return f"torch._inductor is unavailable ({type(exc).__name__}: {exc})"
    if not hasattr(inductor_config, "pre_grad_custom_pass"):  # pragma: no cover
        return "torch._inductor.config has no pre_grad_custom_pass"
    return None


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _PassBase
except Exception:  # noqa: BLE001  (pragma: no cover - torch without Inductor: the pass is a plain callable)

    class _PassBase:  # type: ignore[no-redef]
        pass


# --------------------------------------------------------------------------------------------
# Shapes, strides and values of graph nodes (symbolic-shape safe: only what is known for sure).


def _val(node: Any) -> torch.Tensor | None:
    """The fake tensor a node produces (Dynamo: example_value; aten graphs: val)."""
    if not isinstance(node, fx.Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    if v is None and node.op == "get_attr" and node.graph.owning_module is not None:
        try:  # a parameter or constant held by the graph module (real, so only metadata is read)
            v = operator.attrgetter(node.target)(node.graph.owning_module)
        except AttributeError:
            v = None
    return v if isinstance(v, torch.Tensor) else None


def _known(cond: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    try:
        return bool(statically_known_true(cond))
    except Exception:  # noqa: BLE001
        return False


def _known_eq(a: Any, b: Any) -> bool:
    return _known(a == b)


def _static_int(v: Any) -> int | None:
    if isinstance(v, int):
        return v
    if isinstance(v, torch.SymInt):
        as_int = v.node.maybe_as_int()
        if as_int is not None:
            return int(as_int)
        try:  # a symbol the shape env has since solved (e.g. 4 * s0 == 32 gives s0 = 8)
            expr = v.node.shape_env.replace(v.node.expr)
            if expr.is_number:
                return int(expr)
        except Exception:  # noqa: BLE001, S110
            pass
    return None


def _aligned(v: Any, itemsize: int) -> bool:
    return _known((v * itemsize) % _ALIGN_BYTES == 0)


def _storage_id(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001
        return None


# --------------------------------------------------------------------------------------------
# Which nodes are which op, in Dynamo's torch-level graph (aten spellings accepted too).

_aten = torch.ops.aten


def _targets(*names: str) -> frozenset:
    out = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(_aten, packet, None)
        if op is not None and hasattr(op, overload or "default"):
            out.append(getattr(op, overload or "default"))
            if not overload:
                out.append(op)  # Dynamo's graph may call the packet (e.g. aten.numpy_T for .T)
    return frozenset(out)


_LINEAR_FNS = frozenset({torch._C._nn.linear, torch.nn.functional.linear}) | _targets("linear")
_MM_FNS = frozenset({torch.mm, torch.matmul, operator.matmul}) | _targets("mm", "matmul")
_MM_METHODS = frozenset({"mm", "matmul", "__matmul__"})
_MM_2D = frozenset({torch.mm, "mm"}) | _targets("mm")
_ADDMM_FNS = frozenset({torch.addmm}) | _targets("addmm")
_CAT_FNS = frozenset({torch.cat, torch.concat, torch.concatenate}) | _targets("cat")
_UNBIND_FNS = frozenset({torch.unbind}) | _targets("unbind.int")
_SELECT_FNS = frozenset({torch.select}) | _targets("select.int")
_RESHAPE_FNS = frozenset({torch.reshape}) | _targets("reshape", "view", "_unsafe_view")
_RESHAPE_METHODS = frozenset({"reshape", "view"})
_FLATTEN_FNS = frozenset({torch.flatten})
_T_FNS = frozenset({torch.t}) | _targets("t", "numpy_T")
_T_METHODS = frozenset({"t"})
_TRANSPOSE_FNS = frozenset({torch.transpose}) | _targets("transpose.int")
_PERMUTE_FNS = frozenset({torch.permute}) | _targets("permute")


def _is(node: Any, fns: frozenset = frozenset(), methods: frozenset | set = frozenset()) -> bool:
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return node.target in fns
    if node.op == "call_method":
        return node.target in methods
    return False


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` of a call (for call_method, index 0 is self) or keyword ``name``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _method_or_fn_args(node: fx.Node) -> tuple:
    """The positional args after self, for ``t.op(*a)`` and ``torch.op(t, *a)`` alike."""
    return tuple(node.args[1:])


def _dims_arg(node: fx.Node) -> tuple | None:
    rest = _method_or_fn_args(node)
    if not rest:
        rest = tuple(v for k, v in node.kwargs.items() if k in ("dims", "dim0", "dim1"))
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        rest = tuple(rest[0])
    return rest if all(isinstance(d, int) for d in rest) else None


def _weight_of_transposed(node: Any) -> fx.Node | None:
    """W when node is W.t() / W.T / W.transpose(0, 1) / W.permute(1, 0) of a 2-D W, else None."""
    if not isinstance(node, fx.Node) or not node.args:
        return None
    src = node.args[0]
    sv = _val(src)
    if sv is None or sv.dim() != 2:
        return None
    if _is(node, _T_FNS, _T_METHODS):
        return src
    if node.op == "call_function" and node.target is getattr and node.args[1:] in (("T",), ("mT",)):
        return src  # torch 2.11 records W.T as getattr(W, "T")
    if _is(node, _TRANSPOSE_FNS, {"transpose", "swapaxes", "swapdims"}):
        dims = _dims_arg(node)
        if dims is not None and len(dims) == 2 and {d % 2 for d in dims} == {0, 1}:
            return src
    if _is(node, _PERMUTE_FNS, {"permute"}):
        dims = _dims_arg(node)
        if dims is not None and [d % 2 for d in dims] == [1, 0]:
            return src
    return None


def _match_linear(node: fx.Node) -> tuple[Any, Any, Any, str] | None:
    """(activation, weight (K, N), bias or None, form) when node computes a linear layer."""
    if _is(node, _LINEAR_FNS):
        a, w, b = _arg(node, 0, "input"), _arg(node, 1, "weight"), _arg(node, 2, "bias")
        wv = _val(w)
        if wv is None or wv.dim() != 2:
            return None
        return a, w, b, "linear"
    if _is(node, _MM_FNS, _MM_METHODS):
        if node.kwargs or len(node.args) != 2:
            return None
        a, bt = node.args
        av = _val(a)
        w = _weight_of_transposed(bt)
        if w is None or av is None or av.dim() < 2:
            return None
        if node.target in _MM_2D and av.dim() != 2:
            return None
        return a, w, None, "mm"
    if _is(node, _ADDMM_FNS):
        if any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or len(node.args) != 3:
            return None
        if set(node.kwargs) - {"beta", "alpha"}:
            return None
        b, a, bt = node.args
        w = _weight_of_transposed(bt)
        bv = _val(b)
        if w is None or bv is None or bv.dim() != 1:
            return None
        return a, w, b, "addmm"
    return None


def _may_mutate(node: fx.Node) -> bool:
    """Conservative: an in-place method or function, an out= call, a mutable aten op, a module."""
    if node.op == "call_module":
        return True
    if node.op not in ("call_function", "call_method"):
        return False
    if "out" in node.kwargs:
        return True
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return True
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return bool(schema.is_mutable)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return any(getattr(target, o)._schema.is_mutable for o in target.overloads())
    return target is operator.setitem


def _is_contiguous_call(node: Any) -> bool:
    if _is(node, frozenset(), {"contiguous"}):
        fmt = _arg(node, 1, "memory_format", torch.contiguous_format)
        return fmt is torch.contiguous_format
    if _is(node, _targets("clone")):
        return node.kwargs.get("memory_format") is torch.contiguous_format
    return False


def _is_reshape_like(node: Any) -> bool:
    return _is(node, _RESHAPE_FNS | _FLATTEN_FNS, _RESHAPE_METHODS | {"flatten"})


# --------------------------------------------------------------------------------------------
# The match: what the linear's activation is a gather of.


class _Decline(Exception):
    """The structure matched but a guard failed; the message is the reason."""


class _Match:
    def __init__(self, linear: fx.Node, form: str, weight: fx.Node, bias: Any):
        self.linear = linear
        self.form = form
        self.weight = weight
        self.bias = bias
        self.source: fx.Node | None = None  # the node x is a view of
        self.kind = ""  # "cat": x = source[:R]; "reshape": x = source.movedim(-2, 0)
        self.R = 0
        self.H = 0
        self.x_shape: tuple = ()
        self.x_stride: tuple = ()
        self.x_offset: Any = 0
        self.narrow = False
        self.out_reshape: Any = None  # None, "flatten" or a shape: (*batch, K) -> the linear's
        self.dead: list[fx.Node] = []  # nodes to erase once unused, users first
        self.read_at: fx.Node | None = None  # where the original graph read the shards (a copy)


def _cat_shards(cat: fx.Node) -> tuple[fx.Node, int, list[fx.Node]] | None:
    """(X, R, nodes) when cat is ``torch.cat([X[0], ..., X[R-1]], -1)`` (getitem, select, unbind)."""
    tensors = _arg(cat, 0, "tensors")
    dim = _arg(cat, 1, "dim", 0)
    if not isinstance(tensors, (list, tuple)) or not tensors or not isinstance(dim, int):
        return None
    first = _val(tensors[0])
    if first is None or dim not in (-1, first.dim() - 1):
        return None
    source = None
    nodes: list[fx.Node] = []
    unbinds: list[fx.Node] = []
    for i, t in enumerate(tensors):
        if not isinstance(t, fx.Node):
            return None
        src = None
        if t.op == "call_function" and t.target is operator.getitem and len(t.args) == 2:
            base, index = t.args
            if index != i or not isinstance(base, fx.Node):
                return None
            if _is(base, _UNBIND_FNS, {"unbind"}):
                if _arg(base, 1, "dim", 0) != 0:
                    return None
                if base not in unbinds:
                    unbinds.append(base)
                src = base.args[0]
            elif _val(base) is not None:
                src = base
        elif _is(t, _SELECT_FNS, {"select"}):
            if _arg(t, 1, "dim") != 0 or _arg(t, 2, "index") != i:
                return None
            src = t.args[0]
        if src is None or (source is not None and src is not source):
            return None
        source = src
        nodes.append(t)
    if _val(source) is None or len(unbinds) > 1:
        return None
    return source, len(tensors), nodes + unbinds


def _analyse(linear: fx.Node, opts: GatherConcatLinearPass) -> _Match | None:
    """None when linear's activation is no gather; raises _Decline when a guard refuses it."""
    matched = _match_linear(linear)
    if matched is None:
        return None
    a, weight, bias, form = matched
    if not isinstance(a, fx.Node) or _val(a) is None:
        return None
    av = _val(a)
    m = _Match(linear, form, weight, bias)
    weight_t = linear.args[-1] if form in ("mm", "addmm") else None

    # Walk up the chain of reshapes/views/contiguous calls from the activation.
    chain: list[fx.Node] = []
    cur = a
    while _is_reshape_like(cur) or _is_contiguous_call(cur):
        chain.append(cur)
        cur = cur.args[0]
    # The candidates for the tensor whose shards are gathered, the farthest (most copies saved)
    # first: cur (a cat or any tensor), then each input along the chain.
    candidates = [(cur, len(chain))] + [(chain[k], k) for k in range(len(chain) - 1, 0, -1)]
    structural = None
    for source, depth in candidates:
        between = chain[:depth]  # the nodes from the activation up to (excluding) source
        if _is(source, _CAT_FNS):
            found = _cat_shards(source)
            if found is None:
                continue
            X, R, shard_nodes = found
            xv, cv = _val(X), _val(source)
            if cv is None or not _known_eq(av.shape[-1], cv.shape[-1]):
                continue
            structural = "cat"
            if any(len(n.users) != 1 for n in [*between, source]):
                raise _Decline("the concatenation has other users")
            m.kind, m.source, m.R, m.H = "cat", X, R, xv.shape[-1]
            m.narrow = not _known_eq(xv.shape[0], R)
            m.x_shape = (R, *xv.shape[1:])
            m.x_stride = tuple(xv.stride())
            m.x_offset = xv.storage_offset()
            m.dead = [*between, source, *shard_nodes]
            m.read_at = source
            break
        if not between:
            continue
        pv = _val(source)
        if pv is None or pv.dim() < 3:
            continue
        R, H = pv.shape[-2], pv.shape[-1]
        if not _known_eq(av.shape[-1], R * H):
            continue
        structural = "reshape"
        if any(len(n.users) != 1 for n in between):
            raise _Decline("the concatenated tensor has other users")
        if opts.require_copy and _storage_id(pv) is not None and _storage_id(pv) == _storage_id(av):
            # The reshape is a view: nothing is materialised; cuBLAS on the rows wins.
            raise _Decline("no copy to save (the reshape is already a view)")
        m.kind, m.source, m.R, m.H = "reshape", source, R, H
        stride = pv.stride()
        m.x_shape = (R, *pv.shape[:-2], H)
        m.x_stride = (stride[-2], *stride[:-2], stride[-1])
        m.x_offset = pv.storage_offset()
        m.dead = list(between)
        m.read_at = between[-1]
        break
    if structural is None:
        return None
    if weight_t is not None:
        m.dead.append(weight_t)
    # The op reads the shards where the linear was, not where the copy was made: nothing in
    # between may write to memory (Dynamo's graph is not functional).
    node = m.read_at.next
    while node is not linear:
        if _may_mutate(node):
            raise _Decline(f"{node.format_node()} may write to the shards before the linear")
        node = node.next
    _check_guards(m, av, opts)
    return m


def _check_guards(m: _Match, av: torch.Tensor, opts: GatherConcatLinearPass) -> None:
    xv = _val(m.source)
    wv = _val(m.weight)
    bv = _val(m.bias) if m.bias is not None else None
    if m.bias is not None and bv is None:
        raise _Decline("the bias is not a tensor")
    if xv.device.type not in opts.devices:
        raise _Decline(f"device {xv.device.type}")
    if xv.dtype not in opts.dtypes:
        raise _Decline(f"dtype {str(xv.dtype).removeprefix('torch.')}")
    for name, t in (("weight", wv), ("bias", bv)):
        if t is not None and (t.dtype != xv.dtype or t.device != xv.device):
            raise _Decline(f"{name} has another dtype or device than x")
    R, H = _static_int(m.R), _static_int(m.H)
    if R is None or H is None:
        raise _Decline("R or H is not known at compile time")
    if R < 1 or H < 1:
        raise _Decline("empty shards")
    batch_dims = len(m.x_shape) - 2
    if batch_dims not in (1, 2):
        raise _Decline(f"{batch_dims} batch dims (the op takes 1 or 2)")
    if wv.dim() != 2 or not _known_eq(wv.shape[1], R * H):
        raise _Decline("weight shape")
    if bv is not None and (bv.dim() != 1 or not _known_eq(bv.shape[0], wv.shape[0])):
        raise _Decline("bias shape")
    item = xv.element_size()
    if not _known_eq(m.x_stride[-1], 1):
        raise _Decline("x's last dim is not contiguous")
    if not _aligned(H, item):
        raise _Decline(f"misaligned: H * itemsize = {H * item} bytes is not a multiple of 16")
    if not all(_aligned(s, item) for s in m.x_stride[:-1]) or not _aligned(m.x_offset, item):
        raise _Decline("misaligned: x's strides or offset are not multiples of 16 bytes")
    if not _known_eq(wv.stride(1), 1) or not _aligned(wv.stride(0), item):
        raise _Decline("misaligned: weight rows are not contiguous 16-byte aligned rows")
    if not _aligned(wv.storage_offset(), item):
        raise _Decline("misaligned: weight offset")
    lv = _val(m.linear)
    if lv is None or lv.dtype != xv.dtype:
        raise _Decline("the linear's output dtype differs (autocast?)")
    out_batch = m.x_shape[1:-1]
    lin_batch = tuple(lv.shape[:-1])
    if len(out_batch) == len(lin_batch) and all(map(_known_eq, out_batch, lin_batch)):
        m.out_reshape = None
    elif len(lin_batch) == 1:
        m.out_reshape = "flatten"
    elif all(isinstance(d, int) for d in lin_batch):
        m.out_reshape = (*lin_batch, -1)
    else:
        raise _Decline("the output's batch dims cannot be rebuilt")


# --------------------------------------------------------------------------------------------
# The rewrite.


def _fake_mode(graph: fx.Graph):
    from torch._guards import detect_fake_mode

    vals = [v for n in graph.nodes if (v := _val(n)) is not None]
    try:
        return detect_fake_mode(vals)
    except Exception:  # noqa: BLE001
        return None


def _new(graph: fx.Graph, fake_mode, target, args: tuple, like: fx.Node) -> fx.Node:
    node = graph.call_function(target, args)
    node.meta["stack_trace"] = like.meta.get("stack_trace")
    if "nn_module_stack" in like.meta:
        node.meta["nn_module_stack"] = like.meta["nn_module_stack"]
    if fake_mode is not None:
        try:
            fargs = tuple(_val(a) if isinstance(a, fx.Node) else a for a in args)
            with fake_mode:
                node.meta["example_value"] = target(*fargs)
        except Exception:  # noqa: BLE001, S110  (metadata only; AOT autograd traces the graph again)
            pass
    return node


def _apply(graph: fx.Graph, m: _Match, fake_mode) -> None:
    linear = m.linear
    with graph.inserting_before(linear):
        x = m.source
        if m.kind == "cat":
            if m.narrow:
                x = _new(graph, fake_mode, torch.narrow, (x, 0, 0, m.R), linear)
        else:
            x = _new(graph, fake_mode, torch.movedim, (x, -2, 0), linear)
        op = torch.ops.vga.gather_concat_linear.default
        out = _new(graph, fake_mode, op, (x, m.weight, m.bias), linear)
        if m.out_reshape == "flatten":
            out = _new(graph, fake_mode, torch.flatten, (out, 0, -2), linear)
        elif m.out_reshape is not None:
            out = _new(graph, fake_mode, torch.reshape, (out, m.out_reshape), linear)
    linear.replace_all_uses_with(out)
    graph.erase_node(linear)
    for node in m.dead:
        if not node.users:
            graph.erase_node(node)


def _autocast_regions(graph: fx.Graph) -> set[fx.Node]:
    """Nodes that run under an autocast context entered inside the graph."""
    inside: set[fx.Node] = set()
    depth = 0
    for node in graph.nodes:
        name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
        if name == "_enter_autocast":
            depth += 1
        elif name == "_exit_autocast":
            depth = max(depth - 1, 0)
        elif depth:
            inside.add(node)
    return inside


def _autocast_active() -> bool:
    try:
        return bool(torch._C._is_any_autocast_enabled())
    except Exception:  # noqa: BLE001  (pragma: no cover)
        return any(torch.is_autocast_enabled(d) for d in ("cuda", "cpu"))


def rewrite(graph: fx.Graph, pass_: GatherConcatLinearPass | None = None) -> int:
    """Rewrite every accepted gather + linear in graph; returns how many were rewritten."""
    from torch._dynamo.utils import counters

    opts = pass_ if pass_ is not None else GatherConcatLinearPass()
    stats = counters["vga_linear"]
    global_autocast = _autocast_active()
    under_autocast = _autocast_regions(graph)
    fake_mode = None
    rewritten = 0
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method"):
            continue
        try:
            m = _analyse(node, opts)
            if m is not None and (global_autocast or node in under_autocast):
                raise _Decline("under autocast")
        except _Decline as why:
            stats[f"declined: {why}"] += 1
            log.debug("vga_linear.compile: declined %s: %s", node.format_node(), why)
            continue
        except Exception as exc:  # noqa: BLE001  (a graph shape this pass did not foresee: leave it alone)
            stats["declined: internal error"] += 1
            _warn_once(
                f"internal:{type(exc).__name__}",
                f"vga_linear.compile: skipped a candidate after {type(exc).__name__}: {exc}",
            )
            continue
        if m is None:
            continue
        if fake_mode is None:
            fake_mode = _fake_mode(graph)
        _apply(graph, m, fake_mode)
        stats["rewritten"] += 1
        stats[f"rewritten: {m.kind}+{m.form}"] += 1
        rewritten += 1
    if rewritten:
        graph.lint()
        log.info("vga_linear.compile: rewrote %d linear(s) to vga.gather_concat_linear", rewritten)
    return rewritten


# --------------------------------------------------------------------------------------------
# The pass object and how to switch it on.


@functools.lru_cache(None)
def _source_hash() -> str:
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class GatherConcatLinearPass(_PassBase):
    """Inductor ``pre_grad_custom_pass`` that rewrites gather + linear into the vga op.

    devices: device types to rewrite on (default CUDA only; "cpu" exists for tests: the op's
    CPU kernel is the reference, which materialises the concatenation itself).
    dtypes: activation dtypes to rewrite (default float16, bfloat16, float32).
    require_copy: rewrite a reshape/contiguous gather only where it copies (default). Where it
    is already a view of contiguous rows (e.g. flash/efficient SDPA outputs, laid out
    (b, s, heads, d), then transpose(1, 2)), cuBLAS reads the same rows and the op has no copy
    to save; False rewrites those too.
    """

    def __init__(
        self,
        devices: Sequence[str] = DEFAULT_DEVICES,
        dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES,
        require_copy: bool = True,
    ):
        self.devices = tuple(devices)
        self.dtypes = tuple(dtypes)
        self.require_copy = bool(require_copy)

    def __call__(self, graph: fx.Graph) -> None:
        rewrite(graph, self)

    def uuid(self) -> str:
        from . import __version__

        options = (
            f"devices={sorted(self.devices)};dtypes={sorted(map(str, self.dtypes))};"
            f"require_copy={self.require_copy}"
        )
        key = f"vga_linear {__version__};{_source_hash()};{options}"
        return hashlib.sha256(key.encode()).hexdigest()

    def __repr__(self) -> str:
        return (
            f"GatherConcatLinearPass(devices={self.devices}, dtypes={self.dtypes}, "
            f"require_copy={self.require_copy})"
        )


class _Chained(_PassBase):
    """Two pre-grad passes in one slot (torch 2.11's config takes a single callable)."""

    def __init__(self, first, second):
        self.passes = (first, second)

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> Any:
        ids = tuple(p.uuid() if hasattr(p, "uuid") else None for p in self.passes)
        return None if None in ids else hashlib.sha256(repr(ids).encode()).hexdigest()


def _contains_ours(p: Any) -> bool:
    if isinstance(p, GatherConcatLinearPass):
        return True
    if isinstance(p, _Chained):
        return any(map(_contains_ours, p.passes))
    if isinstance(p, (list, tuple)):
        return any(map(_contains_ours, p))
    return False


def _without_ours(p: Any) -> Any:
    if isinstance(p, GatherConcatLinearPass):
        return None
    if isinstance(p, _Chained):
        rest = [q for q in (_without_ours(q) for q in p.passes) if q is not None]
        return None if not rest else rest[0] if len(rest) == 1 else _Chained(*rest)
    if isinstance(p, (list, tuple)):
        rest = [q for q in (_without_ours(q) for q in p) if q is not None]
        return type(p)(rest) if rest else None
    return p


def _with_ours(current: Any, ours: GatherConcatLinearPass) -> Any:
    current = _without_ours(current)
    if current is None:
        return ours
    if isinstance(current, (list, tuple)):
        return type(current)([*current, ours])
    return _Chained(current, ours)


def _usable(warn: bool = True) -> bool:
    why = supported()
    if why is not None and warn:
        _warn_once("unsupported", f"vga_linear.compile: the rewrite is off: {why}")
    return why is None


def enable(**pass_options: Any) -> bool:
    """Install the rewrite as Inductor's pre-grad pass (process-wide, added to any pass already
    there; pass_options go to :class:`GatherConcatLinearPass`). Graphs compiled afterwards
    are rewritten; returns False (after one warning) when this torch is outside the tested
    range."""
    if not _usable():
        return False
    import torch._inductor.config as inductor_config

    inductor_config.pre_grad_custom_pass = _with_ours(
        inductor_config.pre_grad_custom_pass, GatherConcatLinearPass(**pass_options)
    )
    return True


def disable() -> None:
    """Remove the rewrite from Inductor's pre-grad pass (other passes stay)."""
    try:
        import torch._inductor.config as inductor_config
    except Exception:  # noqa: BLE001  (pragma: no cover)
        return
    if hasattr(inductor_config, "pre_grad_custom_pass"):
        inductor_config.pre_grad_custom_pass = _without_ours(inductor_config.pre_grad_custom_pass)


def is_enabled() -> bool:
    try:
        import torch._inductor.config as inductor_config
    except Exception:  # noqa: BLE001  (pragma: no cover)
        return False
    return _contains_ours(getattr(inductor_config, "pre_grad_custom_pass", None))


@contextlib.contextmanager
def enabled(**pass_options: Any) -> Iterator[None]:
    """Context manager: the rewrite is on for graphs compiled inside (torch.compile compiles on
    the first call, so call the compiled model inside the block)."""
    if not _usable():
        yield
        return
    import torch._inductor.config as inductor_config

    ours = GatherConcatLinearPass(**pass_options)
    with inductor_config.patch(
        pre_grad_custom_pass=_with_ours(inductor_config.pre_grad_custom_pass, ours)
    ):
        yield


def options(**pass_options: Any) -> dict[str, Any]:
    """Inductor options for one compile: ``torch.compile(model, options=options())``. Empty
    (after one warning) when this torch is outside the tested range."""
    if not _usable():
        return {}
    import torch._inductor.config as inductor_config

    return {
        "pre_grad_custom_pass": _with_ours(
            inductor_config.pre_grad_custom_pass, GatherConcatLinearPass(**pass_options)
        )
    }
