"""What a formula's value is, as formulas are checked: its kind (a tensor, the outputs of a
multi-output call, a number, or a value of an attr type) and whether it may be absent (an optional
attr without a value). Error messages print a type as specs spell it ("optional list[int]")."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    TENSOR = "tensor"
    OUTPUTS = "outputs"        # of a multi-output op's call: a let binds them, .name selects one
    NUMBER = "number"          # a scalar computed from numbers (int or float as the language decides)
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    INT_LIST = "list[int]"
    FLOAT_LIST = "list[float]"
    EMPTY_LIST = "empty list"  # [] until the attr it is passed to gives its type


NUMBER_KINDS = frozenset({Kind.NUMBER, Kind.INT, Kind.FLOAT})
# the attr types elementwise (impl.expr) formulas compute with
EXPR_ATTR_KINDS = frozenset({Kind.INT, Kind.FLOAT, Kind.BOOL})


@dataclass(frozen=True)
class VType:
    """The type of a formula's value."""

    kind: Kind
    optional: bool = False  # may be absent: an optional attr, until if_given tests it

    def __str__(self) -> str:
        return f"optional {self.kind}" if self.optional else str(self.kind)

    @property
    def is_tensor(self) -> bool:
        return self.kind == Kind.TENSOR and not self.optional

    @property
    def is_number(self) -> bool:
        return self.kind in NUMBER_KINDS and not self.optional

    def given(self) -> VType:
        """The type inside if_given's first branch, where the value is present."""
        return VType(self.kind)


def attr_vtype(atype: str, optional: bool = False) -> VType:
    """The type of an attr's value; ``atype`` is its type as specs write it (an AttrType)."""
    return VType(Kind(str(atype)), optional)


TENSOR = VType(Kind.TENSOR)
OUTPUTS = VType(Kind.OUTPUTS)
NUMBER = VType(Kind.NUMBER)
INT = VType(Kind.INT)
FLOAT = VType(Kind.FLOAT)
BOOL = VType(Kind.BOOL)
STR = VType(Kind.STR)
INT_LIST = VType(Kind.INT_LIST)
FLOAT_LIST = VType(Kind.FLOAT_LIST)
EMPTY_LIST = VType(Kind.EMPTY_LIST)
