"""Every op generated from the specs, as ``opforge.ops.<name>(*inputs, **attrs)``.

Inputs may be opforge Tensors, NumPy arrays (and other buffer-protocol objects), DLPack
producers or Python scalars; ops always return opforge Tensors (a tuple of them for
multi-output ops) whose ``.numpy()`` is a zero-copy view.
"""

from typing import TYPE_CHECKING, Any

from opforge._C import ops as _ops

if TYPE_CHECKING:  # the ops are put here at import; in a build, the generated ops.pyi types each one
    def __getattr__(name: str) -> Any: ...


__all__ = sorted(n for n in dir(_ops) if not n.startswith("_"))
globals().update({n: getattr(_ops, n) for n in __all__})
