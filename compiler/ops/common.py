"""What every operator shares, on every target: the fused epilogue, its numpy
reference, and the compiled-operator handle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import CompileError
from ..ir import Cast, Const, Expr, Max, Shr, is_float
from ..te import clip

__all__ = ["OpError", "Epilogue", "CompiledOp", "reference_epilogue", "out_size"]


def out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a window of ``kernel`` sliding by ``stride`` over ``size`` padded by ``padding``."""
    return (size + 2 * padding - kernel) // stride + 1


class OpError(CompileError):
    """An operator was called with shapes, dtypes or options it does not support."""


@dataclass(frozen=True)
class Epilogue:
    """What follows a reduction (dense, conv2d) in one fused pass.

    Integers: ``out = clip((acc + bias) >> shift, lo, 127)`` with ``lo = 0``
    under ReLU and −128 otherwise, as int8 (the accelerator's requantization;
    the shift is arithmetic); without ``shift`` the int32 ``acc + bias``
    (ReLU'd if asked) is the output. Floats: ``acc + bias``, ReLU'd if asked
    (no shift)."""

    bias: bool = False
    shift: int | None = None
    relu: bool = False

    def __post_init__(self) -> None:
        if self.shift is not None and (isinstance(self.shift, bool) or not isinstance(self.shift, int)
                                       or not 0 <= self.shift <= 31):
            raise OpError(f"shift must be an integer between 0 and 31, not {self.shift!r}")

    def out_dtype(self, acc_dtype: str = "int32") -> str:
        """int8 after the shift and clip; otherwise the accumulator type."""
        return "int8" if self.shift is not None else acc_dtype

    def apply(self, acc: Expr, bias: Expr | None) -> Expr:
        if self.shift is not None and is_float(acc.dtype):
            raise OpError("a shift (requantization) applies to integer results, not float32")
        value = acc
        if self.bias:
            value = value + bias
        if self.shift is not None:
            if self.shift:
                value = Shr(value, Const(self.shift))
            value = Cast("int8", clip(value, 0 if self.relu else -128, 127))
        elif self.relu:
            value = Max(value, Const(0, value.dtype))
        return value


def reference_epilogue(acc: np.ndarray, bias: np.ndarray | None, shift: int | None, relu: bool,
                       channel_axis: int) -> np.ndarray:
    """numpy reference of `Epilogue` (int64 math, int32 wrap-around like the accumulator)."""
    value = acc.astype(np.int64)
    if bias is not None:
        shape = [1] * value.ndim
        shape[channel_axis] = -1
        value = value + bias.astype(np.int64).reshape(shape)
    value = ((value + (1 << 31)) % (1 << 32)) - (1 << 31)
    if shift is not None:
        value = np.clip(value >> shift, 0 if relu else -128, 127).astype(np.int8)
        return value
    if relu:
        value = np.maximum(value, 0)
    return value.astype(np.int32)


@dataclass
class CompiledOp:
    """A compiled operator: its artefact plus the host-side packing.

    ``program`` is what the target's back end built: a `Program` for the
    accelerator, a kernel for the CPU or GPU; every device runs it with
    ``device.run_program``. ``pack_inputs(**arrays)`` turns host arrays (numpy
    layouts) into the artefact's input tensors; ``unpack_output(array)`` turns
    its output tensor back into the host layout. ``plan`` records the choices
    the default schedule made."""

    name: str
    program: Any
    inputs: list[str]
    output: str
    pack: Callable[..., dict[str, np.ndarray]]
    unpack: Callable[[np.ndarray], np.ndarray]
    plan: dict[str, Any] = field(default_factory=dict)

    def pack_inputs(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.pack(**arrays)

    def unpack_output(self, array: np.ndarray) -> np.ndarray:
        return self.unpack(array)

    def run(self, device, **arrays: np.ndarray):
        """Pack, run on ``device``, unpack: returns (output, RunResult)."""
        outputs, result = device.run_program(self.program, self.pack_inputs(**arrays), [self.output])
        return self.unpack_output(outputs[self.output]), result


