"""Devices: Tensor.device, tensor(device=), opforge.cuda's queries and the errors where a device is
not there (the cpu wheel; the cu130 wheel on a machine without a driver or GPU: CI's case)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import opforge
import opforge.cuda

no_gpu = pytest.mark.skipif(opforge.cuda.is_available(), reason="a CUDA device is present: the device tests cover it")


def test_tensors_are_on_the_cpu() -> None:
    t = opforge.tensor(np.arange(3.0))
    assert t.device == "cpu" and opforge.ops.mul(t, t).device == "cpu"
    assert opforge.tensor([1.0], device="cpu").device == "cpu"


def test_to_its_own_device_is_the_tensor_itself_and_keeps_its_gradient() -> None:
    x = opforge.tensor(np.arange(3.0), requires_grad=True)
    assert x.to("cpu") is x and x.cpu() is x
    opforge.ops.sum(opforge.ops.mul(x.cpu(), x)).backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(3.0))


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda:99999", ""])
def test_unknown_device_names_are_value_errors(name: str) -> None:
    with pytest.raises(ValueError, match=r"\[tensor\] unknown device '.*': one of 'cpu', 'cuda', 'cuda:N'"):
        opforge.tensor([1.0], device=name)


@no_gpu
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_device_is_a_runtime_error_with_the_reason(name: str) -> None:
    with pytest.raises(RuntimeError) as e:
        opforge.tensor([1.0], device=name)
    text = str(e.value)
    assert text.startswith(f"[tensor] device '{name}': ")
    if opforge.cuda.is_built():  # the cu130 wheel: the runtime's own reason (no driver, no device)
        assert "no cuda device is available (" in text
    else:
        assert "this opforge was built without cuda (its wheel's targets: cpu)" in text
    with pytest.raises(RuntimeError, match=r"\[synchronize\] device 'cuda'"):
        opforge.cuda.synchronize()
    x = opforge.tensor([1.0], requires_grad=True)  # (a tensor that requires grad: the same error)
    with pytest.raises(RuntimeError, match=rf"\[to\] device '{name}': "):
        x.to(name)


@pytest.mark.parametrize("name", ["gpu", "cuda:x", ""])
def test_to_an_unknown_device_is_a_value_error(name: str) -> None:
    x = opforge.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match=r"\[to\] unknown device '.*': one of 'cpu', 'cuda', 'cuda:N'"):
        x.to(name)


@no_gpu
def test_cuda_queries_never_raise_without_a_device() -> None:
    assert opforge.cuda.is_available() is False and opforge.cuda.device_count() == 0
    reason = opforge.cuda.unavailable_reason()
    if opforge.cuda.is_built():
        assert reason and opforge.cuda.runtime_version().startswith("CUDA runtime 13")
    else:
        assert reason.endswith("the cuda wheel (opforge+cu130) has it") and opforge.cuda.runtime_version() == ""


def test_index_checks_setting_is_process_wide_and_typed() -> None:
    # (the CUDA kernels read it: tests/cuda/test_cuda_row_ops.py; any build can set it)
    assert opforge.cuda.index_checks() is True
    assert opforge.cuda.set_index_checks(False) is True
    try:
        seen = []
        t = threading.Thread(target=lambda: seen.append(opforge.cuda.index_checks()))
        t.start()
        t.join()
        assert seen == [False] and opforge.cuda.set_index_checks(False) is False
    finally:
        opforge.cuda.set_index_checks(True)
    assert opforge.cuda.index_checks() is True
    with pytest.raises(TypeError, match=r"set_index_checks: enabled must be a bool, got int"):
        opforge.cuda.set_index_checks(0)  # type: ignore[arg-type]
    assert opforge.cuda.set_index_checks(np.False_) is True  # (a NumPy bool: a bool)
    assert opforge.cuda.set_index_checks(np.True_) is False
    assert opforge.cuda.index_checks() is True
    # the host's checks do not depend on it
    opforge.cuda.set_index_checks(False)
    try:
        with pytest.raises(IndexError, match=r"\[embedding\] index 5 is out of range"):
            opforge.ops.embedding(np.array([5]), np.ones((5, 2)))
    finally:
        opforge.cuda.set_index_checks(True)


def test_the_build_says_its_targets() -> None:
    targets = opforge._formulas.BUILDS[opforge.backend].targets
    assert opforge._C.built_targets == ", ".join(targets) and opforge._formulas.BUILT_TARGETS == targets
    assert opforge.cuda.is_built() == ("cuda" in targets)


@no_gpu
def test_cuda_graphs_without_a_device_say_why() -> None:
    with pytest.raises(RuntimeError, match=r"\[CUDAGraph\] device 'cuda': "):
        opforge.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=r"\[CUDAGraph\] graphs capture device work: got cpu"):
        opforge._C._Graph("cpu")
    assert opforge.cuda.graph_memory() == 0
    with pytest.raises(RuntimeError, match=r"\[wait_stream\] device 'cuda:0': "):
        opforge._C._stream_wait(0, 0, 0)
