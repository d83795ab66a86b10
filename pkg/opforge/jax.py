"""opforge's ops as JAX operations: XLA FFI custom calls, with autodiff, jit and vmap from the spec.

::

    import jax, jax.numpy as jnp
    import opforge.jax as oj

    x = jnp.linspace(-1.0, 1.0, 8)
    y = oj.ops.leaky_relu(oj.ops.mul(x, x), alpha=0.2)         # jax.Array in, jax.Array out
    g = jax.jit(jax.grad(lambda x: oj.ops.sum(oj.ops.tanh(x))))(x)

- ``ops.<name>(*inputs, **attrs)`` is the op on ``jax.Array``s (NumPy arrays as JAX takes them;
  a Python number weakly typed, as JAX takes it: of the dtype of an array input of its type
  variable, ``mul(x, 2.0)`` keeping x's bfloat16, checked as opforge's own API checks numbers;
  anything else is a TypeError naming the op). Inputs are positional or by name, attrs by name or
  after the inputs; attrs are static (a new value compiles the call again, a repeated one does
  not; floats by their bits, so -0.0 is not 0.0).
- Each op is a JAX primitive whose lowering is a custom call of the XLA FFI target ``opforge``
  (one handler for every op, ``include/jax_native/jax_native.cpp``): XLA hands it its buffers and
  the handler runs the op's opforge kernel on them, the results written straight into XLA's
  result buffers (no copies). The handler is compiled on first use against the installed
  jaxlib's FFI headers and cached (``opforge/_jax_native.py``); it is a C ABI and links no part of
  jaxlib.
- Shapes and dtypes come from the op's own meta rule at trace time, so a bad call raises the
  same TypeError/ValueError as an eager opforge call, naming the op, before anything runs;
  errors only the kernel can see (an index out of range) raise ``JaxRuntimeError`` with the op's
  message when the computation runs.
- Reverse mode (``jax.grad``, ``jax.vjp``, ``jax.value_and_grad``, and gradients of gradients)
  runs the spec's ``bprop``; forward mode (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``) runs the
  spec's ``jvp``. Both formulas are evaluated with these same ops. The mechanism is a primitive
  per op plus a second primitive for its tangent map, linear in the tangents: the tangent map's
  evaluation is the ``jvp`` formula and its transpose (what reverse mode runs) is the ``bprop``
  formula. ``jax.custom_vjp`` would rule out forward mode, and ``jax.custom_jvp`` needs tangent
  rules JAX can transpose, which a custom call is not. An op whose spec has a bprop but no jvp
  works in reverse mode and raises NotImplementedError naming it in forward mode.
- ``jax.vmap`` batches in one call where the shape rule allows it: elementwise ops (batch axes
  moved first and padded so broadcasting lines up), ops whose axis attrs index the batched inputs
  (axes shifted past the batch axis), matmul-like batch broadcasting, and an op's spec'd
  ``batch_inputs``; any other op runs once per batch element (``jax.lax.map``) and the results are
  stacked.
- Sharded programs: a call whose leading dims are independent rows (the same rule from the
  spec: elementwise ops, ops whose axis attrs index every present input, before the first axis
  named, batched matmul) says so to XLA (the ``num_batch_dims`` attribute of a target registered
  as batch partitionable, and Shardy's sharding rule), so XLA's partitioner runs it on each
  device's rows; an elementwise call, in a program over several devices, runs on each device's
  block of its results, whichever dims are split (lowered with a trailing unit dim, every dim of
  the results a batch dim; an operand broadcast along dims, a bias, broadcast first: see
  _Op._lower_elementwise). Under a mesh of explicit axes the
  results' types carry the rows' sharding (an elementwise call's as jax.numpy's, on every dim),
  and a call with an operand without rows (linear's weight, layer_norm's, matmul's b) runs in
  ``jax.shard_map`` on each device's rows, the rows by vmap's rules (``_Op.rows_split``; not an op
  that checks index values, such as embedding); under automatic axes such a call runs on gathered
  operands, correct but not split. Inside ``jax.shard_map``
  every op runs on its shard, results varying over the manual axes their operands vary over (an
  invariant operand is cast to varying first, as JAX's own ops do): the way to split a
  data-parallel step through linear and the norms. An op that checks index values, split by XLA's
  partitioner, defers its error: every device fails at the call's check, none is left waiting for
  another (see _lower_agreed). Inside shard_map (and pmap) such a call's status is all-reduced over
  the manual axes too (a scalar all-reduce per call; XLA combines independent ones), so a
  bad index on one device's shard raises the op's error on every device, where the call is traced
  in code every device runs: the body itself, a scan's body, vmap, grad, jvp, remat. Under control
  flow that may differ between devices (cond, switch, while_loop, fori_loop), in a jit of the
  user's or a custom_vjp/custom_jvp function (traced apart from their callers, their programs
  cached), a collective could leave devices waiting on valid inputs: there a call's error stays its
  device's, as before (see _in_lockstep).
- ``register_module(m)`` does the same for an op module (``opforge.load``'s result, a package's
  ``<pkg>._ops``).
- ``export(jax.jit(f))(*args)`` is ``jax.export.export`` with the ``opforge`` target allowed
  (JAX refuses custom calls outside its own list unless told). Each call names its op (``mul``;
  ``<module>.<op>`` for a module's op) and a digest of the op's inputs, attrs and outputs, so a
  deserialized program runs in another process wherever ``import opforge.jax`` (and, for a
  module's ops, ``register_module``) has registered the same ops; an op missing there, or of
  another interface, fails the call naming it. Shapes may be symbolic (jax.export's shape
  polymorphism): the results' shapes come from the spec's shape rules on the dim variables and
  the meta rule checks the call at a stand-in size per variable. The target has no compatibility
  guarantee of JAX's: the program is as stable as the ops' specs.

With 64-bit types off (JAX's default) JAX gives float32 and int32 where NumPy would give float64
and int64; ``jax.config.update("jax_enable_x64", True)`` gives the 64-bit rows. JAX arrays are
immutable: ops have no in-place variants or ``out=`` here (XLA reuses buffers itself).

JAX 0.10 needs NumPy 2 and MindSpore 2.10 NumPy 1, so the two live in separate environments:
``pip install "opforge[jax]"``.
"""

from __future__ import annotations

import functools
import hashlib
import math
import operator
import re
import threading
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    from jax import export as jax_export
    from jax.extend.core import Primitive
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo as hlo
    from jax.interpreters import ad, batching, mlir, xla
    # JAX's own names, not its public API (pinned jax==0.10.2; the tests fail loudly if they move):
    # the registration functions jax.ffi itself goes through (see below); the manual-axes type of
    # values inside shard_map and the current mesh's sharding (what jax.ffi.ffi_call's abstract
    # evaluation uses); Shardy's sharding-rule builder (jax.experimental.custom_partitioning's);
    # the lowering of a broadcast; the lowering of an all-reduce over manual axes (lax.pmax's)
    from jax._src import core as _core
    from jax._src import custom_partitioning_sharding_rule as _sdy_rule
    from jax._src import lib as _jax_lib
    from jax._src import xla_bridge as _xla_bridge
    from jax._src.interpreters import mlir as _mlir_impl
    from jax._src.lax import parallel as _parallel
except ImportError as e:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        'opforge.jax needs JAX: pip install "opforge[jax]" (jax==0.10.2, which needs numpy>=2; MindSpore 2.10 '
        f"needs numpy<2, so keep them in separate environments) (import failed: {e})") from e

import opforge._C as _C
from opforge import _formulas, _jax_native
from opforge._opdef import AttrDef, OpDef, ShapeHelpers, kind_shape
from opforge._opdef import AttrFloat as _Float
from opforge._opdef import canonical_attr as _canonical
from opforge._opdef import check_number, plain_attr
from opforge._opdef import axes as axes_of

__all__ = ["ops", "register_module", "export", "OpSet", "TARGET", "H"]

#: The XLA FFI target every op lowers to (the handler of include/jax_native/jax_native.cpp).
TARGET = "opforge"

_DTYPES = {name: np.dtype(name) for name in (
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")}
_DTYPES["bfloat16"] = np.dtype(jnp.bfloat16)
_NAMES = {d: name for name, d in _DTYPES.items()}

_handler = _jax_native.load()


def _register(platform: str, xla_platform: str) -> None:
    """The handler as the target for a platform, after the type of its calls' state (each call's
    attributes are decoded once, when XLA instantiates it)."""
    jax.ffi.register_ffi_type(f"{TARGET}.call_state", _handler.state_type(), platform=xla_platform)
    jax.ffi.register_ffi_target(TARGET, _handler.handler(platform), platform=xla_platform)


# XLA takes a handler only after the types it uses. JAX queues what is registered before a
# platform's client exists and, making the client, hands it the queued handlers before the queued
# types, which XLA refuses. So the type goes first, through the platform's own registration: the
# CPU's (the function jaxlib's make_cpu_client installs, installed here beforehand: no client is
# started, so JAX_PLATFORMS, XLA_FLAGS or jax.distributed.initialize() set after this import still
# apply), a plugin's (CUDA: JAX calls back once its plugins are set up, their functions installed).
_jax_lib.xla_client.register_custom_type_handler("cpu", _jax_lib._jax.register_custom_type)
_register("cpu", "cpu")
_PLATFORMS = ["cpu"]
if "cuda" in _formulas.BUILT_TARGETS:  # (the cu130 wheel: XLA's CUDA buffers and stream; needs jax's CUDA plugin)
    _cuda_registered: list[bool] = []

    def _register_cuda(c_api: Any = None) -> None:
        if not _cuda_registered:
            _cuda_registered.append(True)
            _register("cuda", "CUDA")

    _xla_bridge.register_plugin_callbacks(_register_cuda)
    _PLATFORMS.append("cuda")
_lower = jax.ffi.ffi_lowering(TARGET)
# (a call whose leading dims are independent rows says how many (the "num_batch_dims" frontend
# attribute, and Shardy's sharding rule): XLA's SPMD partitioner then runs it on each device's
# rows instead of gathering its operands; see _Op.batch_dims)
jax.ffi.register_ffi_target_as_batch_partitionable(TARGET)


def _stand_in_envs(op: str, shapes: Sequence[Sequence[Any]]) -> list[dict[str, int]]:
    """Two sets of values for the dim variables of symbolic shapes (jax.export's shape
    polymorphism), each distinct, large and within the variables' constraints, for the meta
    rule's checks and dtypes: a call valid at one and not the other relates a variable to a
    constant. [] for concrete shapes."""
    variables: dict[str, Any] = {}
    for shape in shapes:
        for d in shape:
            if not isinstance(d, (int, np.integer)):
                for v in d._get_vars():
                    variables.setdefault(v, d.scope)
    if not variables:
        return []
    bounds = {v: _bounds(jax.export.symbolic_shape(v, scope=scope)[0]) for v, scope in variables.items()}
    names = sorted(variables)
    envs = []
    for base, step in ((1009, 4), (1201, 6)):
        # the variables in their names' order, else in the reverse one (constraints relating two
        # variables, b >= c + 1, ask for one of them the larger: the names' order alone refused
        # such a program by how its variables were named)
        for order in (names, names[::-1]):
            env = {v: int(min(max(base + step * k, bounds[v][0]), bounds[v][1])) for k, v in enumerate(order)}
            if all(n >= 1 for shape in shapes for n in _at(shape, env)):
                envs.append(env)
                break
        else:
            raise NotImplementedError(
                f"[{op}] no sizes of {', '.join(variables)} within their constraints give the shapes "
                f"{', '.join(str(tuple(s)) for s in shapes)} sizes of at least 1 to check the call at; export with "
                "concrete shapes")
    return envs


def _bounds(var: Any) -> tuple[float, float]:
    """A dim variable's bounds under its scope's constraints ((1, inf) when JAX cannot say)."""
    try:
        from jax._src.export import shape_poly
        low, high = shape_poly._bounds_decision(var, shape_poly.BoundsPrecision.BEST)
        return max(low, 1), high
    except Exception:  # (JAX's private decision procedure moved: its default bounds)
        return 1, math.inf


def _at(shape: Sequence[Any], env: dict[str, int]) -> list[int]:
    """A shape's sizes, its symbolic ones at env's values."""
    return [int(d) if isinstance(d, (int, np.integer)) else int(d._evaluate(env)) for d in shape]


def _symbolic_shapes(op: OpDef, shapes: Sequence[Any], attrs: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The op's output shapes on symbolic input shapes (None for an absent input), from the spec's
    shape rules: same, broadcast, reduce, matmul and its shape expressions."""
    ins = {i.name: s for i, s in zip(op.inputs, shapes)}
    values = {a.name: _meta_value(v) for a, v in zip(op.attrs, attrs)}
    exprs = None
    out = []
    try:
        for k, o in enumerate(op.outputs):
            shape = kind_shape(o, {n: s for n, s in ins.items() if s is not None}, values, jax.lax.broadcast_shapes)
            if shape is None and o.shape == "expression" and op.shapes is not None:
                if exprs is None:
                    exprs = op.shapes(H, *(None if s is None else tuple(s) for s in shapes), *values.values())
                shape = list(exprs[k])
            if shape is None:
                raise NotImplementedError(f"[{op.name}] output '{o.name}' has a shape rule of C++ only ({o.shape})")
            out.append(tuple(shape))
    except (ValueError, TypeError, NotImplementedError, jax.errors.InconclusiveDimensionOperation) as e:
        if str(e).startswith(f"[{op.name}]") and not isinstance(e, jax.errors.InconclusiveDimensionOperation):
            raise
        raise NotImplementedError(f"[{op.name}] its shape rule cannot decide on the symbolic shapes "
                                  f"{', '.join(str(tuple(s)) for s in shapes if s is not None)}: {e}") from e
    return out


def _typed_like(g: Any, aval: Any) -> Any:
    """A cotangent the bprop formula computed, resharded to its tangent's type under a mesh of
    explicit axes (the formula's own ops, a broadcast say, need not keep a row-split type)."""
    want = getattr(aval, "sharding", None)
    if want is None or want.mesh.empty or not want.mesh.are_all_axes_explicit:
        return g
    return g if jax.typeof(g).sharding == want else jax.sharding.reshard(g, want)


def _varying(aval: Any) -> frozenset[Any]:
    """The manual axes (inside shard_map) a value varies over: JAX 0.10's manual_axis_type, or the
    vma field JAX had before (the GPU machine's JAX may differ from the pinned one)."""
    mat = getattr(aval, "mat", None)
    return mat.varying if mat is not None else getattr(aval, "vma", frozenset())


def _varying_kw(varying: frozenset[Any]) -> dict[str, Any]:
    """ShapedArray's keyword for the manual axes a result varies over (see _varying)."""
    if hasattr(_core, "ManualAxisType"):
        return {"manual_axis_type": _core.ManualAxisType(varying=varying)}
    return {"vma": varying}


def _agree_varying(operands: Sequence[Any]) -> Sequence[Any]:
    """Inside shard_map (checking what varies over its manual axes): the operands made to vary
    over the same axes, as JAX's own ops make theirs (an invariant operand is cast to varying)."""
    varying = [_varying(jax.typeof(x)) for x in operands]
    every = frozenset().union(*varying)
    if not every:
        return operands
    return [x if v == every else jax.lax.pcast(x, tuple(every - v), to="varying")
            for x, v in zip(operands, varying)]


def _mesh(avals: Sequence[Any]) -> Any:
    """The mesh the values are typed on (the first that is not empty), or None."""
    return next((a.sharding.mesh for a in avals if getattr(a, "sharding", None) is not None
                 and not a.sharding.mesh.empty), None)


def _partitions(aval: Any) -> Optional[tuple[Any, ...]]:
    """The mesh axes each dim of a value is split over (None per whole dim; every dim whole
    without a mesh); None when it is typed reduced or unreduced over an axis (left whole: its
    sharding is not a split of rows)."""
    sharding = getattr(aval, "sharding", None)
    if sharding is None or getattr(sharding.mesh, "empty", True):
        return (None,) * len(aval.shape)
    spec = sharding.spec
    if getattr(spec, "reduced", None) or getattr(spec, "unreduced", None):
        return None
    given = tuple(getattr(spec, "partitions", spec))
    return given + (None,) * (len(aval.shape) - len(given))


def _batch_sharding(avals: Sequence[Any], k: int) -> Optional[Callable[[int], Any]]:
    """Under a mesh of explicit axes (sharding in types), the results' sharding of a call whose
    first k dims are batch dims: those dims as the operands shard them, the rest whole (a
    function of a result's rank); None when nothing is sharded or the operands disagree (the
    results are then whole, as for any other call: XLA gathers the operands)."""
    mesh = _mesh(avals)
    given = [_partitions(a) for a in avals]
    specs = {spec[:k] for spec in given if spec is not None}
    if len(specs) != 1 or mesh is None or None in given:
        return None
    (batch,) = specs
    if all(s is None for s in batch):
        return None
    return lambda rank: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*batch, *(None,) * (rank - k)))


def _broadcast_sharding(avals: Sequence[Any], shape: Sequence[Any]) -> Optional[Callable[[int], Any]]:
    """Under a mesh of explicit axes, the sharding of an elementwise call's results (of the
    operands' broadcast shape): each dim split as the operands that have it whole-sized split it
    (aligned from the right; an operand broadcast along a dim says nothing of it), as jax.numpy's
    elementwise ops type theirs; None when nothing is split or two operands disagree (the results
    are then whole). The lowering partitions such a call by rows, an operand broadcast along them
    (a bias) broadcast first (see _Op.lowering)."""
    mesh = _mesh(avals)
    if mesh is None:
        return None
    entries: list[Any] = [None] * len(shape)
    for a in avals:
        spec = _partitions(a)
        if spec is None:
            return None
        lead = len(shape) - len(a.shape)
        for d, (entry, n) in enumerate(zip(spec, a.shape)):
            if entry is None or n != shape[lead + d]:
                continue
            if entries[lead + d] not in (None, entry):
                return None
            entries[lead + d] = entry
    used = [name for e in entries if e is not None for name in (e if isinstance(e, tuple) else (e,))]
    if not used or len(used) != len(set(used)):
        return None
    return lambda rank: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*entries))


def _lower_partitioned(ctx: Any, k: int, *args: Any, _aliases: Optional[dict[int, int]] = None,
                       **params: Any) -> Any:
    """The call, its first k dims (on every operand and result) its batch dims (operand i the
    same buffer as result _aliases[i], where XLA keeps that)."""
    extra: dict[str, Any] = {"mhlo.frontend_attributes": mlir.ir_attribute({"num_batch_dims": str(k)})}
    if jax.config.jax_use_shardy_partitioner:
        batch = [f"b{d}" for d in range(k)]
        mappings, own = [], []  # (each array's own dims: factors of their own, replicated)
        for j, aval in enumerate((*ctx.avals_in, *ctx.avals_out)):
            rest = [f"d{j}_{d}" for d in range(k, len(aval.shape))]
            own += rest
            mappings.append(" ".join(batch + rest))
        n_in = len(ctx.avals_in)
        rule = _sdy_rule.str_to_sdy_sharding_rule(
            f"{', '.join(mappings[:n_in])} -> {', '.join(mappings[n_in:])}", need_replication_factors=tuple(own))
        extra["sdy.sharding_rule"] = _sdy_rule.sdy_sharding_rule_to_mlir(
            rule, [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_in],
            [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out])
    return jax.ffi.ffi_lowering(TARGET, extra_attributes=extra, operand_output_aliases=_aliases)(ctx, *args, **params)


def _lower_agreed(ctx: Any, k: int, *args: Any, manual: tuple[Any, ...] = (), **params: Any) -> Any:
    """The call of an op that checks its inputs' values (indices, labels), split by XLA's batch
    partitioner over several devices, or inside shard_map on each device's shard (manual: the
    manual axes of more than one device), where one device's rows may fail its checks and the
    others' not: with its error deferred, so that every device fails at one place, not one device
    alone while the others wait for it in their next collective (XLA's CPU client aborts the
    process after 40 s).

    The call gives one more result, its status (int32, of its k batch dims' shape: 0, or a number
    for the failure, under which the handler keeps the error). Reduced over the rows,
    the status is all-reduced over the devices that split them (XLA's partitioner); a check of the
    status then passes the results on, on each of them, or fails with the kept error if it is not 0
    (see jax_native.cpp): what uses the results runs after it. Inside shard_map the status is
    all-reduced (a max, JAX's own lowering of lax.pmax) over the manual axes as well: only where
    opforge.jax found the call in code every device runs (see _in_lockstep), as a collective in a
    branch some devices skip would leave the others waiting. (XLA's partitioner drops the check's
    aliasing of its results to its operands: the check copies them.)"""
    int32 = np.dtype(np.int32)
    scalar = jax.core.ShapedArray((), int32)
    status = jax.core.ShapedArray(ctx.avals_out[0].shape[:k], int32)
    deferred: dict[str, Any] = {**params, "opforge.defer": 1}
    call = ctx.replace(avals_out=[*ctx.avals_out, status])
    *outs, flag = _lower_partitioned(call, k, *args, **deferred) if k else _lower(call, *args, **deferred)
    if k:
        t = mlir.aval_to_ir_type(ctx.module_context, scalar)
        reduce = hlo.ReduceOp([t], [flag], [mlir.ir_constant(np.int32(0))], mlir.dense_int_array(list(range(k))))
        body = reduce.body.blocks.append(t, t)
        with ir.InsertionPoint(body):
            hlo.return_([hlo.maximum(*body.arguments)])
        flag = reduce.result
    if manual:
        one = ctx.replace(primitive=None, avals_in=[scalar], avals_out=[scalar])
        flag, = _parallel._allreduce_lowering(jax.lax.max_p, jax.lax.reduce_max, one, flag, axes=manual,
                                              axis_index_groups=None)
    if k:
        flag = _mlir_impl.broadcast_in_dim(ctx, flag, status, broadcast_dimensions=())
    check = ctx.replace(primitive=None, avals_in=[status, *ctx.avals_out])
    aliases = {1 + j: j for j in range(len(outs))}
    named = {"opforge.check": 1, "opforge.name": params["opforge.name"]}
    if k:
        return _lower_partitioned(check, k, flag, *outs, _aliases=aliases, **named)
    return jax.ffi.ffi_lowering(TARGET, operand_output_aliases=aliases)(check, flag, *outs, **named)


# (what JAX traces a function for, by the debug info of its trace (DynamicJaxprTrace), where each
# device of shard_map's manual axes runs the function whenever one does and JAX keeps no program
# of it to call again elsewhere: linearize's and vmap's traces (grad, jvp, vmap trace in place),
# and the jit of an op's own call (its transpose traces the bprop there; its cache keys on the
# agree parameter), by where its function is defined (_OWN_CALL). Anything else is not: cond,
# switch, while_loop, fori_loop; a jit of the user's; scan's body and remat'd functions, whose
# jaxprs JAX caches by the function, so that one traced in straight-line code and called again
# under a device-dependent cond would keep its all-reduce (found by review: a valid program hung)
_LOCKSTEP = ("linearize", "linearize_prim_jvp", "vmap")
_OWN_CALL: list[str] = []  # (" at <file>:<line>" of _Op's call, as JAX's debug info names it)


def _in_lockstep() -> bool:
    """Whether a call traced now, inside shard_map (or pmap), runs on every device of its manual
    axes whenever it runs on one: traced in the shard_map's body itself, or in functions nested in
    it that every device runs alike and that JAX does not cache (see _LOCKSTEP). A call under a
    cond, switch or loop whose predicate may differ between devices, in a jit of the user's, a
    scan's body or a remat'd function (programs JAX caches by the function and may call from such
    a branch too), or in a custom_vjp/custom_jvp function (traced apart from its caller) is not:
    its status is not all-reduced over the manual axes (a collective some devices skip would
    leave the others waiting). Nor is one in a shard_map nested in another where something between
    the two is not in lockstep, when JAX shows the chain between them. Limit (found by review): JAX
    traces a nested shard_map's body apart (its chain ends there), and the all-reduce spans every
    manual axis, the outer ones too: a checking op in a shard_map nested under a device-dependent
    cond of another's body leaves the devices that skip the branch out, and a valid program hangs."""
    trace = _core.trace_ctx.trace
    seen = between = False  # (a shard_map found; something not in lockstep above it)
    while trace is not None:
        frame = getattr(trace, "frame", None)
        if frame is not None:  # (a jaxpr traced for some function)
            info = getattr(frame, "debug_info", None)
            traced_for = getattr(info, "traced_for", None)
            if traced_for == "shard_map":
                if between:
                    return False
                seen = True
            elif traced_for not in _LOCKSTEP and not (
                    traced_for == "jit" and str(getattr(info, "func_src_info", "")).endswith(tuple(_OWN_CALL))):
                if not seen:
                    return False
                between = True  # (above the shard_map: matters only under another one)
        trace = getattr(trace, "parent_trace", None)
    return seen


# ---------------------------------------------------------------------------- helpers of formulas


class _Helpers(ShapeHelpers):
    """The tensor helpers generated formulas call (see opforge/_opdef.py), in jax.numpy."""

    @staticmethod
    def scalar_like(value: Any, like: Any) -> Any:
        return jnp.asarray(value, dtype=like.dtype)

    @staticmethod
    def with_number(t: Any, value: Any, fn: Callable[..., Any], F: Any) -> Any:  # noqa: N803
        if t.dtype == jnp.float16 or t.dtype == jnp.bfloat16:
            return fn(F, t.astype(jnp.float32), jnp.asarray(value, dtype=jnp.float32)).astype(t.dtype)
        return fn(F, t, jnp.asarray(value, dtype=t.dtype))

    zeros_like = staticmethod(jnp.zeros_like)
    ones_like = staticmethod(jnp.ones_like)

    @staticmethod
    def cast_like(t: Any, like: Any) -> Any:
        return t if t.dtype == like.dtype else t.astype(like.dtype)

    @staticmethod
    def numel_ratio(a: Any, b: Any) -> Any:
        if all(isinstance(d, (int, np.integer)) for d in (*a.shape, *b.shape)):
            nb = math.prod(b.shape)
            return 0.0 if nb == 0 else math.prod(a.shape) / nb
        na, nb = (functools.reduce(operator.mul, (d if isinstance(d, (int, np.integer)) else 1.0 * jnp.asarray(d)
                                                  for d in t.shape), 1.0) for t in (a, b))
        return na / jnp.maximum(nb, 1.0) * jnp.minimum(nb, 1.0)  # (counts: 0 when nb is 0)

    @staticmethod
    def numel(t: Any) -> Any:
        if all(isinstance(d, (int, np.integer)) for d in t.shape):
            return math.prod(t.shape) or math.nan  # (0 as NaN: see opforge.torch's numel)
        # (symbolic dims, jax.export's shape polymorphism: a weakly typed float, as a Python
        # number would be, so that a product past 2**31 does not wrap as int32 would)
        return functools.reduce(operator.mul, (d if isinstance(d, (int, np.integer)) else 1.0 * jnp.asarray(d)
                                               for d in t.shape), 1.0)

    @staticmethod
    def expand_reduced(g: Any, like: Any, axes: Any, keepdims: bool) -> Any:
        if not keepdims:
            g = jnp.expand_dims(g, axes_of(axes, like.ndim))
        return jnp.broadcast_to(g, like.shape)

    @staticmethod
    def reduce_grad(g: Any, meta: tuple[tuple[int, ...], Any]) -> Any:
        shape, dtype = meta
        if g.shape != shape:  # (summed over the axes broadcasting added or stretched)
            lead = g.ndim - len(shape)
            stretched = tuple(lead + k for k, n in enumerate(shape) if n == 1 and g.shape[lead + k] != 1)
            g = jnp.sum(g, axis=tuple(range(lead)) + stretched, keepdims=False)
            g = g.reshape(shape)
        return g if g.dtype == dtype else g.astype(dtype)


H = _Helpers()


# ---------------------------------------------------------------------------- attrs


def _input_dtypes(op: OpDef, avals: Sequence[Any]) -> tuple[list[Optional[str]], int]:
    """The opforge dtype of each input slot (avals one per slot, None where absent), and the mask of
    inputs JAX gives as int32 where the op takes int64 (without 64-bit types JAX has no int64: the
    handler widens them)."""
    dtypes: list[Optional[str]] = []
    widen = 0
    for k, (inp, a) in enumerate(zip(op.inputs, avals)):
        name = None if a is None else _dtype_name(op, inp.name, a.dtype)
        if name == "int32" and inp.dtype == "int64" and not getattr(jax.config, "jax_enable_x64"):
            name = "int64"
            widen |= 1 << k
        dtypes.append(name)
    return dtypes, widen


def _dtype_name(op: OpDef, input_name: str, dtype: Any) -> str:
    """opforge's name of an input's dtype; TypeError naming the op for one opforge does not have."""
    name = _NAMES.get(np.dtype(dtype))
    if name is None:
        raise TypeError(f"[{op.name}] input '{input_name}' has dtype {dtype}, which opforge does not have; "
                        f"supported dtypes: {', '.join(_DTYPES)}")
    return name


def _ffi_attr(attr: AttrDef, value: Any) -> Any:
    """A canonical attr value as the FFI attribute the handler decodes (int64, double, bool,
    string, dense int64/double arrays)."""
    if attr.type == "list[int]":
        return np.asarray(value, np.int64)
    if attr.type == "list[float]":
        return np.asarray(value, np.float64)
    return float(value) if isinstance(value, _Float) else value


_meta_value = plain_attr  # (an attr as the meta rule and the formulas take it)


_UNSET = object()
_NUMBERS = (bool, int, float)
_ARRAYS: set[type] = set()  # (types seen to be arrays: jax.Array's isinstance check is slow, ~1 us)
_FLOAT_MAX: dict[Any, float] = {}


def _inputs(op: OpDef, inputs: list[Any]) -> list[Any]:
    """A call's inputs as the op takes them: arrays (JAX's, NumPy's) as they are; a Python number
    weakly typed, as JAX takes it: of the dtype of an array input of its type variable (``x * 2.0``
    keeps x's bfloat16), checked as opforge's own API checks it (a float for an integer input is a
    TypeError, an int out of the dtype's range a ValueError); without one, JAX's default dtype of
    the widest number of the type variable. A weakly typed JAX value (a Python number that became
    an argument of jit or grad, a scan carry, ``jnp.asarray(2.0)``) takes the dtype of a strongly
    typed array of its type variable as JAX promotes it (a float for a float input; an int or bool
    for any). Anything else: TypeError naming the op."""
    numbers = []
    weak = []
    for k, x in enumerate(inputs):
        if x is None:
            continue
        if type(x) in _ARRAYS or isinstance(x, (jax.Array, np.ndarray, np.generic)) or hasattr(x, "__jax_array__"):
            _ARRAYS.add(type(x))
            aval = getattr(x, "aval", None)  # (JAX's arrays and tracers)
            if aval is not None and getattr(aval, "weak_type", False):
                weak.append(k)
            continue
        if isinstance(x, _NUMBERS):
            numbers.append(k)
            continue
        if isinstance(x, jax.ShapeDtypeStruct) and op.inputs[k].shape_only:  # (values never read)
            inputs = list(inputs)
            inputs[k] = jnp.zeros(x.shape, x.dtype)
            continue
        what = "complex numbers are not supported (opforge has no complex dtypes)" if isinstance(x, complex) else \
            f"must be a JAX or NumPy array or a Python number, got {type(x).__module__}.{type(x).__qualname__}"
        raise TypeError(f"[{op.name}] input '{op.inputs[k].name}' {what}")
    if weak:
        inputs = _strong(op, inputs, weak, numbers)
    if not numbers:
        return inputs
    out = list(inputs)
    for k in numbers:
        value, inp = inputs[k], op.inputs[k]
        typevar = inp.dtype if inp.dtype in op.typevars else None
        partner = None
        if typevar is not None:
            for j, x in enumerate(inputs):
                if j not in numbers and x is not None and op.inputs[j].dtype == typevar:
                    partner = j
                    break
        if partner is not None:
            dtype = np.dtype(inputs[partner].dtype)
        else:
            if typevar is None:
                name = inp.dtype
            else:  # (the widest number of the type variable: float, int, bool)
                kinds = {type(inputs[j]) for j in numbers if op.inputs[j].dtype == typevar}
                name = "float64" if float in kinds else "int64" if int in kinds else "bool"
            dtype = np.dtype(jax.dtypes.canonicalize_dtype(_DTYPES.get(name, np.dtype(np.float64))))
        kind = "f" if dtype == _DTYPES["bfloat16"] else "i" if dtype.kind == "u" else dtype.kind  # (bfloat16: "V")
        check_number(op, inp.name, value, _NAMES.get(dtype, str(dtype)), kind,
                     _int_range(dtype) if kind == "i" else (0, 1), _number_by(op, partner, dtype), "an array")
        if kind == "f":
            value = float(value)
            top = _FLOAT_MAX.get(dtype)
            if top is None:
                top = _FLOAT_MAX[dtype] = float(jnp.finfo(dtype).max) if dtype.itemsize < 8 else math.inf
            if abs(value) > top:  # (rounded as NumPy rounds it: to the largest value, or past it to inf)
                with np.errstate(over="ignore"):
                    out[k] = np.asarray(value, dtype)
                continue
        out[k] = np.asarray(value, dtype)
    return out


def _strong(op: OpDef, inputs: list[Any], weak: list[int], numbers: list[int]) -> list[Any]:
    """inputs with each weakly typed array cast to the dtype of a strongly typed array of its type
    variable, where JAX's promotion would give that dtype (a weak float beside an integer array
    stays: the op then refuses the two dtypes, naming them)."""
    out = list(inputs)
    for k in weak:
        typevar = op.inputs[k].dtype
        if typevar not in op.typevars:
            continue
        partner = next((j for j, x in enumerate(inputs) if x is not None and j not in weak and j not in numbers
                        and op.inputs[j].dtype == typevar), None)
        if partner is None:
            continue
        dtype, have = np.dtype(inputs[partner].dtype), np.dtype(inputs[k].dtype)
        floating = dtype.kind == "f" or dtype == _DTYPES["bfloat16"]
        if have != dtype and (floating or have.kind in "iub" and (dtype.kind != "b" or have.kind == "b")):
            out[k] = inputs[k].astype(dtype)
    return out


@functools.lru_cache(maxsize=None)
def _int_range(dtype: Any) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _number_by(op: OpDef, partner: Optional[int], dtype: Any) -> str:
    if partner is not None:
        return f" (bound by input '{op.inputs[partner].name}')"
    return "" if jax.config.jax_enable_x64 or dtype.itemsize == 8 or dtype == np.bool_ else " (JAX without 64-bit types)"


def _bind_args(op: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], tuple[Any, ...]]:
    """A call's inputs (None for absent optional ones) and canonical attrs (defaults filled in)."""
    names = [i.name for i in op.inputs] + [a.name for a in op.attrs]
    if len(args) > len(names):
        raise TypeError(f"[{op.name}] takes {len(op.inputs)} inputs and {len(op.attrs)} attrs, got {len(args)} "
                        "positional arguments")
    values = list(args) + [_UNSET] * (len(names) - len(args))
    for key, v in kwargs.items():
        if key not in names:
            raise TypeError(f"[{op.name}] got an unexpected keyword argument '{key}'; its parameters are "
                            f"{', '.join(names)}")
        k = names.index(key)
        if values[k] is not _UNSET:
            raise TypeError(f"[{op.name}] got multiple values for '{key}'")
        values[k] = v
    inputs: list[Any] = []
    for inp, v in zip(op.inputs, values):
        if v is _UNSET:
            if not inp.optional:
                raise TypeError(f"[{op.name}] missing input '{inp.name}'")
            v = None
        inputs.append(v)
    attrs = []
    for attr, v in zip(op.attrs, values[len(op.inputs):]):
        if v is _UNSET:
            if attr.required:
                raise TypeError(f"[{op.name}] missing required attr '{attr.name}'")
            v = attr.default
        attrs.append(_canonical(op, attr, v))
    return inputs, tuple(attrs)


# ---------------------------------------------------------------------------- one op's primitives


def _abi(op: OpDef) -> int:
    """A digest of what the handler's call of the op depends on, as a signed 64-bit int (an FFI
    attribute): its inputs (names, whether optional), attrs (names, types) and outputs. A program
    exported with jax.export carries it; the handler refuses to run an op of another interface
    under the same name."""
    text = repr(([(i.name, i.optional) for i in op.inputs], [(a.name, a.type) for a in op.attrs],
                 [o.name for o in op.outputs]))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _expand(present: tuple[bool, ...], given: Sequence[Any]) -> list[Any]:
    """The present inputs' values spread over every input slot (None where absent)."""
    it = iter(given)
    return [next(it) if p else None for p in present]


class _Op:
    """An op's primitive (its kernel through the FFI target) and, for an op with a bprop, the
    primitive of its tangent map (forward mode: the spec's jvp; its transpose: the spec's bprop)."""

    def __init__(self, op: OpDef, kernel: Any, meta: Callable[..., Any], prefix: str, name: str, F: Any) -> None:
        self.op = op
        self.meta = meta
        self.F = F
        self.name = name  # (what an exported program's calls name it by: "mul", "<module>.<op>")
        self.abi = _abi(op)
        self.number = _handler.register(kernel, name, self.abi)
        self.n_in, self.n_out = len(op.inputs), len(op.outputs)
        self.diff_out = [k for k, o in enumerate(op.outputs) if o.differentiable]
        self.axes_batch = op.outputs_follow_axes()  # (whether vmap's axes rule may apply)
        # (an input of a concrete integer dtype: indices or labels, which its kernel checks)
        self.checks_values = any(i.dtype in ("int32", "int64") for i in op.inputs)
        self.prim = Primitive(f"{prefix}.{op.name}")
        self.prim.multiple_results = True
        self.prim.def_impl(functools.partial(xla.apply_primitive, self.prim))
        self.prim.def_abstract_eval(self.abstract)
        for platform in _PLATFORMS:
            if platform == "cpu" or platform in op.runs:
                mlir.register_lowering(self.prim, self.lowering, platform=platform)
            else:  # (JAX's own message names neither the op nor what to do)
                mlir.register_lowering(self.prim, functools.partial(self.no_kernel, platform), platform=platform)
        batching.primitive_batchers[self.prim] = self.batch
        ad.primitive_jvps[self.prim] = self.jvp
        if op.bprop is not None:
            ad.primitive_transposes[self.prim] = self.op_transpose
        self.tangent_prim: Optional[Primitive] = None
        if op.bprop is not None:
            t = Primitive(f"{prefix}.{op.name}.jvp")
            t.multiple_results = True
            t.def_impl(self.tangent)
            t.def_abstract_eval(self.tangent_abstract)
            mlir.register_lowering(t, mlir.lower_fun(self.tangent, multiple_results=True))
            batching.primitive_batchers[t] = self.tangent_batch
            ad.primitive_jvps[t] = self.tangent_jvp
            ad.primitive_transposes[t] = self.transpose
            self.tangent_prim = t

        def call(*operands: Any, attrs: tuple[Any, ...], present: tuple[bool, ...], agree: bool = False) -> Any:
            # (agree: inside shard_map, the call's status all-reduced over the manual axes; see
            # _lower_agreed: a parameter of the primitive only where set)
            extra = {"agree": True} if agree else {}
            split = self.rows_split(operands, attrs, present)
            if split is not None:  # (each device's rows, the whole operands on every device)
                mesh, in_specs, out_specs, axes = split
                return jax.shard_map(lambda *xs: self.prim.bind(*_agree_varying(xs), attrs=attrs, present=present,
                                                                **extra),
                                     mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names=axes)(*operands)
            return self.prim.bind(*_agree_varying(operands), attrs=attrs, present=present, **extra)

        # (behind jax.jit: a repeated call reuses the compiled executable, ~10 us, as a jnp op's;
        # named as the op, which JAX's errors, jaxprs and HLO then show)
        call.__name__ = call.__qualname__ = op.name
        if not _OWN_CALL:
            _OWN_CALL.append(f" at {call.__code__.co_filename}:{call.__code__.co_firstlineno}")
        jitted = jax.jit(call, static_argnames=("attrs", "present", "agree"))
        checks_values = self.checks_values

        def dispatch(*operands: Any, attrs: tuple[Any, ...], present: tuple[bool, ...],
                     agree: Optional[bool] = None) -> Any:
            """The call; agree None: decided here, for an op that checks its inputs' values inside
            shard_map, by where the call is traced (see _in_lockstep); the rules of vmap and jvp
            pass on the decision of the call they transform."""
            if agree is None:
                agree = checks_values and bool(jax.sharding.get_abstract_mesh().manual_axes) and _in_lockstep()
            if agree:
                return jitted(*operands, attrs=attrs, present=present, agree=True)
            return jitted(*operands, attrs=attrs, present=present)

        self.call = dispatch

    # ---- the op

    def _metas(self, avals: Sequence[Any], attrs: tuple[Any, ...], present: tuple[bool, ...]) -> tuple[Any, int]:
        """The op's meta rule on the avals: [(shape, opforge dtype)] per output, and the mask of
        inputs JAX gives as int32 where the op takes int64 (without 64-bit types JAX has no int64:
        the handler widens them)."""
        op = self.op
        # (symbolic dims, jax.export's shape polymorphism: the meta rule checks the call and gives
        # the dtypes on a stand-in value per dim variable; the shapes come from the spec's shape
        # rules on the symbolic dims, checked against the meta rule's at the stand-ins)
        envs = _stand_in_envs(op.name, [a.shape for a in avals if a is not None])
        env = envs[0] if envs else {}
        dtypes, widen = self._dtypes(avals, present)
        stand_ins = [None if a is None else _C._meta_tensor(_at(a.shape, env), d)
                     for a, d in zip(_expand(present, avals), dtypes)]
        try:
            metas = self.meta(*stand_ins, *(_meta_value(v) for v in attrs))  # raises what an eager call would
        except (TypeError, ValueError, IndexError) as e:
            if not env:
                raise
            # (the stand-ins named back by their variables, and said to be stand-ins)
            message = str(e)
            for var, size in env.items():
                message = re.sub(rf"\b{size}\b", var, message)
            raise type(e)(f"{message} (symbolic dims checked at stand-in sizes "
                          f"{', '.join(f'{v}={n}' for v, n in env.items())})") from None
        if env:
            shapes = _symbolic_shapes(op, _expand(present, [a.shape for a in avals]), attrs)
            given = ", ".join(str(tuple(a.shape)) for a in avals)
            other = envs[1]
            try:
                at_other = self.meta(*(None if a is None else _C._meta_tensor(_at(a.shape, other), d)
                                       for d, a in zip(dtypes, _expand(present, avals))),
                                     *(_meta_value(v) for v in attrs))
            except (TypeError, ValueError, IndexError) as e:
                raise ValueError(
                    f"[{op.name}] the call is valid for some sizes of its dim variables and not others "
                    f"(checked at {', '.join(f'{v}={n}' for v, n in env.items())}, then at "
                    f"{', '.join(f'{v}={n}' for v, n in other.items())}: {e}): its shapes {given} relate "
                    "a dim variable to a constant; export with shapes that agree for every size") from None
            if any(_at(sym, at) != list(shape) for at, found in ((env, metas), (other, at_other))
                   for sym, (shape, _) in zip(shapes, found)):
                raise NotImplementedError(
                    f"[{op.name}] its shape rule on the symbolic shapes {given} gives "
                    f"{', '.join(map(str, shapes))}, which its meta rule does not confirm; export with concrete "
                    "shapes")
            metas = [(tuple(sym), dtype) for sym, (_, dtype) in zip(shapes, metas)]
        return metas, widen

    def abstract(self, *avals: Any, attrs: tuple[Any, ...], present: tuple[bool, ...],
                 agree: bool = False) -> list[Any]:
        metas, _ = self._metas(avals, attrs, present)
        k = self.batch_dims([a.shape for a in avals], [shape for shape, _ in metas], attrs, present)
        if self.op.impl == "expr" and len({tuple(shape) for shape, _ in metas}) == 1:
            batch = _broadcast_sharding(avals, metas[0][0])  # (every dim, as jax.numpy's)
        else:
            batch = _batch_sharding(avals, k) if k else None
        # (inside shard_map: the results vary over the manual axes the operands vary over; call()
        # made the operands agree)
        varying = _core.standard_vma_rule(self.op.name, *avals)
        # (JAX without 64-bit types holds an int64 result as int32: the handler narrows it)
        return [jax.core.ShapedArray(
                    tuple(shape), jax.dtypes.canonicalize_dtype(_DTYPES[dtype]),
                    sharding=batch(len(shape)) if batch is not None else _core.get_cur_mesh_sharding(),
                    **_varying_kw(varying))
                for shape, dtype in metas]

    def no_kernel(self, platform: str, ctx: Any, *args: Any, **params: Any) -> Any:
        raise NotImplementedError(
            f"[{self.op.name}] has no {platform} kernel in this build (it runs on: {', '.join(self.op.runs)}); "
            "put its inputs on the CPU, e.g. jax.device_put(x, jax.devices('cpu')[0])")

    def lowering(self, ctx: Any, *args: Any, attrs: tuple[Any, ...], present: tuple[bool, ...],
                 agree: bool = False) -> Any:
        metas, widen = self._metas(ctx.avals_in, attrs, present)
        narrow = sum(1 << j for j, ((_, dtype), a) in enumerate(zip(metas, ctx.avals_out))
                     if _DTYPES[dtype] != np.dtype(a.dtype))
        params: dict[str, Any] = {"opforge.name": self.name, "opforge.abi": self.abi, "opforge.inputs": sum(1 << k for k, p in enumerate(present) if p),
                                  "opforge.widen": widen, "opforge.narrow": narrow}
        for attr, v in zip(self.op.attrs, attrs):
            if v is not None:
                params[attr.name] = _ffi_attr(attr, v)
        k = self.batch_dims([a.shape for a in ctx.avals_in], [a.shape for a in ctx.avals_out], attrs, present)
        devices = getattr(ctx.module_context.axis_context, "num_devices", 1)
        if k and self.checks_values and any(n % devices for n in ctx.avals_out[0].shape[:k]):
            # (rows that do not split evenly are padded, the pad holding any values: an op whose
            # kernel checks its inputs' values (indices) would fail on the pad; such a call is
            # split only into whole rows)
            k = 0
        if self.op.impl == "expr" and devices > 1:
            blocks = self._lower_elementwise(ctx, args, params)
            if blocks is not None:
                return blocks
        if self.checks_values:
            axis_context = ctx.module_context.axis_context
            manual: frozenset[Any] = getattr(axis_context, "manual_axes", frozenset())
            split = devices if not manual else axis_context.mesh.size // math.prod(
                axis_context.mesh.shape[a] for a in manual)  # (the devices of the automatic axes)
            # (inside shard_map, where the call runs on every device of its manual axes: those
            # axes of more than one device, over which its status is all-reduced)
            axes = tuple(a for a in axis_context.mesh.axis_names if a in manual and axis_context.mesh.shape[a] > 1) \
                if agree and manual else ()
            if axes or k and split > 1:  # (devices hold different rows: their checks must agree)
                return _lower_agreed(ctx, k, *args, manual=axes, **params)
        if k:
            return _lower_partitioned(ctx, k, *args, **params)
        return _lower(ctx, *args, **params)

    def _lower_elementwise(self, ctx: Any, args: Sequence[Any], params: dict[str, Any]) -> Optional[list[Any]]:
        """An elementwise call in a program partitioned over devices, partitioned over every dim
        of its results: each device computes the block of them it holds, whichever dims are split
        (the last included). XLA's batch partitioner keeps one dim of a call out of its batch dims,
        so the call is lowered with a trailing unit dim on every array, its batch dims all the
        results' dims; an operand broadcast along some of them (a bias, a scale) is broadcast to
        the results' shape first. None where the results' shapes differ or a result is typed
        reduced or unreduced (the call is then lowered as any other)."""
        out = ctx.avals_out[0]
        shape = tuple(out.shape)
        if not shape or any(tuple(a.shape) != shape for a in ctx.avals_out) or self.checks_values:
            return None
        spec = _partitions(out)
        if spec is None or not all(isinstance(d, (int, np.integer)) for d in shape):
            return None
        sharding = out.sharding
        if not getattr(sharding.mesh, "empty", True):
            sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec, None))
        unit = (*shape, 1)
        # (the operands typed as the results: a split of theirs counted from the left would land
        # on another dim)
        avals_in = [a.update(shape=unit, sharding=sharding) for a in ctx.avals_in]
        avals_out = [a.update(shape=unit, sharding=sharding) for a in ctx.avals_out]
        inner = ctx.replace(avals_in=avals_in, avals_out=avals_out)
        ins = [_mlir_impl.lower_with_sharding_in_types(inner, _mlir_impl.broadcast_in_dim(
                   inner, x, b, broadcast_dimensions=range(len(shape) - len(a.shape), len(shape))), b)
               for x, a, b in zip(args, ctx.avals_in, avals_in)]
        results = _lower_partitioned(inner, len(shape), *ins, **params)
        return [_mlir_impl.lower_with_sharding_in_types(ctx, _mlir_impl.reshape(ctx, r, a), a)
                for r, a in zip(results, ctx.avals_out)]

    # ---- sharding

    def batch_dims(self, shapes_in: Sequence[Sequence[int]], shapes_out: Sequence[Sequence[int]],
                   attrs: tuple[Any, ...], present: tuple[bool, ...]) -> int:
        """How many leading dims of this call are batch dims: dims every operand and result has,
        of the same sizes, along which the op maps each index independently, so that the op on a
        block of them gives that block of the results. A sharded program then runs the call on
        each device's block (XLA's batch partitioner) instead of gathering its operands. From
        the spec, as vmap's rules: an elementwise op (all arrays of one rank, no dim broadcast),
        an op whose axis attrs index every present input (its dims before the first axis named),
        a batched matmul (its batch dims); 0 for any other op or call (an input no axis indexes,
        such as layer_norm's weight or linear's, must stay whole)."""
        op = self.op
        arrays = [*shapes_in, *shapes_out]
        if not all(isinstance(d, (int, np.integer)) for s in arrays for d in s):
            return 0  # (symbolic dims: jax.export's shape polymorphism)
        rank = min(len(s) for s in arrays)
        same_rank = all(len(s) == rank for s in arrays)
        # (the common prefix; XLA's batch partitioner leaves a call whose arrays are all batch dims
        # unpartitioned: one dim stays out, so a 1-d elementwise call is not partitioned)
        k = 0
        while k < min(rank, max(len(s) for s in arrays) - 1) and len({s[k] for s in arrays}) == 1:
            k += 1
        if k == 0:
            return 0
        if op.impl == "expr":
            return k if same_rank else 0  # (an operand of lower rank broadcasts from the left)
        if self.n_out == 1 and op.outputs[0].shape == "matmul":
            return min(k, rank - 2) if same_rank else 0  # (the dims before the matrices)
        axis_attrs = [j for j, a in enumerate(op.attrs) if a.axis_of]
        indexed = op.axis_indexed()
        if not axis_attrs or not self.axes_batch or any(p and i not in indexed for i, p in enumerate(present)):
            return 0
        ins = _expand(present, list(shapes_in))
        for j in axis_attrs:
            reference = ins[op.input_index(op.attrs[j].axis_of[0])]
            if reference is None or any(x is not None and len(x) != len(reference)
                                        for i, x in enumerate(ins) if i in indexed):
                return 0
            named = axes_of(attrs[j], len(reference))
            if any(not 0 <= a < len(reference) for a in named):
                return 0
            k = min([k, *named])
        return k

    def rows_split(self, operands: Sequence[Any], attrs: tuple[Any, ...],
                   present: tuple[bool, ...]) -> Optional[tuple[Any, Any, Any, frozenset[Any]]]:
        """Under a mesh of explicit axes, a call whose operands are split by rows where XLA's batch
        partitioner cannot split it, an operand having no rows (linear's weight, the norms'
        weights, embedding's table): (mesh, in_specs, out_specs, axes) to run it in jax.shard_map
        on each device's rows, the other operands whole on every device; None for any other call.
        The rows, by vmap's rules from the spec: the leading dims of the one split operand, an
        input of ``batch_inputs`` (the call valid without them) or matmul's a (its dims before the
        last, b of at most 2 dims); or the dims before the first
        axis named, of every input the axis attrs index (the other operands no longer than the
        dims from there on: a weight broadcast along rows has rows)."""
        op = self.op
        avals = [jax.typeof(x) for x in operands]
        mesh = _mesh(avals)
        if mesh is None or not all(isinstance(d, (int, np.integer)) for a in avals for d in a.shape):
            return None
        if self.checks_values:  # (in shard_map its checks would fail on one device alone: see _lower_agreed)
            return None
        kinds = dict(zip(mesh.axis_names, mesh.axis_types))

        def named(entry: Any) -> tuple[Any, ...]:
            return () if entry is None else tuple(entry) if isinstance(entry, tuple) else (entry,)

        given = [_partitions(a) for a in avals]
        if any(g is None for g in given):  # (typed reduced or unreduced: left as it was)
            return None
        specs = _expand(present, given)
        shapes = _expand(present, [tuple(a.shape) for a in avals])
        split = [k for k, sp in enumerate(specs) if sp is not None and any(e is not None for e in sp)]
        if not split or any(kinds.get(name) != jax.sharding.AxisType.Explicit
                            for k in split for e in specs[k] for name in named(e)):
            return None
        metas, _ = self._metas(avals, attrs, present)
        if self.batch_dims([a.shape for a in avals], [m[0] for m in metas], attrs, present):
            return None  # (XLA's batch partitioner splits it)
        m = 1 + max(d for k in split for d, e in enumerate(specs[k]) if e is not None)
        names = [i.name for i in op.inputs]
        # (a matmul's rows: a's dims before its last, against a b of at most 2 dims, which has no
        # batch dims to broadcast a's against: not a batch input of the spec, whose vmap rule would
        # take a's added dims for batch dims beside a b of 3)
        matmul_rows = (self.n_out == 1 and op.outputs[0].shape == "matmul" and split == [0]
                       and shapes[1] is not None and len(shapes[1]) <= 2 and m < len(shapes[0]))
        if len(split) == 1 and (names[split[0]] in op.batch_inputs or matmul_rows):
            rows = set(split)
            try:  # (the leading dims are rows only if the call is valid without them, as under vmap)
                self.meta(*(None if s is None else _C._meta_tensor(list(s[m:] if k in rows else s), d)
                            for k, (s, d) in enumerate(zip(shapes, self._dtypes(avals, present)[0]))),
                          *(_meta_value(v) for v in attrs))
            except (TypeError, ValueError, IndexError):
                return None
        else:
            axis_attrs = [j for j, a in enumerate(op.attrs) if a.axis_of]
            indexed = op.axis_indexed()
            if not axis_attrs or not self.axes_batch or not set(split) <= indexed:
                return None
            rows = {k for k in indexed if shapes[k] is not None}
            rank = len(shapes[min(rows)])
            if any(len(shapes[k]) != rank for k in rows):
                return None
            for j in axis_attrs:
                first = axes_of(attrs[j], rank)
                if not first or min(first) < m or max(first) >= rank:
                    return None
            if any(s is not None and k not in rows and len(s) > rank - m for k, s in enumerate(shapes)):
                return None
            # (the call on one row, its axes moved down by m, valid and giving the outputs' rest:
            # a spec that checks its other operands against rows keeps the call whole)
            moved = list(attrs)
            for j in axis_attrs:
                value = attrs[j]
                named_axes = axes_of(value, rank)
                moved[j] = named_axes[0] - m if isinstance(value, int) else tuple(a - m for a in named_axes)
            try:
                one = self.meta(*(None if s is None else _C._meta_tensor(list(s[m:] if k in rows else s), d)
                                  for k, (s, d) in enumerate(zip(shapes, self._dtypes(avals, present)[0]))),
                                *(_meta_value(v) for v in moved))
            except (TypeError, ValueError, IndexError):
                return None
            if [tuple(shape) for shape, _ in one] != [tuple(shape[m:]) for shape, _ in metas]:
                return None
        row = specs[min(rows)][:m]
        for k, (s, sp) in enumerate(zip(shapes, specs)):
            if s is None:
                continue
            if k in rows and (sp[:m] != row or s[:m] != shapes[min(rows)][:m]) or any(e is not None for e in sp[m:]):
                return None
            if k not in rows and any(e is not None for e in sp):
                return None
        lead = shapes[min(rows)][:m]
        if any(len(shape) < m or tuple(shape[:m]) != lead for shape, _ in metas):
            return None
        if any(n % math.prod(mesh.shape[name] for name in named(e)) for n, e in zip(lead, row)):
            return None
        P = jax.sharding.PartitionSpec
        in_specs = tuple(P(*row) if k in rows else P() for k, s in enumerate(shapes) if s is not None)
        out_specs = [P(*row)] * self.n_out
        return mesh, in_specs, out_specs, frozenset(name for e in row for name in named(e))

    def _dtypes(self, avals: Sequence[Any], present: tuple[bool, ...]) -> tuple[list[Optional[str]], int]:
        return _input_dtypes(self.op, _expand(present, avals))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs, attrs = _bind_args(self.op, args, kwargs)
        return self.apply(_inputs(self.op, inputs), attrs)

    def apply(self, inputs: Sequence[Any], attrs: tuple[Any, ...]) -> Any:
        present = tuple(x is not None for x in inputs)
        outs = self.call(*(x for x in inputs if x is not None), attrs=attrs, present=present)
        return outs[0] if self.n_out == 1 else tuple(outs)

    # ---- vmap

    def batch(self, args: Sequence[Any], dims: Sequence[Any], *, attrs: tuple[Any, ...],
              present: tuple[bool, ...], agree: bool = False) -> tuple[list[Any], list[int]]:
        op = self.op
        bind = functools.partial(self._bind, agree=agree)
        ins = _expand(present, args)
        in_dims = _expand(present, dims)  # (None: not batched)
        size = next(x.shape[d] for x, d in zip(ins, in_dims) if x is not None and d is not None)
        out_dims = [0] * self.n_out
        names = [i.name for i in op.inputs]
        batched = [k for k, (x, d) in enumerate(zip(ins, in_dims)) if x is not None and d is not None]
        rows = {names.index(n) for n in op.batch_inputs}
        if len(batched) == 1 and batched[0] in rows:  # its leading dims are independent rows
            k = batched[0]
            moved = list(ins)
            moved[k] = jnp.moveaxis(ins[k], in_dims[k], 0)
            return bind(moved, attrs), out_dims
        axis_attrs = [k for k, a in enumerate(op.attrs) if a.axis_of]
        if axis_attrs and self.axes_batch:
            out = self._batch_axes(ins, in_dims, attrs, axis_attrs, size, agree)
            if out is not None:
                return out, out_dims
        matmul = self.n_out == 1 and op.outputs[0].shape == "matmul"
        if matmul and batched == [0] and ins[1] is not None and ins[1].ndim <= 2:
            # (a batched, b of at most 2 dims: the batch dim first is one more row dim of a)
            moved = list(ins)
            moved[0] = jnp.moveaxis(ins[0], in_dims[0], 0)
            return bind(moved, attrs), out_dims
        if op.impl == "expr" or matmul and all(d is None or x.ndim >= 3 for x, d in zip(ins, in_dims) if x is not None):
            # (batch axes first, padded to the others' rank: broadcasting lines them up)
            rank = max(x.ndim - (d is not None) for x, d in zip(ins, in_dims) if x is not None)
            moved = []
            for x, d in zip(ins, in_dims):
                if x is not None and d is not None:
                    x = jnp.moveaxis(x, d, 0)
                    x = x.reshape(x.shape[:1] + (1,) * (rank - (x.ndim - 1)) + x.shape[1:])
                moved.append(x)
            return bind(moved, attrs), out_dims
        # any other op: once per batch element (the per-example loop, as jax.lax.map runs it)
        mapped = [k for k in batched]
        xs = [jnp.moveaxis(ins[k], in_dims[k], 0) for k in mapped]

        def one(slices: list[Any]) -> list[Any]:
            row = list(ins)
            for k, s in zip(mapped, slices):
                row[k] = s
            return bind(row, attrs)

        return list(jax.lax.map(one, xs)), out_dims

    def _batch_axes(self, ins: list[Any], dims: list[Any], attrs: tuple[Any, ...], axis_attrs: list[int],
                    size: int, agree: bool = False) -> Optional[list[Any]]:
        """An op whose axis attrs index the batched inputs: those inputs with the batch axis first
        (the unbatched ones broadcast to it), the axes shifted past it; None when the rule does not
        apply (a batched input no axis indexes, a 0-d input, an axis out of range)."""
        op = self.op
        names = [i.name for i in op.inputs]
        indexed = op.axis_indexed()
        if any(x is not None and d is not None and k not in indexed for k, (x, d) in enumerate(zip(ins, dims))):
            return None
        reference = names.index(op.attrs[axis_attrs[0]].axis_of[0])
        ref = ins[reference]
        if ref is None:
            return None
        rank = ref.ndim - (dims[reference] is not None)
        if rank == 0:
            return None
        new_attrs = list(attrs)
        for k in axis_attrs:
            value = attrs[k]
            axes = list(range(rank)) if value is None or value == () else [value] if isinstance(value, int) else value
            if any(not -rank <= a < rank for a in axes):
                return None
            moved = [a % rank + 1 for a in axes]
            new_attrs[k] = moved[0] if isinstance(value, int) else tuple(moved)
        new_ins = []
        for k, (x, d) in enumerate(zip(ins, dims)):
            if x is not None and k in indexed:
                x = jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x[None], (size, *x.shape))
            new_ins.append(x)
        return self._bind(new_ins, tuple(new_attrs), agree=agree)

    def _bind(self, ins: Sequence[Any], attrs: tuple[Any, ...], agree: bool = False) -> list[Any]:
        """The batched call, as a call of the op's own (under explicit axes split by rows where
        rows_split finds them, as outside vmap; agreeing as the call it batches, see dispatch)."""
        present = tuple(x is not None for x in ins)
        return list(self.call(*(x for x in ins if x is not None), attrs=attrs, present=present, agree=agree))

    # ---- autodiff

    def _live(self, present: tuple[bool, ...], tangents: Sequence[Any]) -> tuple[int, ...]:
        """The operand positions whose tangent is not zero, among differentiable inputs."""
        slots = [k for k, p in enumerate(present) if p]
        live = []
        for j, (k, t) in enumerate(zip(slots, tangents)):
            if type(t) is ad.Zero or not self.op.inputs[k].differentiable:
                continue
            if np.dtype(t.dtype) == jax.dtypes.float0:
                continue
            live.append(j)
        return tuple(live)

    def jvp(self, primals: Sequence[Any], tangents: Sequence[Any], *, attrs: tuple[Any, ...],
            present: tuple[bool, ...], agree: bool = False) -> tuple[list[Any], list[Any]]:
        primals = _agree_varying(primals)
        outs = self.prim.bind(*primals, attrs=attrs, present=present, **({"agree": True} if agree else {}))
        zeros = [ad.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
        live = self._live(present, tangents)
        if not live:
            return outs, zeros
        if self.tangent_prim is None:
            if not self.diff_out:  # (comparisons, indices: outputs without derivatives)
                return outs, zeros
            raise NotImplementedError(f"[{self.op.name}] has no derivative: its spec has no bprop")
        touts = self.tangent_prim.bind(*_agree_varying([*primals, *outs, *(tangents[j] for j in live)]), attrs=attrs,
                                       present=present, live=live)
        result = list(zeros)
        for k, t in zip(self.diff_out, touts):
            result[k] = t
        return outs, result

    def op_transpose(self, cts: Sequence[Any], *operands: Any, attrs: tuple[Any, ...],
                     present: tuple[bool, ...], agree: bool = False) -> list[Any]:
        """The op's transpose in the operands JAX holds linear (``jax.linear_transpose``, a
        ``custom_jvp`` rule computing its tangents with opforge ops, the Krylov solvers): the spec's
        bprop with the cotangents as the output gradients. The linear operands and the outputs are
        given to it as shapes alone (``jax.ShapeDtypeStruct``): a gradient that reads their values
        (``square``, ``exp``, ``mul`` of two linear operands) is not linear there, and JAX's
        NotImplementedError says so, naming the op."""
        op = self.op
        inputs = _expand(present, operands)
        linear = [k for k, x in enumerate(inputs) if x is not None and ad.is_undefined_primal(x)]
        if all(type(c) is ad.Zero for c in cts):
            return [ad.Zero(x.aval) if ad.is_undefined_primal(x) else None for x in operands]
        stand = [jax.ShapeDtypeStruct(x.aval.shape, x.aval.dtype) if k in linear else x for k, x in enumerate(inputs)]
        meta = [None if x is None else (tuple(x.shape), x.dtype) for x in stand]
        outs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in self.abstract(
            *(x.aval if ad.is_undefined_primal(x) else jax.typeof(x) for x in operands), attrs=attrs, present=present)]
        douts = [ad.instantiate_zeros(cts[k]) for k in self.diff_out]
        need = [k in linear for k in range(self.n_in)]
        names = ", ".join(op.inputs[k].name for k in linear)
        try:
            grads = op.bprop(self.F, _TRANSPOSE_H, need, meta, *stand, *outs, *douts,  # type: ignore[misc]
                             *(_meta_value(v) for v in attrs))
        except (TypeError, AttributeError) as e:
            raise NotImplementedError(f"[{op.name}] is not linear in {names} (its gradient there reads their values "
                                      f"or its outputs), so JAX cannot transpose it: {e}") from e
        result: list[Any] = []
        for k, x in enumerate(inputs):
            if x is None:
                continue
            if k not in linear:
                result.append(None)
            else:
                g = grads[k]
                result.append(ad.Zero(x.aval) if g is None else _typed_like(g, x.aval))
        return result

    def _split(self, operands: Sequence[Any], present: tuple[bool, ...]) -> tuple[list[Any], list[Any], list[Any]]:
        n_p = sum(present)
        return (list(operands[:n_p]), list(operands[n_p:n_p + self.n_out]), list(operands[n_p + self.n_out:]))

    def tangent(self, *operands: Any, attrs: tuple[Any, ...], present: tuple[bool, ...],
                live: tuple[int, ...]) -> list[Any]:
        """The tangent map: the spec's jvp formula at the primals and outputs, on the live tangents."""
        op = self.op
        if op.jvp is None:
            raise NotImplementedError(
                f"[{op.name}] has no forward-mode derivative (its spec has no jvp formula): use reverse mode "
                "(jax.grad, jax.vjp, jax.jacrev)")
        primals, outs, tangents = self._split(operands, present)
        slots = [k for k, p in enumerate(present) if p]
        t: list[Any] = [None] * self.n_in
        for j, tan in zip(live, tangents):
            t[slots[j]] = tan
        res = op.jvp(self.F, H, t, *_expand(present, primals), *outs, *(_meta_value(v) for v in attrs))
        return [jnp.zeros_like(outs[k]) if res[k] is None else res[k] for k in self.diff_out]

    def tangent_abstract(self, *avals: Any, attrs: tuple[Any, ...], present: tuple[bool, ...],
                         live: tuple[int, ...]) -> list[Any]:
        _, outs, _ = self._split(avals, present)
        return [outs[k] for k in self.diff_out]

    def tangent_batch(self, args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[list[Any], list[int]]:
        out = jax.vmap(functools.partial(self.tangent, **params), in_axes=list(dims))(*args)
        return list(out), [0] * len(out)

    def tangent_jvp(self, primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> tuple[Any, Any]:
        """Second order: the jvp formula differentiated (it is made of these same ops)."""
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        out, tangent_out = jax.jvp(functools.partial(self.tangent, **params), list(primals), tangents)
        return out, tangent_out

    def transpose(self, cts: Sequence[Any], *operands: Any, attrs: tuple[Any, ...], present: tuple[bool, ...],
                  live: tuple[int, ...]) -> list[Any]:
        """Reverse mode: the spec's bprop at the primals and outputs, with the cotangents of the
        differentiable outputs, gives the cotangents of the live tangents."""
        op = self.op
        primals, outs, tangents = self._split(operands, present)
        if any(ad.is_undefined_primal(x) for x in primals + outs):
            raise NotImplementedError(f"[{op.name}] its tangent map is linear in the tangents only")
        none: list[Any] = [None] * (len(primals) + len(outs))
        if all(type(c) is ad.Zero for c in cts):
            return none + [ad.Zero(t.aval) for t in tangents]
        douts = [ad.instantiate_zeros(c) for c in cts]
        slots = [k for k, p in enumerate(present) if p]
        need = [False] * self.n_in
        for j in live:
            need[slots[j]] = True
        inputs = _expand(present, primals)
        meta = [None if x is None else (tuple(x.shape), x.dtype) for x in inputs]
        grads = op.bprop(self.F, H, need, meta, *inputs, *outs, *douts,  # type: ignore[misc]
                         *(_meta_value(v) for v in attrs))
        result = []
        for j, t in zip(live, tangents):
            g = grads[slots[j]]
            result.append(ad.Zero(t.aval) if g is None else _typed_like(g, t.aval))
        return none + result


class _TransposeHelpers(_Helpers):
    """The helpers of an op's transpose (see _Op.op_transpose): a gradient that makes zeros is of
    a piecewise-constant op (sign, floor, a where of numbers), not a linear one."""

    @staticmethod
    def zeros_like(t: Any) -> Any:
        raise TypeError("its gradient there is zeros (a piecewise-constant op)")


_TRANSPOSE_H = _TransposeHelpers()


# ---------------------------------------------------------------------------- op sets


class OpSet:
    """The ops of a table as JAX functions: ``.ops.<name>`` (and ``.primitives``, the primitive of
    each op that has a kernel)."""

    def __init__(self, table: dict[str, OpDef], kernels: Any, metas: Any, prefix: str, library: Optional[str],
                 extern: Optional[dict[str, Any]] = None) -> None:
        fns: dict[str, Callable[..., Any]] = dict(extern or {})
        self.F = SimpleNamespace()
        self.primitives: dict[str, Primitive] = {}
        self._ops: dict[str, _Op] = {}
        for op in table.values():
            if op.composite is not None and op.bprop is None:  # (a formula over the other ops)
                fns[op.name] = _composite(op, self.F, getattr(metas, op.name))
            else:
                name = op.name if library is None else f"{library}.{op.name}"
                o = _Op(op, getattr(kernels, op.name), getattr(metas, op.name), prefix, name, self.F)
                self.primitives[op.name] = o.prim
                self._ops[op.name] = o
                fns[op.name] = _public(o)
        self.F.__dict__.update(fns)
        self.ops = SimpleNamespace(**{name: fns[name] for name in table})


def _public(o: _Op) -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        return o(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = o.op.name
    fn.__doc__ = o.op.doc
    return fn


def _composite(op: OpDef, F: Any, meta: Any) -> Callable[..., Any]:
    formula = op.composite
    assert formula is not None

    def fn(*args: Any, **kwargs: Any) -> Any:
        inputs, attrs = _bind_args(op, args, kwargs)
        inputs = _inputs(op, inputs)
        # (the op's own checks first, as an eager call's: its dtypes and shapes, named after it,
        # not after the ops of its formula)
        avals = [None if x is None else jax.typeof(x) for x in inputs]
        if all(isinstance(d, (int, np.integer)) for a in avals if a is not None for d in a.shape):
            names, _ = _input_dtypes(op, avals)
            meta(*(None if a is None else _C._meta_tensor(list(a.shape), n) for a, n in zip(avals, names)),
                 *(_meta_value(v) for v in attrs))
        return formula(F, H, *inputs, *(_meta_value(v) for v in attrs))

    fn.__name__ = fn.__qualname__ = op.name
    fn.__doc__ = op.doc
    return fn


_OWN = OpSet(_formulas.OPS, _C.ops, _C._meta, "opforge", None)

#: opforge's ops as JAX functions: ``ops.<name>(*inputs, **attrs)``.
ops = _OWN.ops

_MODULES: dict[str, tuple[Any, OpSet]] = {}
_REGISTERING = threading.RLock()


def register_module(module: Any) -> OpSet:
    """The ops of an op module (``opforge.load``'s result, a package's ``<pkg>._ops``) as JAX
    functions, as opforge's own are (formulas may call opforge's ops too): ``.ops.<name>``.
    Registering the same module again returns the same OpSet. Its ops' calls are named
    ``<module.__name__>.<op>``: a program exported with them runs in a process that registered a
    module of that name (the last one registered, if several)."""
    table = getattr(module, "__opforge_formulas__", None)
    if table is None:
        raise TypeError(f"[opforge.jax] {module!r} is not an opforge op module (no __opforge_formulas__): "
                        "pass what opforge.load returns or a package's <pkg>._ops")
    with _REGISTERING:  # (threads registering one module at once get one OpSet)
        known = _MODULES.get(module.__name__)
        if known is not None and known[0] is module:
            return known[1]
        base = {name: getattr(ops, name) for name in _formulas.OPS}
        opset = OpSet(table, module, module._meta, f"{module.__name__}#{len(_MODULES)}", module.__name__, extern=base)
        _MODULES[module.__name__] = (module, opset)
    return opset


def export(fun_jit: Any, **kwargs: Any) -> Any:
    """``jax.export.export(fun_jit, **kwargs)`` with opforge's custom-call target allowed (added to
    ``disabled_checks``): ``export(jax.jit(f))(*args)`` gives a ``jax.export.Exported`` whose
    serialized form runs in another process after ``import opforge.jax`` and the
    ``register_module`` of each op module it calls (see the module's doc)."""
    checks = [*kwargs.pop("disabled_checks", ()), jax_export.DisabledSafetyCheck.custom_call(TARGET)]
    return jax_export.export(fun_jit, disabled_checks=checks, **kwargs)
