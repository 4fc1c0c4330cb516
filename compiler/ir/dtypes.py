"""Data types of the loop IR: names, widths and the promotion rule of binary operations.

A data type is a string in numpy's spelling (``"int8"``, ``"int32"``,
``"float32"``, ``"bool"``), so every back end and every numpy array agree on
it without a translation table.
"""

from __future__ import annotations

__all__ = [
    "INT_TYPES", "UINT_TYPES", "FLOAT_TYPES", "BOOL", "VOID", "DTypeError",
    "is_int", "is_signed", "is_float", "is_bool", "bits", "check_dtype", "promote", "int_range",
]

#: Signed integer types.
INT_TYPES = ("int8", "int16", "int32", "int64")
#: Unsigned integer types (used by back ends for operands such as VNNI's u8).
UINT_TYPES = ("uint8", "uint16", "uint32")
#: Floating-point types.
FLOAT_TYPES = ("float32", "float64")
#: The type of comparisons and logical operations.
BOOL = "bool"
#: The type of a call with no value (a barrier).
VOID = "void"

_ALL = INT_TYPES + UINT_TYPES + FLOAT_TYPES + (BOOL, VOID)


class DTypeError(TypeError):
    """An expression combines data types that do not go together."""


def check_dtype(dtype: str) -> str:
    """``dtype`` if it is a data type of the IR, else a `DTypeError` naming the allowed ones."""
    if dtype not in _ALL:
        raise DTypeError(f"unknown data type {dtype!r}; allowed: {', '.join(_ALL)}")
    return dtype


def is_int(dtype: str) -> bool:
    return dtype in INT_TYPES or dtype in UINT_TYPES


def is_signed(dtype: str) -> bool:
    return dtype in INT_TYPES


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_TYPES


def is_bool(dtype: str) -> bool:
    return dtype == BOOL


def bits(dtype: str) -> int:
    """Width in bits (1 for bool)."""
    if dtype == BOOL:
        return 1
    return int(dtype.lstrip("uintfloat"))


def int_range(dtype: str) -> tuple[int, int]:
    """Inclusive value range of an integer type."""
    n = bits(dtype)
    return (-(1 << (n - 1)), (1 << (n - 1)) - 1) if is_signed(dtype) else (0, (1 << n) - 1)


def promote(a: str, b: str, op: str = "operation") -> str:
    """The result type of a binary operation on ``a`` and ``b``.

    Equal types stay; integers of one signedness widen to the wider; floats
    widen to the wider. Mixing integers and floats (or signed and unsigned)
    is refused: the tensor expression must say which conversion it means
    with an explicit cast (``x.astype("float32")``)."""
    if a == b:
        return a
    if is_float(a) and is_float(b):
        return a if bits(a) >= bits(b) else b
    if is_int(a) and is_int(b) and is_signed(a) == is_signed(b):
        return a if bits(a) >= bits(b) else b
    raise DTypeError(f"{op} mixes {a} and {b}; cast one operand explicitly")
