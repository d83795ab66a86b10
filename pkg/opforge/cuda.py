"""opforge's CUDA devices, as ``torch.cuda`` names them.

    import opforge.cuda
    opforge.cuda.is_available()   # False in the cpu wheel, without a driver, or without a GPU
    opforge.cuda.device_count()
    opforge.cuda.synchronize()    # waits for the current device's queued work

The cu130 wheel (``-Dops_backend=cuda``) links the CUDA runtime; it imports and runs CPU ops on a
machine without a GPU or driver, and asking for a CUDA device there raises ``RuntimeError`` with
the runtime's reason (:func:`unavailable_reason`).
"""

from __future__ import annotations

from typing import Optional, Union

from opforge import _formulas
import opforge._C as _C

__all__ = ["is_available", "device_count", "synchronize", "unavailable_reason", "runtime_version"]


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
    name = "cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else str(device))
    _C._synchronize(name)
