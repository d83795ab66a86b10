"""Benchmark groups for benchmarks/run.py: each returns rows comparing opforge, NumPy and torch."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable, Optional

import numpy as np

try:  # (every group but jax_ops compares with torch; a JAX environment may lack it)
    import torch
except ImportError:
    torch = None

import opforge
from opforge import ops

THREADS = int(os.environ.get("OPFORGE_BENCH_THREADS", os.cpu_count() or 1))
if torch is not None:
    torch.set_num_threads(THREADS)


def _calls_for(fn: Callable[[], Any], min_time: float) -> int:
    """How many calls of fn (after a warm-up call) last at least min_time seconds."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time:
            return n
        n = max(n * 2, int(n * min_time / max(t, 1e-9)))


def paired(fns: list[Callable[[], Any]], min_time: float = 0.05, repeat: int = 9) -> list[float]:
    """Median microseconds per call of each of fns, timed in turn (A B C A B C ...) so that a
    drift of the machine's speed moves them alike; each timing lasts about min_time."""
    counts = [_calls_for(fn, min_time) for fn in fns]
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, n, ts in zip(fns, counts, times):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            ts.append((time.perf_counter() - t0) / n)
    return [statistics.median(ts) * 1e6 for ts in times]


def row(group: str, name: str, opforge_v: Optional[float], numpy_v: Optional[float] = None,
        torch_v: Optional[float] = None, target: str = "", met: Optional[bool] = None, note: str = "",
        unit: str = "time") -> dict:
    return {"group": group, "name": name, "opforge": opforge_v, "numpy": numpy_v, "torch": torch_v,
            "target": target, "met": met, "note": note, "unit": unit}


# ---------------------------------------------------------------------------- groups


def call() -> list[dict]:
    rows = []
    for n in (1, 1000):
        a, b = np.ones(n, np.float32), np.ones(n, np.float32)
        oa, ob = opforge.tensor(a), opforge.tensor(b)
        ta, tb = torch.ones(n), torch.ones(n)
        t_np, t_torch, t_of, t_of_arr = paired([lambda: np.multiply(a, b), lambda: torch.mul(ta, tb),
                                                lambda: ops.mul(oa, ob), lambda: ops.mul(a, b)], 0.1)
        if n == 1:
            ok = t_of <= 2.5 * t_np and t_of <= 0.8 * t_torch
            rows.append(row("call", "mul, 1 element, Tensor inputs", t_of, t_np, t_torch,
                            "≤ 2.5× NumPy, ≤ 0.8× torch", ok))
            rows.append(row("call", "mul, 1 element, NumPy array inputs", t_of_arr, t_np, t_torch,
                            "≤ 2.0× NumPy", t_of_arr <= 2.0 * t_np,
                            note="arrays are wrapped zero-copy on every call (NumPy's fields read directly)"))
        else:
            rows.append(row("call", f"mul, {n} elements, Tensor inputs", t_of, t_np, t_torch))
    return rows


def autograd() -> list[dict]:
    a_np, b_np = np.random.rand(8).astype(np.float32), np.random.rand(8).astype(np.float32)
    ta = torch.tensor(a_np, requires_grad=True)
    tb = torch.tensor(b_np, requires_grad=True)
    oa = opforge.tensor(a_np, requires_grad=True)
    ob = opforge.tensor(b_np, requires_grad=True)

    def t_step():
        (ta * tb).sum().backward()

    def o_step():
        ops.sum(ops.mul(oa, ob)).backward()

    t_t, t_o = paired([t_step, o_step], 0.1)
    return [row("autograd", "(a*b).sum() forward+backward, 8 elements", t_o, None, t_t, "≤ 0.5× torch",
                t_o <= 0.5 * t_t)]


def mul() -> list[dict]:
    n = 1 << 26
    a, b = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
    out = np.empty_like(a)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    tdst = torch.empty_like(ta)
    oa, ob = opforge.from_numpy(a), opforge.from_numpy(b)
    gb = 1e-9 * 1e6  # bytes/µs -> GB/s
    t_np_out, t_np, t_torch, t_of, t_copy_np, t_copy_torch = paired(
        [lambda: np.multiply(a, b, out=out), lambda: np.multiply(a, b), lambda: torch.mul(ta, tb),
         lambda: ops.mul(oa, ob), lambda: np.copyto(out, a), lambda: tdst.copy_(ta)], 0.5, 7)
    mul_bytes, copy_bytes = 12 * n, 8 * n
    bw = {k: mul_bytes / v * gb for k, v in (("of", t_of), ("np", t_np), ("np_out", t_np_out), ("torch", t_torch))}
    copy_bw = max(copy_bytes / t_copy_np, copy_bytes / t_copy_torch) * gb
    return [
        row("mul", "mul 2^26 float32, allocating (time)", t_of, t_np, t_torch, "faster than NumPy allocating",
            t_of < t_np, note=f"NumPy with out=: {t_np_out / 1000:.2f} ms"),
        row("mul", "mul 2^26 float32 bandwidth vs same-process memcpy", bw["of"], bw["np"], bw["torch"],
            "≥ 0.9× memcpy GB/s", bw["of"] >= 0.9 * copy_bw, unit="GB/s",
            note=f"memcpy of the same bytes in this process: {copy_bw:.1f} GB/s (best of np.copyto and "
                 f"torch copy_ with {THREADS} threads); NumPy out=: {bw['np_out']:.1f} GB/s; opforge is "
                 f"{bw['of'] / copy_bw:.2f}× memcpy"),
    ]


def vector_math() -> list[dict]:
    """Elementwise kernels calling transcendental functions (libmvec's SIMD variants), 2^24 float32."""
    n = 1 << 24
    rng = np.random.default_rng(0)
    x, d = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    ox, od = opforge.from_numpy(x), opforge.from_numpy(d)
    tx, td = torch.from_numpy(x), torch.from_numpy(d)
    F = torch.nn.functional
    rows = []
    for name, ours, theirs in [
            ("gelu", lambda: ops.gelu(ox), lambda: F.gelu(tx)),
            ("gelu_backward", lambda: ops.gelu_backward(od, ox), lambda: torch.ops.aten.gelu_backward(td, tx)),
            ("gelu (tanh)", lambda: ops.gelu(ox, approximate="tanh"), lambda: F.gelu(tx, approximate="tanh")),
            ("exp", lambda: ops.exp(ox), lambda: torch.exp(tx)),
            ("tanh", lambda: ops.tanh(ox), lambda: torch.tanh(tx))]:
        t_o, t_t = paired([ours, theirs], 0.3, 7)
        target = name in ("gelu", "gelu_backward")
        rows.append(row("vector_math", f"{name} 2^24 float32", t_o, None, t_t, "≤ 1.0× torch" if target else "",
                        t_o <= t_t if target else None))
    return rows


def _norm_cases():
    x_np = np.random.rand(4096, 4096).astype(np.float32)
    w_np = np.random.rand(4096).astype(np.float32)
    b_np = np.random.rand(4096).astype(np.float32)
    F = torch.nn.functional
    cases = []
    if hasattr(ops, "softmax"):
        cases.append(("softmax", lambda x, w, b: ops.softmax(x, axis=-1), lambda x, w, b: torch.softmax(x, -1),
                      lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    if hasattr(ops, "log_softmax"):
        cases.append(("log_softmax", lambda x, w, b: ops.log_softmax(x, axis=-1),
                      lambda x, w, b: torch.log_softmax(x, -1),
                      lambda x: x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))))
    cases.append(("layer_norm", lambda x, w, b: ops.layer_norm(x, w, b)[0],
                  lambda x, w, b: F.layer_norm(x, (4096,), w, b),
                  lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)))
    if hasattr(ops, "rms_norm"):
        cases.append(("rms_norm", lambda x, w, b: ops.rms_norm(x, w)[0],
                      lambda x, w, b: F.rms_norm(x, (4096,), w),
                      lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)))
    return x_np, w_np, b_np, cases


def norms() -> list[dict]:
    x_np, w_np, b_np, cases = _norm_cases()
    rows = []
    for name, of_fn, t_fn, np_fn in cases:
        ox, ow, ob = opforge.from_numpy(x_np), opforge.from_numpy(w_np), opforge.from_numpy(b_np)
        tx, tw, tb = torch.from_numpy(x_np), torch.from_numpy(w_np), torch.from_numpy(b_np)
        t_o, t_t, t_n = paired([lambda: of_fn(ox, ow, ob), lambda: t_fn(tx, tw, tb), lambda: np_fn(x_np)], 0.3, 5)
        rows.append(row("norms", f"{name} 4096×4096 forward", t_o, t_n, t_t, "≤ 1.0× torch", t_o <= t_t))
        # forward + backward, every input requiring grad
        oxg = opforge.tensor(x_np, requires_grad=True)
        owg = opforge.tensor(w_np, requires_grad=True)
        obg = opforge.tensor(b_np, requires_grad=True)
        txg = torch.tensor(x_np, requires_grad=True)
        twg = torch.tensor(w_np, requires_grad=True)
        tbg = torch.tensor(b_np, requires_grad=True)
        g_np = np.random.rand(4096, 4096).astype(np.float32)
        og, tg = opforge.from_numpy(g_np), torch.from_numpy(g_np)

        def o_step():
            of_fn(oxg, owg, obg).backward(og)

        def t_step():
            t_fn(txg, twg, tbg).backward(tg)

        t_o2, t_t2 = paired([o_step, t_step], 0.3, 5)
        rows.append(row("norms", f"{name} 4096×4096 forward+backward", t_o2, None, t_t2, "≤ 1.0× torch",
                        t_o2 <= t_t2))
        if name in ("layer_norm", "rms_norm"):  # frozen parameters: x's gradient alone (if_needs)
            def o_frozen():
                of_fn(oxg, ow, ob).backward(og)

            def t_frozen():
                t_fn(txg, tw, tb).backward(tg)

            t_o3, t_t3 = paired([o_frozen, t_frozen], 0.3, 5)
            rows.append(row("norms", f"{name} 4096×4096 forward+backward, parameters frozen", t_o3, None, t_t3,
                            "≤ 1.0× torch", t_o3 <= t_t3))
    return rows


def matmul() -> list[dict]:
    """float32 GEMMs of every size, against NumPy's OpenBLAS and torch: square matmuls (GFLOP/s)
    and linear on the MLP's shapes against NumPy's x @ w.T (time)."""
    if not hasattr(ops, "matmul"):
        return [row("matmul", "matmul float32", None, note="op not available")]
    rng = np.random.default_rng(0)
    rows = []
    for n in (64, 128, 256, 512, 1024, 2048, 4096):
        a, b = rng.random((n, n), np.float32), rng.random((n, n), np.float32)
        oa, ob = opforge.from_numpy(a), opforge.from_numpy(b)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        gflop = 2 * n ** 3 / 1e3  # per µs: GFLOP/s
        min_time = 0.05 if n < 1024 else 0.3
        t_o, t_n, t_t = paired([lambda: ops.matmul(oa, ob), lambda: a @ b, lambda: ta @ tb], min_time,
                               9 if n < 4096 else 5)
        rows.append(row("matmul", f"matmul {n}² float32", gflop / t_o, gflop / t_n, gflop / t_t,
                        "≥ 0.9× NumPy GFLOP/s", t_o <= t_n / 0.9, unit="GFLOP/s"))
    for batch, n_in, n_out in ((64, 512, 512), (64, 784, 256), (64, 784, 512), (1024, 512, 512)):
        x = rng.standard_normal((batch, n_in), np.float32)
        w = rng.standard_normal((n_out, n_in), np.float32)
        ox, ow = opforge.from_numpy(x), opforge.from_numpy(w)
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        F = torch.nn.functional
        t_o, t_n, t_t = paired([lambda: ops.linear(ox, ow), lambda: x @ w.T, lambda: F.linear(tx, tw)], 0.05)
        rows.append(row("matmul", f"linear ({batch}×{n_in}) by ({n_out}×{n_in})ᵀ", t_o, t_n, t_t,
                        "≥ 0.9× NumPy x @ w.T (time ≤ NumPy / 0.9)", t_o <= t_n / 0.9))
    return rows


def mlp() -> list[dict]:
    needed = ("linear", "gelu", "cross_entropy")
    if not all(hasattr(ops, n) for n in needed):
        return [row("mlp", "MLP training step", None, note=f"needs ops {', '.join(needed)}")]
    rows = []
    rng = np.random.default_rng(0)
    sizes = [(784, 512), (512, 512), (512, 10)]
    for batch, target in ((64, 1.0), (1024, 1.0)):
        x_np = rng.standard_normal((batch, 784)).astype(np.float32)
        y_np = rng.integers(0, 10, batch)
        init = [(rng.standard_normal((o, i)).astype(np.float32) * 0.05, np.zeros(o, np.float32))
                for i, o in sizes]
        lr = 0.01
        # torch, with torch.optim.SGD (its default foreach update)
        tparams = [torch.tensor(a, requires_grad=True) for w, b in init for a in (w, b)]
        tx, ty = torch.from_numpy(x_np), torch.from_numpy(y_np)
        F = torch.nn.functional
        topt = torch.optim.SGD(tparams, lr=lr)

        def t_step():
            h = tx
            for k in range(3):
                h = F.linear(h, tparams[2 * k], tparams[2 * k + 1])
                if k < 2:
                    h = F.gelu(h)
            F.cross_entropy(h, ty).backward()
            topt.step()
            topt.zero_grad()

        # opforge: the same model, with opforge.optim.SGD (its fused in-place step, one foreach call
        # over every parameter)
        oparams = [opforge.tensor(a, requires_grad=True) for w, b in init for a in (w, b)]
        ox, oy = opforge.from_numpy(x_np), opforge.from_numpy(y_np)
        oopt = opforge.optim.SGD(oparams, lr=lr)

        def o_step():
            h = ox
            for k in range(3):
                h = ops.linear(h, oparams[2 * k], oparams[2 * k + 1])
                if k < 2:
                    h = ops.gelu(h)
            ops.cross_entropy(h, oy).backward()
            oopt.step()
            oopt.zero_grad()

        t_t, t_o = paired([t_step, o_step], 0.5, 7)
        rows.append(row("mlp", f"3-layer MLP training step, batch {batch}", t_o, None, t_t,
                        f"≤ {target}× torch", t_o <= target * t_t))
    return rows


def torch_ops() -> list[dict]:
    """opforge.torch ops vs the hand-written custom_op doing the same (benchmarks/torch_peers.py)
    vs torch's built-in op, in one process."""
    import opforge.torch as ot
    import torch_peers as peer

    F = torch.nn.functional
    rows = []

    def add(name: str, ours: float, hand: float, builtin: float, limit: float) -> None:
        """A row whose target is opforge.torch's time ≤ limit × the built-in's (issue 18, item 6)."""
        rows.append({"group": "torch", "table": "torch", "name": name, "opforge": ours, "custom_op": hand,
                     "builtin": builtin, "target": f"≤ {limit:.1f}× built-in", "met": ours <= limit * builtin})

    x, y = torch.randn(8), torch.randn(8)
    xr, yr = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    of_mul, of_gelu = ot.ops.mul.default, ot.ops.gelu.default
    # (each row's three timed in turn, paired: a drift of this shared machine's speed moves them alike)
    add("mul forward, 8 elements", *paired([lambda: of_mul(x, y), lambda: peer.mul(x, y),
                                            lambda: torch.mul(x, y)], 0.1), 2.0)
    add("mul forward+backward, 8 elements", *paired([lambda: of_mul(xr, yr).sum().backward(),
                                                     lambda: peer.mul(xr, yr).sum().backward(),
                                                     lambda: torch.mul(xr, yr).sum().backward()], 0.1), 1.5)
    add("gelu forward, 8 elements", *paired([lambda: of_gelu(x), lambda: peer.gelu(x), lambda: F.gelu(x)], 0.1), 2.0)
    add("gelu forward+backward, 8 elements", *paired([lambda: of_gelu(xr).sum().backward(),
                                                      lambda: peer.gelu(xr).sum().backward(),
                                                      lambda: F.gelu(xr).sum().backward()], 0.1), 1.5)

    # the MLP training step of the mlp group, as a torch model with each framework's ops
    rng = np.random.default_rng(0)
    sizes = [(784, 512), (512, 512), (512, 10)]
    for batch in (64, 1024):
        tx = torch.from_numpy(rng.standard_normal((batch, 784)).astype(np.float32))
        ty = torch.from_numpy(rng.integers(0, 10, batch))
        init = [(torch.randn(o, i) * 0.05, torch.zeros(o)) for i, o in sizes]

        def step_with(linear, gelu, cross_entropy):
            params = [p.clone().requires_grad_(True) for w, b in init for p in (w, b)]
            opt = torch.optim.SGD(params, lr=0.01)

            def step():
                h = tx
                for k in range(3):
                    h = linear(h, params[2 * k], params[2 * k + 1])
                    if k < 2:
                        h = gelu(h)
                loss = cross_entropy(h, ty)
                opt.zero_grad()
                loss.backward()
                opt.step()

            return step

        ours = step_with(ot.ops.linear.default, ot.ops.gelu.default, ot.ops.cross_entropy.default)
        hand = step_with(peer.linear, peer.gelu, peer.cross_entropy)
        builtin = step_with(F.linear, F.gelu, F.cross_entropy)
        add(f"3-layer MLP training step (torch.optim.SGD), batch {batch}", *paired([ours, hand, builtin], 0.5, 7), 1.2)
    return rows


def mindspore_ops() -> list[dict]:
    """opforge.mindspore primitives vs hand-written aot Custom ops doing the same
    (benchmarks/ms_peers.py) vs MindSpore's built-in op; PyNative, synchronous, one process."""
    import mindspore as ms
    from mindspore import Tensor
    from mindspore import ops as msops

    ms.set_device(device_target="CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    import ms_peers as peer

    import opforge.mindspore as om

    rows = []

    def add(name: str, ours: float, hand: float, builtin: float, twin: float) -> None:
        # twin: a second instance of the hand-written op in the same rounds (A/A control)
        rows.append({"group": "mindspore", "table": "mindspore", "name": name, "opforge": ours,
                     "custom_op": hand, "builtin": builtin, "target": "≤ 1.1× aot Custom",
                     "met": ours <= 1.1 * hand, "control": twin})

    for n in (8, 65536):
        x = Tensor(np.random.default_rng(0).standard_normal(n).astype(np.float32))
        y = Tensor(np.random.default_rng(1).standard_normal(n).astype(np.float32))
        add(f"mul forward, {n} elements", *paired([lambda: om.ops.mul(x, y), lambda: peer.mul(x, y),
                                                   lambda: msops.mul(x, y), lambda: peer.mul_twin(x, y)], 0.2))
        add(f"leaky_relu forward, {n} elements", *paired([lambda: om.ops.leaky_relu(x), lambda: peer.leaky_relu(x),
                                                          lambda: msops.leaky_relu(x, 0.01),
                                                          lambda: peer.leaky_relu_twin(x)], 0.2))
    x = Tensor(np.random.default_rng(0).standard_normal(8).astype(np.float32))
    y = Tensor(np.random.default_rng(1).standard_normal(8).astype(np.float32))
    g_ours = ms.grad(lambda a, b: om.ops.mul(a, b).sum(), grad_position=(0, 1))
    g_hand = ms.grad(lambda a, b: peer.mul(a, b).sum(), grad_position=(0, 1))
    g_builtin = ms.grad(lambda a, b: msops.mul(a, b).sum(), grad_position=(0, 1))
    g_twin = ms.grad(lambda a, b: peer.mul_twin(a, b).sum(), grad_position=(0, 1))
    add("mul forward+backward (ms.grad), 8 elements", *paired([lambda: g_ours(x, y), lambda: g_hand(x, y),
                                                               lambda: g_builtin(x, y), lambda: g_twin(x, y)], 0.3))
    return rows


def jax_ops() -> list[dict]:
    """opforge.jax ops vs a hand-written jax.ffi op calling the same kernel (benchmarks/jax_peers.py)
    vs jax.numpy, under jax.jit, one process; and examples/jax_mlp.py's training step (784 -> 512
    -> 10) with opforge ops vs the same model in jax.numpy."""
    import jax
    import jax.numpy as jnp
    import jax_peers as peer

    import opforge.jax as oj

    sys_path_examples()
    from jax_mlp import init, jnp_loss, loss_fn, sgd_step

    rows = []

    def add(name: str, ours: float, hand: Optional[float], builtin: float, target: str, met: bool) -> None:
        rows.append({"group": "jax", "table": "jax", "name": name, "opforge": ours, "custom_op": hand,
                     "builtin": builtin, "target": target, "met": met})

    for n in (8, 65536):
        x = jnp.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32))
        y = jnp.asarray(np.random.default_rng(1).standard_normal(n).astype(np.float32))
        ours, hand, builtin = jax.jit(oj.ops.mul), jax.jit(peer.mul), jax.jit(jnp.multiply)
        t = paired([lambda: ours(x, y).block_until_ready(), lambda: hand(x, y).block_until_ready(),
                    lambda: builtin(x, y).block_until_ready()], 0.2)
        add(f"mul under jax.jit, {n} elements", t[0], t[1], t[2], "≤ 1.0× jax.ffi by hand", t[0] <= t[1])
    # the handler's own cost per call, without jit's dispatch: a program of 256 chained calls (XLA
    # fuses jnp's chain into one loop: its column is that loop, not 256 calls)
    def chain(mul: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
        def f(a: Any) -> Any:
            for _ in range(256):
                a = mul(a, a)
            return a
        return jax.jit(f)

    x8 = jnp.ones(8, jnp.float32)
    fns = [chain(oj.ops.mul), chain(peer.mul), chain(jnp.multiply)]
    t = paired([lambda f=f: f(x8).block_until_ready() for f in fns], 0.2)
    add("mul, 8 elements, 256 calls in one jax.jit program: per call", *(v / 256 for v in t), "", None)
    t = paired([lambda: oj.ops.mul(x8, x8).block_until_ready(), lambda: jnp.multiply(x8, x8).block_until_ready()], 0.2)
    add("mul called eagerly (opforge.jax.ops.mul, jnp.multiply), 8 elements", t[0], None, t[1], "", None)
    for batch in (64, 1024):
        rng = np.random.default_rng(0)
        xb = jnp.asarray(rng.standard_normal((batch, 784)).astype(np.float32))
        labels = jnp.asarray(rng.integers(0, 10, batch).astype(np.int32))
        p_of, p_ref = init(784, 512, 10), init(784, 512, 10)
        ours, builtin = sgd_step(loss_fn, 0.1), sgd_step(jnp_loss, 0.1)
        t = paired([lambda: jax.block_until_ready(ours(p_of, xb, labels)),
                    lambda: jax.block_until_ready(builtin(p_ref, xb, labels))], 0.5, 7)
        add(f"MLP training step (examples/jax_mlp.py, 784-512-10, SGD in jax.jit), batch {batch}", t[0], None, t[1],
            "≤ 1.2× jax.numpy", t[0] <= 1.2 * t[1])
    return rows


def sys_path_examples() -> None:
    import sys
    from pathlib import Path

    examples = str(Path(__file__).resolve().parent.parent / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)


def run(name: str) -> list[dict]:
    return globals()[name]()
