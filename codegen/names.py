"""Names an op and its parts may take, and the one name each generated thing gets from its op."""

from __future__ import annotations

import keyword

CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export extern
false float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr
operator or or_eq private protected public register reinterpret_cast requires return short signed
sizeof static static_assert static_cast struct switch template this thread_local throw true try
typedef typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq
""".split())
# C++ type names visible where attrs become struct fields
CPP_TYPES = frozenset("""int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t std
TensorPtr TensorList Shape Axes DType Format Half BFloat16""".split())
# C and C++ standard library macros and names a generated TU sees (<cerrno>, <cassert>, <cstdio>, ...):
# as an identifier they expand or collide and the generated code stops compiling
C_LIBRARY_NAMES = frozenset("""errno assert NULL EOF stdin stdout stderr offsetof setjmp longjmp va_arg
va_start va_end va_copy va_list errno_t static_assert alignas alignof bool true false complex imaginary
noreturn thread_local isnan isinf isfinite signbit fpclassify math_errhandling issubnormal iszero
issignaling iscanonical isnormal alloca strdupa strndupa
FILE BUFSIZ EXIT_SUCCESS EXIT_FAILURE RAND_MAX SIZE_MAX INFINITY NAN HUGE_VAL MB_CUR_MAX
unix linux i386 main environ errno_location""".split())
RESERVED = (frozenset(keyword.kwlist) | CPP_KEYWORDS | CPP_TYPES | C_LIBRARY_NAMES
            | {"let", "self", "ctx", "attrs", "make_attrs"})
# op classes are CamelCase of the op name and live beside the runtime's own classes
RUNTIME_CLASSES = frozenset("""Tensor Storage Node Edge Function AutogradContext AccumulateGrad CppNode
GradMode GradModeGuard NoGradGuard TensorMeta OpInfo ArgInfo AttrInfo RowInfo TargetInfo CallInfo Error
TypeError ValueError IndexError RuntimeError Shape Format DType Device Half BFloat16 Axes MemoryError
TensorList TensorPtr AttrValue DeviceOptional DeviceRuntime DeviceType DimsOf UnknownShape FwGradMode
FwGradModeGuard StreamScope MetaLock CaptureKeeper CurrentOpScope BufferOffer BufferOfferScope
MatmulLayout DenseSpans AxisView NormRows WeightGradShape InputConverter SharedNumbers ReleaseGil
AcquireGil ShapeCall AttrSource RegisterOp OpEntry""".split())


def reserved_identifier(name: str) -> bool:
    """Whether C++ reserves name for the implementation: a double underscore anywhere, or a leading
    underscore followed by an uppercase letter."""
    return "__" in name or (len(name) > 1 and name[0] == "_" and name[1].isupper())


def class_name(op: str) -> str:
    """The generated C++ class of an op: CamelCase of its name (leaky_relu -> LeakyRelu)."""
    return "".join(p.capitalize() for p in op.split("_"))


def cpp_names(op: str) -> frozenset[str]:
    """The names an op's generated header declares in namespace opforge (templates/op.h.j2) beside
    its Function class: two ops whose sets meet cannot share a translation unit (one's formulas
    calling the other includes its header)."""
    cls = class_name(op)
    return frozenset({cls, f"{cls}Attrs", f"{cls}ExprArgs", f"{cls}Expr"})
