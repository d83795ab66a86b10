"""Objects a user can hand the runtime that it must refuse cleanly: uninitialized Tensor
objects, wrong .grad assignments, hostile DLPack capsules; the versioned DLPack protocol; the
create_graph reference-cycle warning."""

from __future__ import annotations

import copy
import ctypes
import gc
import re
import resource
import subprocess
import sys
import weakref
from typing import Any, Optional

import numpy as np
import pytest

import opforge
import opforge.cuda
from opforge import ops

# ---------------------------------------------------------------------------- uninitialized Tensor

NO_NEW = ("[Tensor] opforge.Tensor objects are made by opforge.tensor(), opforge.from_numpy(), opforge.from_dlpack() "
          "and the ops, not by Tensor() or Tensor.__new__()")


class Sub(opforge.Tensor):
    def __init__(self) -> None:  # what a user subclassing Tensor might write
        pass


def not_safe(base: str, cls: str) -> str:
    return f"{base}.__new__({cls}) is not safe, use opforge._C.Tensor.__new__()"


# Each route to an opforge.Tensor object with no tensor inside (before: such an object crashed
# every op it was passed to, whose fast path read the missing holder), and what it says now.
WAYS_TO_AN_EMPTY_TENSOR = {
    "Tensor.__new__": (lambda: opforge.Tensor.__new__(opforge.Tensor), NO_NEW),
    "Tensor()": (lambda: opforge.Tensor(), NO_NEW),
    "subclass.__new__": (lambda: Sub.__new__(Sub), NO_NEW),
    "subclass()": (lambda: Sub(), NO_NEW),
    "pybind11_object.__new__": (lambda: opforge.Tensor.__mro__[1].__new__(opforge.Tensor),
                                not_safe("pybind11_object", "opforge._C.Tensor")),
    "pybind11_object.__new__(subclass)": (lambda: opforge.Tensor.__mro__[1].__new__(Sub),
                                          not_safe("pybind11_object", "Sub")),
    "object.__new__": (lambda: object.__new__(opforge.Tensor), not_safe("object", "opforge._C.Tensor")),
    "copy.copy": (lambda: copy.copy(opforge.tensor([1.0])), "cannot pickle 'opforge._C.Tensor' object"),
}


@pytest.mark.parametrize("way", WAYS_TO_AN_EMPTY_TENSOR)
def test_no_tensor_object_without_a_tensor_inside(way: str) -> None:
    make, message = WAYS_TO_AN_EMPTY_TENSOR[way]
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        ops.neg(make())


# ---------------------------------------------------------------------------- .grad assignment


def test_grad_assignment_is_checked_like_pytorch() -> None:
    x = opforge.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=re.escape("[grad] assigned grad has shape (3,) but the tensor has shape (2, 3)")):
        x.grad = np.ones(3)
    with pytest.raises(TypeError, match=re.escape("[grad] assigned grad has dtype float32 but the tensor has dtype float64")):
        x.grad = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=re.escape("[grad] a tensor cannot be its own grad")):
        x.grad = x
    with pytest.raises(TypeError, match=re.escape("[grad] input 'grad' must be a tensor, NumPy array, DLPack producer "
                                                  "or capsule, got str")):
        x.grad = "g"
    assert x.grad is None  # nothing was stored by the refused assignments
    x.grad = np.full((2, 3), 2.0)
    ops.sum(x).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 3.0))
    x.grad = None
    assert x.grad is None


# ---------------------------------------------------------------------------- DLPack capsules


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


# private prototypes of the C API (setting restype on ctypes.pythonapi's would change it for all)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


class Capsule:
    """A DLPack capsule over `array`'s memory, made field by field (so each can be wrong)."""

    def __init__(self, array: np.ndarray, versioned: bool = True, *, major: int = 1, flags: int = 0,
                 ndim: Optional[int] = None, shape: Optional[list[int]] = None,
                 strides: Optional[list[int]] = None, byte_offset: int = 0, data: Optional[int] = None,
                 device: int = 1, dtype: tuple[int, int, int] = (2, 64, 1), no_shape: bool = False) -> None:
        self.array = array
        self.deleted = 0
        shape = list(array.shape) if shape is None else shape
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
        self.managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
        if versioned:
            self.managed.version = DLPackVersion(major, 0)
            self.managed.flags = flags
        dl = self.managed.dl_tensor
        dl.data = array.ctypes.data if data is None else data
        dl.device = DLDevice(device, 0)
        dl.ndim = len(shape) if ndim is None else ndim
        dl.dtype = DLDataType(*dtype)
        dl.shape = None if no_shape else ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        dl.strides = None if self.strides is None else ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        dl.byte_offset = byte_offset

        def deleter(_: int) -> None:
            self.deleted += 1

        self.deleter = DELETER(deleter)
        self.managed.deleter = self.deleter
        self.name = b"dltensor_versioned" if versioned else b"dltensor"
        self.capsule = _capsule_new(ctypes.addressof(self.managed), self.name, None)

    def capsule_name(self) -> str:
        return _capsule_name(self.capsule).decode()


@pytest.mark.parametrize("versioned", [True, False])
def test_capsule_is_consumed_once_and_freed_once(versioned: bool) -> None:
    a = np.arange(6.0).reshape(2, 3)
    c = Capsule(a, versioned)
    t = opforge.from_dlpack(c.capsule)
    assert c.capsule_name() == ("used_dltensor_versioned" if versioned else "used_dltensor")
    assert np.shares_memory(t.numpy(), a) and t.numpy().flags.writeable
    np.testing.assert_array_equal(t.numpy(), a)
    with pytest.raises(ValueError, match=re.escape("[from_dlpack] input 'x': this DLPack capsule was already consumed")):
        opforge.from_dlpack(c.capsule)
    with pytest.raises(ValueError, match=re.escape("[add] input 'y': this DLPack capsule was already consumed")):
        ops.add(np.ones(1), c.capsule)
    assert c.deleted == 0
    del t
    gc.collect()
    assert c.deleted == 1


def test_versioned_capsule_read_only_flag_makes_a_read_only_tensor() -> None:
    a = np.arange(4.0)
    c = Capsule(a, flags=1)  # DLPACK_FLAG_BITMASK_READ_ONLY
    t = opforge.from_dlpack(c.capsule)
    assert not t.numpy().flags.writeable and memoryview(t).readonly
    with pytest.raises(ValueError, match="read-only"):
        t.numpy()[0] = 1.0
    np.testing.assert_array_equal(ops.add(t, 1.0).numpy(), a + 1)


X = "input 'x'"
BAD_CAPSULES = [
    (dict(major=2), ValueError, f"{X}: DLPack version 2.0 is not supported (opforge reads version 1.x)"),
    (dict(major=0), ValueError, f"{X}: DLPack version 0.0 is not supported (opforge reads version 1.x)"),
    (dict(ndim=-1), ValueError, f"{X}: the DLPack tensor has ndim -1; opforge takes 0 to 64"),
    (dict(ndim=1 << 30), ValueError, f"{X}: the DLPack tensor has ndim 1073741824; opforge takes 0 to 64"),
    (dict(no_shape=True), ValueError, f"{X}: the DLPack tensor has no shape"),
    (dict(shape=[2, -3]), ValueError, f"{X}: the DLPack shape (2, -3) has a negative size"),
    (dict(shape=[1 << 40, 1 << 40]), ValueError, "shape (1099511627776, 1099511627776) has too many elements"),
    (dict(shape=[4], strides=[1 << 62]), ValueError,
     f"{X}: the DLPack strides (4611686018427387904,) (byte offset 0) reach outside the address space for shape (4,)"),
    (dict(shape=[4], strides=[-(1 << 62)]), ValueError,
     f"{X}: the DLPack strides (-4611686018427387904,) (byte offset 0) reach outside the address space for shape "
     "(4,)"),
    (dict(byte_offset=(1 << 64) - 8), ValueError,
     f"{X}: the DLPack strides (1,) (byte offset 18446744073709551608) reach outside the address space for shape (4,)"),
    (dict(byte_offset=3), ValueError, f"{X}: the DLPack data (byte offset 3) is not aligned to its 8-byte elements"),
    (dict(data=0), ValueError, f"{X}: the DLPack tensor has a null data pointer"),
    (dict(device=7), TypeError, f"{X} lives on DLPack device type 7; opforge reads CPU (1), CUDA host (3) and, in "
                                f"builds with cuda (targets: {opforge._C.built_targets}), CUDA (2) memory"),
    (dict(dtype=(2, 64, 4)), TypeError, f"{X} has an unsupported DLPack dtype (code 2, 64 bits, 4 lanes); supported "
                                        "dtypes: bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, "
                                        "float64"),
]


@pytest.mark.parametrize("fields, error, message", BAD_CAPSULES, ids=[str(f) for f, _, _ in BAD_CAPSULES])
def test_hostile_capsules_are_refused_and_left_to_their_producer(fields: dict, error: type, message: str) -> None:
    # (before: read through whatever the capsule said, or crashed on it)
    for versioned in ([True] if "major" in fields else [True, False]):  # a legacy capsule has no version
        c = Capsule(np.arange(4.0), versioned, **fields)
        with pytest.raises(error, match=f"^{re.escape('[from_dlpack] ' + message)}$"):
            opforge.from_dlpack(c.capsule)
        assert c.capsule_name() == c.name.decode() and c.deleted == 0  # not consumed: still the producer's


@pytest.mark.skipif(opforge.cuda.is_available(), reason="a CUDA device is present: the device tests cover kDLCUDA")
def test_cuda_capsules_need_a_cuda_device() -> None:
    # device type 2 (kDLCUDA): memory opforge may only touch through a CUDA runtime and device
    c = Capsule(np.arange(4.0), True, device=2)
    with pytest.raises(RuntimeError, match=r"^\[from_dlpack\] device 'cuda:0': "):
        opforge.from_dlpack(c.capsule)
    assert c.capsule_name() == c.name.decode() and c.deleted == 0


def test_an_empty_capsule_may_have_no_data() -> None:
    c = Capsule(np.arange(4.0), shape=[0, 3], data=0)
    t = opforge.from_dlpack(c.capsule)
    assert t.shape == (0, 3) and ops.sum(t).item() == 0.0


# ---------------------------------------------------------------------------- the versioned protocol


class Producer:
    """A DLPack producer forwarding to a tensor's __dlpack__, recording what it was asked."""

    def __init__(self, t: Any, takes_max_version: bool = True) -> None:
        self.t, self.takes_max_version = t, takes_max_version
        self.asked: list[dict] = []
        self.capsules: list[Any] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        if not self.takes_max_version and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.capsules.append(self.t.__dlpack__(**kwargs))
        return self.capsules[-1]

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.t.__dlpack_device__()


def read_only_tensor() -> tuple[Any, np.ndarray]:
    a = np.arange(4.0)
    a.setflags(write=False)
    return opforge.from_numpy(a), a


def test_from_dlpack_asks_for_the_versioned_capsule_and_keeps_read_only_zero_copy() -> None:
    t, a = read_only_tensor()
    p = Producer(t)
    u = opforge.from_dlpack(p)
    assert p.asked == [{"max_version": (1, 0)}]
    assert np.shares_memory(u.numpy(), a) and not u.numpy().flags.writeable
    v = ops.add(Producer(t), 0.0)  # op inputs take the same road
    np.testing.assert_array_equal(v.numpy(), a)


def test_from_dlpack_falls_back_for_producers_without_max_version() -> None:
    t, a = read_only_tensor()
    p = Producer(t, takes_max_version=False)
    u = opforge.from_dlpack(p)
    assert p.asked == [{"max_version": (1, 0)}, {}]
    # the legacy capsule cannot say read-only: the producer hands out a copy
    np.testing.assert_array_equal(u.numpy(), a)
    assert not np.shares_memory(u.numpy(), a)


def test_dlpack_export_flags_and_arguments() -> None:
    t, a = read_only_tensor()
    for kwargs in ({}, {"max_version": (0, 8)}):
        with pytest.raises(BufferError, match=re.escape(
                "[__dlpack__] a read-only tensor can be exported without a copy only as a versioned capsule "
                "(max_version >= (1, 0)), which can say read-only; copy=False forbids the copy")):
            t.__dlpack__(copy=False, **kwargs)
    with pytest.raises(TypeError, match=re.escape("[__dlpack__] max_version must be a tuple (major, minor) of ints, "
                                                  "got [1, 0]")):
        t.__dlpack__(max_version=[1, 0])
    with pytest.raises(BufferError, match=re.escape("[__dlpack__] cannot export to DLPack device (2, 0); the tensor "
                                                    "is on (1, 0) (cpu)")):
        t.__dlpack__(dl_device=(2, 0))
    # the flags as a consumer reads them
    for kwargs, flags in (({}, 1), ({"copy": True}, 2)):
        cap = t.__dlpack__(max_version=(1, 0), **kwargs)
        m = DLManagedTensorVersioned.from_address(_capsule_pointer(cap, b"dltensor_versioned"))
        assert (m.version.major, m.version.minor, m.flags) == (1, 0, flags)
        u = opforge.from_dlpack(cap)
        assert u.numpy().flags.writeable == (flags == 2)
        assert np.shares_memory(u.numpy(), a) == (flags == 1)


def test_torch_tensors_come_through_the_versioned_protocol() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
    x = torch.arange(6.0).reshape(2, 3)[:, 1:]
    p = Producer(x)
    t = opforge.from_dlpack(p)
    assert p.asked == [{"max_version": (1, 0)}] and _capsule_name(p.capsules[0]) == b"used_dltensor_versioned"
    x[0, 0] = 100.0
    assert t.shape == (2, 2) and t.numpy()[0, 0] == 100.0 and t.numpy().flags.writeable
    assert np.shares_memory(t.numpy(), opforge.from_dlpack(x).numpy())


def test_wrapped_ndarrays_are_released_by_the_last_tensor_on_them() -> None:
    """An ndarray input is held by its tensor's storage: not after a call that only read it, until
    the last view of it goes otherwise, whichever thread drops it (the GIL is taken if needed)."""
    import threading

    a = np.arange(6.0).reshape(2, 3)
    alive = weakref.ref(a)
    ops.mul(a, a)
    ops.sum(a)
    refs = sys.getrefcount(a)
    for _ in range(100):
        ops.mul(a, 2.0)
    assert sys.getrefcount(a) == refs
    held = opforge.from_numpy(a)
    del a
    assert alive() is not None
    view = held.numpy()
    del held

    def drop(box: list) -> None:
        box.clear()  # the last reference, dropped in another thread

    box = [opforge.from_numpy(view)]
    del view
    assert alive() is not None
    t = threading.Thread(target=drop, args=(box,))
    t.start()
    t.join()
    gc.collect()
    assert alive() is None


# ---------------------------------------------------------------------------- create_graph cycle

CYCLE_WARNING = ("[backward] backward(create_graph=True) makes each leaf's .grad hold a graph that refers back to "
                 "the leaf: a reference cycle that keeps both alive (a memory leak) until .grad is reset to None; "
                 "opforge.gradients(..., create_graph=True) gives the same gradients without touching .grad")


def test_backward_with_create_graph_warns_of_the_cycle_and_grad_none_breaks_it() -> None:
    a = np.array([1.0, 2.0])
    alive = weakref.ref(a)  # x's memory: freed only when x is
    x = opforge.from_numpy(a)
    del a
    x.requires_grad = True
    with pytest.warns(UserWarning, match=re.escape(CYCLE_WARNING)):
        ops.sum(ops.mul(ops.mul(x, x), x)).backward(create_graph=True)
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 12.0])
    assert x.grad.requires_grad
    x.grad = None  # what the warning says to do
    del x
    gc.collect()
    assert alive() is None
    # opforge.gradients leaves .grad alone: nothing to warn about, nothing kept
    b = np.array([1.0, 2.0])
    alive = weakref.ref(b)
    y = opforge.from_numpy(b)
    del b
    y.requires_grad = True
    (g,) = opforge.gradients(ops.sum(ops.mul(ops.mul(y, y), y)), y, create_graph=True)
    np.testing.assert_array_equal(g.numpy(), [3.0, 12.0])
    del g, y
    gc.collect()
    assert alive() is None


# ---------------------------------------------------------------------------- None for a tensor

# pybind11 loads None into a tensor argument as a null pointer, and takes None as the self of a
# method called through the class: each of these dereferenced it (SIGSEGV); now each is a TypeError.
NONE_AS_A_TENSOR = {
    "Tensor.numpy(None)": lambda: opforge.Tensor.numpy(None),
    "Tensor.item(None)": lambda: opforge.Tensor.item(None),
    "Tensor.detach(None)": lambda: opforge.Tensor.detach(None),
    "Tensor.__float__(None)": lambda: opforge.Tensor.__float__(None),
    "Tensor.__bool__(None)": lambda: opforge.Tensor.__bool__(None),
    "Tensor.cpu(None)": lambda: opforge.Tensor.cpu(None),
    "Tensor.ndim.fget(None)": lambda: opforge.Tensor.ndim.fget(None),
    "Tensor.size.fget(None)": lambda: opforge.Tensor.size.fget(None),
    "Tensor.grad.fget(None)": lambda: opforge.Tensor.grad.fget(None),
    "Tensor.is_leaf.fget(None)": lambda: opforge.Tensor.is_leaf.fget(None),
    "Tensor.requires_grad.fset(None, True)": lambda: opforge.Tensor.requires_grad.fset(None, True),
    "Tensor._version.fget(None)": lambda: opforge.Tensor._version.fget(None),
    "_C._zeros_like(None)": lambda: opforge._C._zeros_like(None),
    "_C._tangent(None)": lambda: opforge._C._tangent(None),
    "_C._run_backward([None], ...)": lambda: opforge._C._run_backward([None], [None], False, False, [], True),
    "_Graph.replay(None)": lambda: opforge._C._Graph.replay(None),
}


@pytest.mark.parametrize("call", NONE_AS_A_TENSOR)
def test_none_where_a_tensor_is_expected_raises_type_error(call: str) -> None:
    with pytest.raises(TypeError, match="incompatible function arguments"):
        NONE_AS_A_TENSOR[call]()


def test_gradients_names_a_none_among_its_tensors() -> None:
    w = opforge.tensor(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(TypeError, match=re.escape("[gradients] inputs[1] must be an opforge Tensor, got NoneType")):
        opforge.gradients(ops.sum(w), [w, None])
    with pytest.raises(TypeError, match=re.escape("[gradients] outputs[1] must be an opforge Tensor, got NoneType")):
        opforge.gradients([ops.sum(w), None], w)
    (g,) = opforge.gradients(ops.sum(w), [w])  # (the lists as they should be still work)
    np.testing.assert_array_equal(g.numpy(), np.ones(3, np.float32))


# ---------------------------------------------------------------------------- __class__ assignment


def test_tensor_and_graph_types_are_immutable() -> None:
    # Tensor and _Graph have instances of one size: CPython allowed `t.__class__ = _Graph` between
    # mutable types, and each then read the other's C++ object as its own (SIGSEGV, garbage shapes)
    t = opforge.tensor(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="__class__ assignment only supported for mutable types"):
        t.__class__ = opforge._C._Graph  # type: ignore[assignment]
    g = opforge._C._Graph.__new__(opforge._C._Graph)
    with pytest.raises(TypeError, match="__class__ assignment only supported for mutable types"):
        g.__class__ = opforge.Tensor
    with pytest.raises(TypeError, match="immutable type"):
        opforge.Tensor.shape = property(lambda self: (1,))  # type: ignore[method-assign,assignment]
    # what opforge adds in Python (operators, to, sum) is there before the type is sealed
    np.testing.assert_array_equal((t + t).numpy(), [2.0, 2.0, 2.0])
    assert float(t.sum()) == 3.0


# ---------------------------------------------------------------------------- freeing a deep graph


DEEP_GRAPH = """
import numpy as np, opforge
from opforge import ops
x = opforge.tensor(np.ones(1, np.float32), requires_grad=True)
y = x
for _ in range(30_000):  # a loss accumulated over many steps without detach()
    y = ops.mul(y, 1.0)
del y  # frees 30,000 nodes, each owning the one before it
z = x
for _ in range(20_000):  # and a chain whose nodes save their inputs (mul of two tensors)
    z = ops.mul(z, x)
ops.sum(z).backward()
del z
print("freed", float(x.grad.numpy()[0]))
"""


def _small_stack() -> None:
    # the child's main thread gets a 512 KiB stack (its size is read from the limit at exec): a
    # recursive free takes at least 42 bytes a node (it overflowed 8 MiB at 200,000 nodes), 1.2 MB
    # for 30,000, so tens of thousands of ops show it (a sanitized -O0 build runs them in seconds,
    # where 500,000 took minutes)
    resource.setrlimit(resource.RLIMIT_STACK, (1 << 19, resource.getrlimit(resource.RLIMIT_STACK)[1]))


def test_freeing_a_deep_graph_does_not_overflow_the_stack() -> None:
    # each node's destructor freed the node before it: one stack frame per op (SIGSEGV at 200,000)
    r = subprocess.run([sys.executable, "-c", DEEP_GRAPH], capture_output=True, text=True, timeout=300,
                       preexec_fn=_small_stack)
    assert r.returncode == 0 and r.stdout.strip() == "freed 20001.0", (r.returncode, r.stdout, r.stderr[-2000:])


# The old .grad's release runs Python code (a finalizer, an ndarray subclass's __del__) that reads
# .grad or runs backward through the same leaf: it ran under .grad's lock (set_grad) and under
# backward's node lock (AccumulateGrad), and the process hung (3 of 3 runs each).
GRAD_RELEASE_RUNS_PYTHON = """
import weakref, numpy as np, opforge
from opforge import ops
x = opforge.tensor(np.zeros(4, np.float32), requires_grad=True)
class Logged(np.ndarray):
    def __del__(self):
        print("freed, grad", x.grad, flush=True)
x.grad = np.ones(4, np.float32).view(Logged)
x.grad = None
w = opforge.tensor(np.ones(4, np.float32), requires_grad=True)
g = np.zeros(4, np.float32)
w.grad = g
def again():
    with opforge.enable_grad():
        ops.sum(ops.mul(w, 3.0)).backward()
weakref.finalize(g, again)
del g
ops.sum(ops.mul(w, 2.0)).backward()
print("grad", w.grad.numpy().tolist(), flush=True)
"""


def test_python_code_run_by_releasing_the_old_grad_does_not_deadlock() -> None:
    r = subprocess.run([sys.executable, "-c", GRAD_RELEASE_RUNS_PYTHON], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    # the finalizer's backward added 3 after the step's 2 (the step's sum replaced the old grad)
    assert r.stdout.split("\n")[:2] == ["freed, grad None", "grad [5.0, 5.0, 5.0, 5.0]"], r.stdout


# A process pool of the 'fork' start method (multiprocessing's default on Linux before Python
# 3.14) after the parent ran ops big enough to use OpenMP's threads: each child hung in libgomp on
# its first such op (5 runs of 5).
FORK_AFTER_THREADS = """
import concurrent.futures as cf, multiprocessing as mp, numpy as np, opforge
from opforge import ops

def work(i):
    a = np.full((256, 256), float(i), np.float32)
    x = opforge.tensor(np.full(1 << 18, float(i), np.float32), requires_grad=True)
    ops.sum(ops.exp(ops.mul(x, 0.0))).backward()
    return float(ops.sum(ops.matmul(a, a)).item()), float(x.grad.numpy()[0])

if __name__ == "__main__":
    print(work(1), flush=True)
    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as pool:
        print(list(pool.map(work, range(3), timeout=60)), flush=True)
    print(work(2), flush=True)  # (the parent keeps its threads)
"""


def test_children_forked_after_parallel_ops_run_ops(tmp_path) -> None:
    (tmp_path / "pool.py").write_text(FORK_AFTER_THREADS)
    r = subprocess.run([sys.executable, str(tmp_path / "pool.py")], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert r.stdout.split("\n")[:3] == ["(16777216.0, 0.0)", "[(0.0, 0.0), (16777216.0, 0.0), (67108864.0, 0.0)]",
                                         "(67108864.0, 0.0)"], r.stdout


# ---------------------------------------------------------------------------- interpreter exit


DAEMONS_AT_EXIT = """
import threading, time, numpy as np, opforge
from opforge import ops
a = np.random.rand(1 << 20).astype(np.float32)  # (large enough that the kernel runs without the GIL)
def work():
    while True:
        ops.exp(a)
        opforge.from_numpy(a)  # (a wrapper freed off the thread that made it)
for _ in range(2):
    threading.Thread(target=work, daemon=True).start()
time.sleep(0.3)
print("exiting")
"""


def test_daemon_threads_inside_ops_at_interpreter_exit() -> None:
    # CPython 3.11-3.13 end a thread that asks for the GIL after shutdown began with pthread_exit,
    # whose unwinding through pybind11's noexcept gil_scoped_release called std::terminate (SIGABRT
    # in 5 runs of 5); the thread now parks until the process ends, as NumPy's threads do
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", DAEMONS_AT_EXIT], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "exiting", (r.returncode, r.stdout, r.stderr[-2000:])


PYTHON_IN_OPS_AT_EXIT = """
import threading, time, numpy as np, opforge
from opforge import ops
a = np.ones((4, 4))
class Producer:  # (Python code run inside the op call, reading its argument)
    def __dlpack__(self, stream=None, **kw):
        s = 0
        for i in range(3000):
            s += i
        return a.__dlpack__()
    def __dlpack_device__(self):
        return a.__dlpack_device__()
b = np.random.rand(1500, 1500)
def work(k):
    while True:
        ops.add(Producer(), 1.0) if k % 2 else opforge.from_dlpack(Producer())
def gemm():  # (in OpenBLAS when the process exits: its teardown freed the buffers under it)
    while True:
        ops.matmul(b, b)
for k in range(4):
    threading.Thread(target=work, args=(k,), daemon=True).start()
threading.Thread(target=gemm, daemon=True).start()
time.sleep(0.2)
print("exiting")
"""


def test_daemon_threads_running_python_code_inside_ops_at_interpreter_exit() -> None:
    # the thread asked for the GIL inside the op's Python code: the forced unwind ran opforge's
    # destructors (Python objects freed without the GIL) and catch (...) handlers: SIGSEGV or
    # "FATAL: exception not rethrown" in 6 runs of 6; a thread in a matmul at exit: SIGSEGV in 2
    # runs of 3 (OpenBLAS's teardown). An atexit hook now lets such calls finish and parks the
    # threads before the interpreter finalizes
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", PYTHON_IN_OPS_AT_EXIT], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "exiting", (r.returncode, r.stdout, r.stderr[-2000:])
        assert "exception" not in r.stderr, r.stderr[-2000:]


HANDLERS_WAIT_FOR_OP_THREADS = """
import atexit, queue, threading, time
q, lock = queue.Queue(), threading.Lock()
def writer():  # (a daemon writer thread an atexit handler flushes and joins)
    while True:
        item = q.get()
        if item is None:
            return
        import opforge
        opforge.ops.add(item, item)
writer_thread = threading.Thread(target=writer, daemon=True)
writer_thread.start()
def flush():
    import opforge, numpy as np
    q.put(opforge.tensor(np.ones(3, np.float32)))
    q.put(None)
    writer_thread.join()
    print("flushed", flush=True)
def final():
    with lock:
        print("got the lock", flush=True)
atexit.register(flush)  # (registered before opforge's import: they run after its drain)
atexit.register(final)
import opforge, numpy as np
x = opforge.tensor(np.ones(3, np.float32))
def locked():
    while True:
        with lock:
            opforge.ops.add(x, x)
threading.Thread(target=locked, daemon=True).start()
time.sleep(0.2)
print("done", flush=True)
"""


def test_atexit_handlers_that_wait_for_threads_calling_ops_do_not_hang() -> None:
    # (the first drain parked every other thread at its next op call: a handler joining a daemon
    # writer, or taking a lock a daemon thread held while calling ops, hung the exit; found by review)
    r = subprocess.run([sys.executable, "-c", HANDLERS_WAIT_FOR_OP_THREADS], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert r.stdout.split("\n")[:3] == ["done", "got the lock", "flushed"], r.stdout


# ---------------------------------------------------------------------------- sizes


def test_a_shape_with_a_zero_dimension_must_still_fit_int64() -> None:
    # (0, 2**62, 2**62) is empty, but its strides are products of the other dimensions: the first
    # overflowed int64 (undefined behaviour); NumPy refuses it too ("array is too big")
    empty = opforge.tensor(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match=re.escape("has too many elements")):
        empty.reshape([0, 2**62, 2**62])
    assert empty.reshape([0, 2**30, 2**30]).shape == (0, 2**30, 2**30)  # (what fits is still fine)
    with pytest.raises(ValueError, match=re.escape("[_meta_tensor] shape (4294967296, 4294967296) has too many elements")):
        opforge._C._meta_tensor([2**32, 2**32], "float32")
    with pytest.raises(ValueError, match=re.escape("[_meta_tensor] negative dimension in shape (-1, 2)")):
        opforge._C._meta_tensor([-1, 2], "float32")
