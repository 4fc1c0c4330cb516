"""What every operator shares, on every target: the fused epilogue, its numpy
reference, and the compiled-operator handle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gemforge.hw.config import ALU_IMM_BITS

from ..errors import CompileError
from ..ir import Cast, Const, Expr, Max, Min, Shr, is_float
from ..te import clip

__all__ = ["OpError", "Epilogue", "CompiledOp", "reference_epilogue", "int8_clamp_steps", "out_size", "window_count",
           "four_pads", "pool_windows"]


def out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a window of ``kernel`` sliding by ``stride`` over ``size`` padded by ``padding``."""
    return (size + 2 * padding - kernel) // stride + 1


def window_count(size: int, kernel: int, stride: int, before: int, after: int, dilation: int = 1,
                 ceil_mode: bool = False) -> int:
    """How many windows of ``kernel`` taps ``dilation`` apart, sliding by ``stride``, fit
    ``size`` framed by ``before`` and ``after`` (ONNX's pooling rule; 0 when none does).

    ``ceil_mode`` counts a last, partial window too, unless it would start in the end
    padding: ONNX Runtime drops such a window (its output shape, not the ONNX shape
    inference's, which keeps it)."""
    span = (kernel - 1) * dilation + 1
    room = size + before + after - span
    if room < 0:
        return 0
    count = (-(-room // stride) if ceil_mode else room // stride) + 1
    if ceil_mode and (count - 1) * stride >= size + before:
        count -= 1
    return count


def four_pads(padding) -> tuple[int, int, int, int]:
    """Padding as ONNX orders it, (top, left, bottom, right), from an int (every side), a
    (height, width) pair (top = bottom, left = right) or four values."""
    if isinstance(padding, (tuple, list)):
        if len(padding) == 2:
            return int(padding[0]), int(padding[1]), int(padding[0]), int(padding[1])
        if len(padding) == 4:
            return tuple(int(p) for p in padding)
        raise OpError(f"padding is an int, a (height, width) pair or (top, left, bottom, right), not {padding!r}")
    return (int(padding),) * 4


def pool_windows(size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
                 padding: tuple[int, int, int, int], dilation: tuple[int, int] = (1, 1),
                 ceil_mode: bool = False) -> tuple[int, int]:
    """The (height, width) of pooling's output over a ``size`` image, checked as ONNX
    Runtime checks it: each side's padding below the window's taps, at least one window,
    and every window with a tap inside the image (taps far apart can straddle a small
    one, leaving a window with nothing to pool)."""
    out = []
    for axis in range(2):
        k, s, d, n = kernel[axis], stride[axis], dilation[axis], size[axis]
        before, after = padding[axis], padding[axis + 2]
        if max(before, after) >= k:
            raise OpError(f"padding {list(padding)} (top, left, bottom, right) must be smaller than the window "
                          f"{list(kernel)} on each side")
        count = window_count(n, k, s, before, after, d, ceil_mode)
        if count < 1:
            raise OpError(f"a {kernel[0]}x{kernel[1]} window (dilations {list(dilation)}) does not fit a "
                          f"{size[0]}x{size[1]} input with padding {list(padding)}")
        if d > 1:
            # Only a window reaching past the image can miss it: those within a span of either end.
            span = (k - 1) * d + 1
            edge = min(count, 2 * span // s + 2)
            for w in {*range(edge), *range(count - edge, count)}:
                start = w * s - before
                if not any(0 <= start + i * d < n for i in range(k)):
                    raise OpError(f"window {w} has no tap inside the input's {n} {('rows', 'columns')[axis]} "
                                  f"({k} taps {d} apart from {start}); give less padding or a smaller dilation")
        out.append(count)
    return out[0], out[1]


class OpError(CompileError):
    """An operator was called with shapes, dtypes or options it does not support."""


@dataclass(frozen=True)
class Epilogue:
    """What follows a reduction (dense, conv2d) in one fused pass.

    Integers: ``out = clip((acc + bias) >> shift, lo, hi)`` with ``lo = 0``
    under ReLU and −128 otherwise and ``hi`` 127 unless given (an int8 network's
    convolution followed by a Clip: ReLU6), as int8 (the accelerator's requantization;
    the shift is arithmetic); without ``shift`` the int32 ``acc + bias``
    (ReLU'd if asked) is the output. Floats: ``acc + bias``, ReLU'd if asked
    (no shift), then clipped to ``[lo, hi]`` where those are given (a float network's
    convolution followed by a Clip, ReLU6 among them)."""

    bias: bool = False
    shift: int | None = None
    relu: bool = False
    lo: float | None = None
    hi: float | None = None
    #: Floats: a tensor of the output's shape added before the ReLU (a residual add fused into
    #: the convolution that feeds it, `passes.fuse_residual_adds`).
    residual: bool = False

    def __post_init__(self) -> None:
        if self.shift is not None and (isinstance(self.shift, bool) or not isinstance(self.shift, int)
                                       or not 0 <= self.shift <= 31):
            raise OpError(f"shift must be an integer between 0 and 31, not {self.shift!r}")
        if self.shift is not None and self.lo is None and self.hi is not None:
            if isinstance(self.hi, bool) or not isinstance(self.hi, int) or \
                    not (0 if self.relu else -128) <= self.hi <= 127:
                raise OpError(f"an int8 epilogue's upper bound is an integer from {0 if self.relu else -128} to 127, "
                              f"not {self.hi!r}")
        elif (self.lo is None) != (self.hi is None) or (self.lo is not None and self.shift is not None):
            raise OpError("an epilogue's clip takes both bounds, and only without a shift (a float result); an "
                          "int8 one its upper bound alone")
        if self.residual and self.shift is not None:
            raise OpError("a fused residual add applies to float32 results; an int8 one is an add of its own")

    def out_dtype(self, acc_dtype: str = "int32") -> str:
        """int8 after the shift and clip; otherwise the accumulator type."""
        return "int8" if self.shift is not None else acc_dtype

    def apply(self, acc: Expr, bias: Expr | None, residual: Expr | None = None) -> Expr:
        if self.shift is not None and is_float(acc.dtype):
            raise OpError("a shift (requantization) applies to integer results, not float32")
        value = acc
        if self.bias:
            value = value + bias
        if self.residual:
            value = value + residual
        if self.shift is not None:
            first, cap, rest = int8_clamp_steps(self.shift, 127 if self.hi is None else self.hi)
            if first:
                value = Shr(value, Const(first))
            if cap is not None:
                value = Min(value, Const(cap, value.dtype))
            if rest:
                value = Shr(value, Const(rest))
            value = Cast("int8", clip(value, 0 if self.relu else -128, 127))
        elif self.relu:
            value = Max(value, Const(0, value.dtype))
        if self.lo is not None:
            value = clip(value, self.lo, self.hi)         # as the Clip kernel computes it
        return value


#: The largest ALU immediate (signed, `ALU_IMM_BITS`), which an int8 epilogue's upper bound
#: becomes before the requantizing shift (`int8_clamp_steps`).
_IMM_MAX = (1 << (ALU_IMM_BITS - 1)) - 1


def int8_clamp_steps(shift: int, hi: int) -> tuple[int, int | None, int]:
    """``min(v >> shift, hi)`` as ``min(v >> first, cap) >> rest`` (``first + rest = shift``,
    floor shifts), or ``(0, None, shift)`` for ``hi = 127`` (the int8 clamp does it).

    Exact: ``v >> shift ≤ hi`` exactly when ``v >> first < (hi + 1) · 2^rest``. ``rest`` is the
    largest part of the shift for which ``cap`` fits the accelerator's 16-bit ALU immediate, so
    the accelerator runs ``>> first`` and ``min cap`` on its ALU and its requantizing STORE
    shifts by ``rest`` and clamps (`backends.accel.fusion`); the CPU computes the same steps."""
    if hi >= 127:
        return 0, None, shift
    rest = shift
    while rest and not -_IMM_MAX - 1 <= ((hi + 1) << rest) - 1 <= _IMM_MAX:
        rest -= 1
    return shift - rest, ((hi + 1) << rest) - 1, rest


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


