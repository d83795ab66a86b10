"""opforge's CUDA devices, as ``torch.cuda`` names them.

    import opforge.cuda
    opforge.cuda.is_available()   # False in the cpu wheel, without a driver, or without a GPU
    opforge.cuda.device_count()
    opforge.cuda.synchronize()    # waits for the current device's queued work
    x = opforge.tensor(np.ones(4, np.float32), device="cuda")
    with opforge.cuda.Stream():   # work and allocations of this thread go to that stream
        y = x.to("cpu")
    opforge.cuda.memory_allocated(), opforge.cuda.empty_cache()
    g = opforge.cuda.CUDAGraph()
    with opforge.cuda.graph(g):   # records the ops' kernels (on a side stream) instead of running them
        y = opforge.ops.softmax(x)
    g.replay()                    # reruns them: y holds the result for x's current contents

Memory comes from the driver's stream-ordered pool (cudaMallocAsync), which keeps freed blocks for
reuse on their stream: no cudaMalloc/cudaFree per tensor. Each thread has a current stream per
device, initially the legacy default stream (as in torch); ``ExternalStream(handle)`` wraps another
library's stream (``torch.cuda.current_stream().cuda_stream``) so opforge's work runs on it.

Graphs (:class:`CUDAGraph`, :class:`graph`: ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``'s
roles) capture the work one thread queues on one stream and replay it with one launch. During the
capture, tensors are allocated from the graph's own blocks (a block freed in the capture is reused
by the capture's later allocations), so results made in the capture are the replays' outputs, and
the graph keeps alive every tensor its work reads or writes until :meth:`CUDAGraph.reset` or its
deletion: a replay never touches freed memory. As in torch, new inputs are written into the tensors
the capture read (``x.copy_(new)``), and work that waits for the host (a copy to or from the host,
``.item()``, ``.cpu()``, a synchronize) fails inside a capture. Warm the ops up once before
capturing (cuBLAS makes its handles on first use).

The cu130 wheel (``-Dops_backend=cuda``) links the CUDA runtime; it imports and runs CPU ops on a
machine without a GPU or driver, and asking for a CUDA device there raises ``RuntimeError`` with
the runtime's reason (:func:`unavailable_reason`).
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from opforge import _formulas
import opforge._C as _C

__all__ = ["is_available", "is_built", "device_count", "synchronize", "unavailable_reason", "runtime_version",
           "memory_allocated", "empty_cache", "Stream", "ExternalStream", "current_stream", "set_stream",
           "CUDAGraph", "graph", "graph_memory", "set_index_checks", "index_checks"]


def _name(device: Optional[Union[str, int]]) -> str:
    return "cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else str(device))


def is_built() -> bool:
    """Whether this opforge was built with the cuda target (the cu130 wheel)."""
    return "cuda" in _formulas.BUILT_TARGETS


def device_count() -> int:
    """CUDA devices present (0 in the cpu wheel, without a driver, or without a device). Never raises."""
    return int(_C._device_count("cuda"))


def is_available() -> bool:
    """Whether CUDA tensors can be made: this wheel has the cuda target and a device is present."""
    return device_count() > 0


def unavailable_reason() -> str:
    """Why :func:`is_available` is False ("" when it is True): the wheel, the driver or the device."""
    if is_available():
        return ""
    reason = str(_C._device_unavailable_reason("cuda"))
    if not is_built():
        cuda = [b for b in _formulas.BUILDS.values() if "cuda" in b.targets]
        if cuda:
            reason += f"; the {cuda[0].backend} wheel (opforge+{cuda[0].wheel_label}) has it"
    return reason


def runtime_version() -> str:
    """The CUDA runtime's and the driver's versions ("" in the cpu wheel)."""
    return str(_C._device_runtime_version("cuda"))


def synchronize(device: Optional[Union[str, int]] = None) -> None:
    """Waits for all work queued on device (default: the current CUDA device). RuntimeError when no
    CUDA device is available."""
    _C._synchronize(_name(device))


def set_index_checks(enabled: Union[bool, np.bool_]) -> bool:
    """Whether the CUDA kernels that take indices (``cross_entropy``'s labels and its backward,
    ``embedding`` and its gradient, ``take_along_axis``, ``scatter_add_along_axis``) wait for the
    device after their work, to raise ``IndexError`` naming the op at the call when an index is out
    of range: ``True`` (the default) costs one host wait per such call, which drains the stream.
    ``False`` skips the wait and the error: a bad index still reads and writes nothing, and what it
    affects holds zeros or NaN (a NaN loss, a zero row), as always inside a CUDA graph capture.
    Process-wide (every thread and device); CPU kernels always check, at no such cost. Returns the
    previous setting. A Python or NumPy bool; anything else is a TypeError."""
    if not isinstance(enabled, (bool, np.bool_)):
        raise TypeError(f"set_index_checks: enabled must be a bool, got {type(enabled).__name__}")
    return bool(_C._set_sync_index_checks(bool(enabled)))


def index_checks() -> bool:
    """Whether the CUDA kernels that take indices raise ``IndexError`` at the call
    (:func:`set_index_checks`)."""
    return bool(_C._sync_index_checks())


def memory_allocated(device: Optional[Union[str, int]] = None) -> int:
    """Bytes of device memory held by opforge's live tensors on device (default: the current one;
    0 without a CUDA device)."""
    return int(_C._memory_allocated(_name(device)))


def empty_cache() -> None:
    """Gives the memory opforge's allocator keeps for reuse back to the driver (after waiting for
    the devices' queued work)."""
    _C._empty_cache("cuda")


class Stream:
    """A CUDA stream on device (default: the current device). ``with stream:`` makes it this
    thread's current stream on its device: opforge's copies, kernels and allocations there are
    ordered on it. Streams come from a pool and go back to it when the object is deleted."""

    def __init__(self, device: Optional[Union[str, int]] = None) -> None:
        self._index, self.cuda_stream = _C._create_stream(_name(device))
        self._owned = True
        self._previous: list[int] = []

    @property
    def device(self) -> str:
        return f"cuda:{self._index}"

    def synchronize(self) -> None:
        """Waits for the work queued on this stream."""
        _C._synchronize_stream(self._index, self.cuda_stream)

    def wait_stream(self, stream: "Stream") -> None:
        """Work queued on this stream from now on runs after the work queued on ``stream`` so far,
        as ``torch.cuda.Stream.wait_stream``: the device waits, the host does not. Inside a capture
        this forks a stream into it (a side stream waits for the capture's) and joins it back (the
        capture's stream waits for the side stream) before the capture ends. Both streams are on
        one device (ValueError otherwise)."""
        if not isinstance(stream, Stream):
            raise TypeError(f"wait_stream: expected an opforge.cuda.Stream, got {type(stream).__name__}")
        if stream._index != self._index:
            raise ValueError(f"wait_stream: the streams are on different devices ({self.device} waits for "
                             f"{stream.device}); a wait is between streams of one device")
        _C._stream_wait(self._index, self.cuda_stream, stream.cuda_stream)

    def __enter__(self) -> "Stream":
        self._previous.append(_C._current_stream(self.device)[1])
        _C._set_current_stream(self.device, self.cuda_stream)
        return self

    def __exit__(self, *exc: object) -> None:
        _C._set_current_stream(self.device, self._previous.pop())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and (other._index, other.cuda_stream) == (self._index, self.cuda_stream)

    def __hash__(self) -> int:
        return hash((self._index, self.cuda_stream))

    def __repr__(self) -> str:
        return f"<opforge.cuda.Stream device={self.device} cuda_stream={self.cuda_stream:#x}>"

    def __del__(self) -> None:
        if getattr(self, "_owned", False):
            _C._release_stream(self._index, self.cuda_stream)


class ExternalStream(Stream):
    """Another library's CUDA stream (a ``cudaStream_t`` as an int: ``torch.cuda.current_stream().cuda_stream``,
    CuPy's ``stream.ptr``), used as a Stream; opforge neither creates nor releases it. 0 is the
    legacy default stream."""

    def __init__(self, stream: int, device: Optional[Union[str, int]] = None) -> None:
        self._index = _C._current_stream(_name(device))[0]
        self.cuda_stream = int(stream)
        self._owned = False
        self._previous = []


def current_stream(device: Optional[Union[str, int]] = None) -> Stream:
    """This thread's current stream on device (default: the current device)."""
    index, handle = _C._current_stream(_name(device))
    return ExternalStream(handle, index)


def set_stream(stream: Stream) -> None:
    """Makes stream this thread's current stream on its device (``with stream:`` restores the previous one)."""
    _C._set_current_stream(stream.device, stream.cuda_stream)


def graph_memory(device: Optional[Union[str, int]] = None) -> int:
    """Bytes of device memory held by graphs' blocks on device (default: the current one; 0 without
    a CUDA device): what captures allocated, kept until their graphs are reset and the tensors made
    in them are gone."""
    return int(_C._graph_memory(_name(device)))


class CUDAGraph:
    """A CUDA graph of opforge's work on device (default: the current device), as
    ``torch.cuda.CUDAGraph``: :meth:`capture_begin` / :meth:`capture_end` around the work (usually
    through :class:`graph`), then :meth:`replay` as often as needed. RuntimeError without a CUDA
    device."""

    def __init__(self, device: Optional[Union[str, int]] = None) -> None:
        self._graph = _C._Graph(_name(device))

    @property
    def device(self) -> str:
        return str(self._graph.device)

    def capture_begin(self) -> None:
        """Starts recording the work this thread queues on its current stream on the graph's device,
        which must not be the legacy default stream (:class:`graph` makes a side stream)."""
        self._graph.capture_begin()

    def capture_end(self) -> None:
        """Ends the recording and makes the graph replayable; RuntimeError when the capture failed
        (something in it waited for the host)."""
        self._graph.capture_end()

    def replay(self) -> None:
        """Launches the captured work on this thread's current stream (no host wait)."""
        self._graph.replay()

    def reset(self) -> None:
        """Frees the captured graph, once the replays in flight are done, and what it kept alive; the
        graph's blocks still held by tensors go back when those tensors do. It can capture again. A
        capture under way is discarded (RuntimeError from another thread than the capturing one)."""
        self._graph.reset()

    def _abort(self) -> None:
        self._graph.capture_end(discard=True)

    def __repr__(self) -> str:
        return f"<opforge.cuda.CUDAGraph device={self.device}>"


class graph:
    """``with opforge.cuda.graph(g):`` captures the block's work into ``g`` (a :class:`CUDAGraph`), as
    ``torch.cuda.graph``: it waits for the device's queued work, then makes ``stream`` (default: a
    new side stream) current for the block. An exception in the block discards the capture (``g``
    can capture again)."""

    def __init__(self, cuda_graph: CUDAGraph, stream: Optional[Stream] = None) -> None:
        self.cuda_graph = cuda_graph
        self._stream = stream
        self._entered: Optional[Stream] = None

    def __enter__(self) -> CUDAGraph:
        synchronize(self.cuda_graph.device)
        stream = self._stream if self._stream is not None else Stream(self.cuda_graph.device)
        stream.__enter__()
        try:
            self.cuda_graph.capture_begin()
        except BaseException:
            stream.__exit__(None, None, None)
            raise
        self._entered = stream
        return self.cuda_graph

    def __exit__(self, exc_type: object, *exc: object) -> None:
        stream, self._entered = self._entered, None
        assert stream is not None
        try:
            if exc_type is not None:
                self.cuda_graph._abort()
            else:
                self.cuda_graph.capture_end()
        finally:
            stream.__exit__(None, None, None)
