"""The operators of ``gemforge run-op`` and ``gemforge compile-op``: their arguments, input
files and compilation, one table for both commands.

``run-op`` reads the input arrays and their type picks the arithmetic (int8
operands → int8 semantics with the epilogue flags; float32 → float32, with
``--relu`` and a float bias); ``compile-op`` takes shapes and ``--dtype``.
Either way the device names the target: ``fsim``/``verilator``/``icarus``
compile for the accelerator of ``--config``, ``cpu`` and ``gpu`` for the LLVM
back ends.
"""

from __future__ import annotations

import argparse
import math
import types
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["OPERATORS", "Operator", "OperatorUsageError", "load_inputs", "shapes_from_args", "compile_operator",
           "accel_dtype", "default_dtype"]


class OperatorUsageError(ValueError):
    """An operator's arguments or input files do not fit together."""


@dataclass(frozen=True)
class Operator:
    """One operator of the command line."""

    summary: str
    inputs: tuple[tuple[str, str, str], ...]   # (keyword, file option, description) of each array input
    rank: dict[str, int | None]                # expected rank of each input (None: any)
    epilogue: bool = False                     # --bias/--shift/--relu
    add_options: Callable[[argparse.ArgumentParser], None] | None = None
    accel: bool = True                         # has an accelerator version (else cpu and gpu only)


def _conv_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stride", type=_window_int, default=1, help="stride (default 1)")
    p.add_argument("--padding", type=_window_int, default=0, help="zero padding on each side (default 0)")
    p.add_argument("--groups", type=int, default=1, help="groups (grouped/depthwise; cpu and gpu; default 1)")


def _pool_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernel", type=int, help="window size (default: the whole image, global pooling)")
    p.add_argument("--stride", type=_window_int, help="stride (default: the window size)")
    p.add_argument("--padding", type=_window_int, default=0, help="padding on each side (default 0)")


def _clip_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min", type=float, required=True, dest="lo", help="lower bound")
    p.add_argument("--max", type=float, required=True, dest="hi", help="upper bound")


def _elementwise_epilogue(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shift", type=int, help="integers: arithmetic shift right, then clip to int8")
    p.add_argument("--relu", action="store_true", help="ReLU")


_X = ("x", "input", "X")

def _window_int(text: str) -> int:
    """A stride or padding: an integer of at most 31 bits (the generated code's indices are 64-bit)."""
    value = int(text)
    if abs(value) > (1 << 31) - 1:
        raise argparse.ArgumentTypeError(f"{text} is beyond 2,147,483,647")
    return value


OPERATORS: dict[str, Operator] = {
    "gemm": Operator("C = A @ B: A (M, K), B (K, N) int8 (the config's inp_width on the accelerator, int16 with "
                     "inp_width = 16; float32 on cpu/gpu); C int32 (float32)",
                     (("a", "a", "A: (M, K)"), ("b", "b", "B: (K, N)")), {"a": 2, "b": 2}),
    "dense": Operator("C = A @ B with a fused epilogue: int8 → clip((acc + bias) >> shift, lo, 127) as int8 "
                      "(lo = 0 with --relu, else -128), without --shift the int32 acc + bias; float32 → "
                      "acc + bias, ReLU'd with --relu",
                      (("a", "a", "A: (M, K)"), ("b", "b", "B: (K, N)")), {"a": 2, "b": 2}, epilogue=True),
    "conv2d": Operator("Y = conv2d(X, W): X NCHW, W OIHW (int8 or float32), bias per output channel; the "
                       "epilogue as for dense",
                       (_X, ("w", "weight", "W: (O, C/groups, KH, KW)")), {"x": 4, "w": 4}, epilogue=True,
                       add_options=_conv_options),
    "add": Operator("Y = X + Z (Z broadcast to X; integers: int32 math, --shift requantizes to int8)",
                    (_X, ("y", "other", "Z")), {"x": None, "y": None}, add_options=_elementwise_epilogue),
    "mul": Operator("Y = X * Z (Z broadcast to X; cpu and gpu)",
                    (_X, ("y", "other", "Z")), {"x": None, "y": None}, add_options=_elementwise_epilogue,
                    accel=False),
    "relu": Operator("Y = max(X, 0)", (_X,), {"x": None}),
    "clip": Operator("Y = min(max(X, min), max)", (_X,), {"x": None}, add_options=_clip_options),
    "max-pool": Operator("max pooling of NCHW X (padding never wins on cpu/gpu; zeros on the accelerator)",
                         (_X,), {"x": 4}, add_options=_pool_options),
    "avg-pool": Operator("average pooling of NCHW X (cpu and gpu; padding not counted)", (_X,), {"x": 4},
                         add_options=_pool_options, accel=False),
    "softmax": Operator("softmax of float32 X over its last axis (cpu)", (_X,), {"x": None}, accel=False),
}

_ACCUMULATOR_INPUTS = ("add", "relu", "clip", "max-pool")  # the accelerator's element-wise ops take int32


#: The inputs that are weights (typed by the config's wgt_width on the accelerator).
_WEIGHT_INPUTS = {"gemm": "b", "dense": "b", "conv2d": "w"}


def accel_dtype(op: str, config, key: str | None = None) -> str:
    """The type of ``op``'s input ``key`` (default: its data input) on the accelerator of ``config``."""
    if not OPERATORS[op].accel:
        raise OperatorUsageError(f"{op} runs on the cpu or gpu devices; the accelerator has no {op}")
    if op in _ACCUMULATOR_INPUTS:
        return f"int{config.acc_width}"
    return f"int{config.wgt_width if key is not None and key == _WEIGHT_INPUTS.get(op) else config.inp_width}"


def default_dtype(op: str, target) -> str:
    """The input type ``compile-op`` assumes without ``--dtype``."""
    if target.kind == "accel":
        return accel_dtype(op, target.config)
    return "float32" if op == "softmax" else "int8"


def load_inputs(args: argparse.Namespace, load_npy: Callable, config=None) -> dict[str, np.ndarray]:
    """The operator's input arrays from their .npy files (ranks checked, types agreeing).
    With an accelerator ``config`` every input must have the type the accelerator takes."""
    spec = OPERATORS[args.op]
    required = {key: None if config is None else np.dtype(accel_dtype(args.op, config, key))
                for key, _, _ in spec.inputs}
    arrays: dict[str, np.ndarray] = {}
    for key, option, what in spec.inputs:
        arrays[key] = load_npy(getattr(args, option), what.split(":")[0], required[key], spec.rank[key])
    first = arrays[spec.inputs[0][0]]
    allowed = ("int8", "int32", "float32") if args.op in ("add", "mul", "relu", "clip", "max-pool", "avg-pool") \
        else ("float32",) if args.op == "softmax" else ("int8", "float32")
    if config is not None:
        allowed = (required[spec.inputs[0][0]].name,)   # the accelerator's widths decide (int16 inputs, say)
    if first.dtype.name not in allowed:
        raise OperatorUsageError(f"{spec.inputs[0][2].split(':')[0]} must be {' or '.join(allowed)}, but "
                                 f"{getattr(args, spec.inputs[0][1])} holds {first.dtype.name}")
    for key, option, what in spec.inputs[1:]:
        if config is not None:
            continue                    # each typed by its width above (weights may differ from data)
        if arrays[key].dtype != first.dtype:
            raise OperatorUsageError(f"{what.split(':')[0]} must have the type of {spec.inputs[0][2].split(':')[0]} "
                                     f"({first.dtype.name}), but {getattr(args, option)} holds {arrays[key].dtype.name}")
    if getattr(args, "bias", None) is not None:
        bias_type = "float32" if first.dtype.kind == "f" else "int32"
        arrays["bias"] = load_npy(args.bias, "bias", np.dtype(bias_type), 1)
    return arrays


def shapes_from_args(args: argparse.Namespace, parse: Callable) -> dict[str, tuple[int, ...]]:
    """The input shapes ``compile-op`` was given."""
    if args.op in ("gemm", "dense"):
        m, k, n = parse(args.shape, "--shape (M,K,N)", 3)
        return {"a": (m, k), "b": (k, n)}
    if args.op == "conv2d":
        return {"x": parse(args.input_shape, "--input-shape (N,C,H,W)", 4),
                "w": parse(args.weight_shape, "--weight-shape (O,C/groups,KH,KW)", 4)}
    shapes = {"x": parse(args.shape, "--shape", None)}
    if args.op in ("add", "mul"):
        shapes["y"] = parse(args.other_shape, "--other-shape", None) if args.other_shape else shapes["x"]
    return shapes


def compile_operator(args: argparse.Namespace, target, shapes: dict[str, tuple[int, ...]], dtype: str,
                     has_bias: bool):
    """Compile ``args.op`` for ``target`` on inputs of ``shapes`` and ``dtype``."""
    from gemforge.compiler import ops
    op = args.op
    kind = target.kind
    if kind == "accel":
        expected = accel_dtype(op, target.config)  # refuses an operator the accelerator does not have
        if op in _ACCUMULATOR_INPUTS and dtype != expected:
            raise OperatorUsageError(f"on the accelerator, {op} takes {expected} accumulator values, not {dtype}")
    epilogue = {"shift": getattr(args, "shift", None), "relu": getattr(args, "relu", False)}
    hiding = {"latency_hiding": not getattr(args, "no_latency_hiding", False)}
    if op in ("gemm", "dense"):
        (m, k), (k2, n) = shapes["a"], shapes["b"]
        if k != k2:
            raise OperatorUsageError(f"A is {list(shapes['a'])} and B is {list(shapes['b'])}: "
                                     "A's columns must equal B's rows")
        return ops.compile_dense(target, m, k, n, dtype=dtype, bias=has_bias, **epilogue, **hiding)
    if op == "conv2d":
        x, w = shapes["x"], shapes["w"]
        if args.groups < 1:
            raise OperatorUsageError(f"--groups must be a positive integer, not {args.groups}")
        if x[1] != w[1] * args.groups:
            raise OperatorUsageError(f"input has {x[1]} channels (NCHW {list(x)}) but the weight expects "
                                     f"{w[1] * args.groups} (OIHW {list(w)}, {args.groups} group(s))")
        return ops.compile_conv2d(target, x, w, stride=args.stride, padding=args.padding, groups=args.groups,
                                  dtype=dtype, bias=has_bias, **epilogue, **hiding)
    x = shapes["x"]
    if op == "add":
        if kind == "accel":
            if shapes["y"] != x:
                raise OperatorUsageError("on the accelerator, add takes two inputs of one shape")
            return ops.compile_add(target, _nchw(x), **epilogue, **hiding)
        return ops.compile_elementwise(target, "add", x, dtype=dtype, y_shape=shapes["y"], **epilogue)
    if op == "mul":
        return ops.compile_elementwise(target, "mul", x, dtype=dtype, y_shape=shapes["y"], **epilogue)
    if op == "relu":
        if kind == "accel":
            return ops.compile_relu(target, _nchw(x), **hiding)
        return ops.compile_elementwise(target, "relu", x, dtype=dtype)
    if op == "clip":
        if math.isnan(args.lo) or math.isnan(args.hi) or args.lo > args.hi:
            raise OperatorUsageError(f"clip needs bounds --min ≤ --max, not {args.lo} and {args.hi}")
        if kind == "accel":
            if not (float(args.lo).is_integer() and float(args.hi).is_integer()):
                raise OperatorUsageError("on the accelerator, clip bounds are integers")
            return ops.compile_clip(target, _nchw(x), int(args.lo), int(args.hi), **hiding)
        return ops.compile_elementwise(target, "clip", x, dtype=dtype, lo=args.lo, hi=args.hi)
    if op in ("max-pool", "avg-pool"):
        if len(x) != 4:
            raise OperatorUsageError(f"pooling takes an NCHW input, not shape {list(x)}")
        kernel = args.kernel if args.kernel is not None else x[2] if x[2] == x[3] else (x[2], x[3])
        if kind == "accel":
            if not isinstance(kernel, int):
                raise OperatorUsageError(f"the accelerator pools square windows; a global {op} of a {x[2]}×{x[3]} "
                                         "image runs on the cpu or gpu (or give --kernel)")
            return ops.compile_max_pool2d(target, x, kernel, stride=args.stride, padding=args.padding, **hiding)
        return ops.compile_pool2d(target, op.split("-")[0], x, kernel, stride=args.stride, padding=args.padding,
                                  dtype=dtype)
    if op == "softmax":
        return ops.compile_softmax(target, x, dtype=dtype)
    raise OperatorUsageError(f"unknown operator {op!r}")


def _nchw(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) != 4:
        raise OperatorUsageError(f"the accelerator's element-wise operators take NCHW tensors, not shape {list(shape)}")
    return shape



def check_accumulator_range(args: argparse.Namespace, arrays: dict[str, np.ndarray], config) -> None:
    """Refuse a run whose exact accumulator values (product + bias, or sum) do not fit the
    accelerator's ``acc_width``, or a host back end's int32, where ``config`` is None
    (`gemforge.compiler.ops.accumulator_overflow`)."""
    from gemforge.compiler.ops import accumulator_overflow
    op = {"gemm": "dense"}.get(args.op, args.op)
    first, *rest = [arrays[k] for k in ("a", "b", "x", "w", "y") if k in arrays]
    where = None
    if config is None:       # the host back ends accumulate integers in int32 and wrap as well
        if first.dtype.kind not in "iu":
            return
        config, where = types.SimpleNamespace(acc_width=32), f"the {args.device} back end"
    problem = accumulator_overflow(config, op, first, rest[0] if rest else None, arrays.get("bias"),
                                   stride=getattr(args, "stride", 1), padding=getattr(args, "padding", 0),
                                   groups=getattr(args, "groups", 1) or 1, where=where)
    if problem:
        raise OperatorUsageError(problem)
