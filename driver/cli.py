"""The `gemforge` command line.

Each subcommand is a small function over the library; user mistakes (bad
configs, malformed files, wrong shapes, illegal programs) end with one line
``gemforge: error: ...`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from gemforge import __version__
from gemforge.hw.config import PRESETS, AccelConfig, ConfigError, load_config
from gemforge.hw.isa import IsaError

from .device import DeviceError, available_backends, open_device
from gemforge.files import write_bytes_atomic
from gemforge.hw.program import Program, ProgramError

__all__ = ["main", "build_parser"]


class UsageError(Exception):
    """A mistake in the command line or its input files."""


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that report a user mistake (imported lazily: optional parts)."""
    from gemforge.compiler.errors import CompileError
    from gemforge.hw.asm import AsmError
    from gemforge.sim.fsim import FsimError
    return (UsageError, ConfigError, IsaError, ProgramError, DeviceError, FsimError,
            AsmError, CompileError)


# ---------------------------------------------------------------------------- helpers

def _config(args: argparse.Namespace) -> AccelConfig:
    return load_config(args.config)


def _load_npy(path: str, what: str, dtype: np.dtype, ndim: int) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"{what} file {path} does not exist") from None
    except (ValueError, OSError) as exc:
        raise UsageError(f"{what} file {path} is not a readable .npy array ({exc})") from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"{what} file {path} holds several arrays; give a single-array .npy file")
    if array.dtype != dtype:
        raise UsageError(f"{what} must be {np.dtype(dtype).name}, but {path} holds {array.dtype.name}")
    if array.ndim != ndim:
        raise UsageError(f"{what} must have {ndim} dimensions, but {path} has shape {list(array.shape)}")
    return array


def _save_npy(path: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    write_bytes_atomic(path, buffer.getvalue())


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


# ---------------------------------------------------------------------------- commands

def cmd_info(args: argparse.Namespace) -> None:
    config = _config(args)
    if args.isa:
        from gemforge.hw.isa_doc import isa_reference
        print(isa_reference(config), end="")
        return
    _print_json({"config": config.to_dict(), "derived": config.derived(),
                 "presets": sorted(PRESETS), "devices": available_backends()})


def cmd_asm(args: argparse.Namespace) -> None:
    from gemforge.hw.asm import assemble
    try:
        text = Path(args.source).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {args.source}: {exc.strerror}") from None
    program = assemble(text, _config(args))
    program.save(args.output)


def cmd_disasm(args: argparse.Namespace) -> None:
    from gemforge.hw.asm import disassemble
    print(disassemble(Program.load(args.program)), end="")


def _shape(text: str, what: str, rank: int) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != rank or min(dims) < 1:
        raise UsageError(f"{what} must be {rank} positive integers separated by commas, not {text!r}")
    return dims


def _epilogue(args: argparse.Namespace) -> dict:
    return {"shift": args.shift, "relu": args.relu, "latency_hiding": not args.no_latency_hiding}


def _load_bias(args: argparse.Namespace) -> np.ndarray | None:
    return None if args.bias is None else _load_npy(args.bias, "bias", np.dtype(np.int32), 1)


def _compile_from_files(args: argparse.Namespace, config: AccelConfig):
    """Load the operator's input files and compile it; returns (compiled op, host inputs)."""
    from gemforge.compiler import compile_conv2d, compile_dense
    bias = _load_bias(args)
    if args.op in ("gemm", "dense"):
        a = _load_npy(args.a, "A", np.dtype(np.int8), 2)
        b = _load_npy(args.b, "B", np.dtype(np.int8), 2)
        if a.shape[1] != b.shape[0]:
            raise UsageError(f"A is {list(a.shape)} and B is {list(b.shape)}: A's columns must equal B's rows")
        if bias is not None and bias.shape != (b.shape[1],):
            raise UsageError(f"bias must have one int32 per output column ({b.shape[1]}), not {list(bias.shape)}")
        op = compile_dense(config, a.shape[0], a.shape[1], b.shape[1], bias=bias is not None, **_epilogue(args))
        return op, {"a": a, "b": b, "bias": bias}
    x = _load_npy(args.input, "input", np.dtype(np.int8), 4)
    w = _load_npy(args.weight, "weight", np.dtype(np.int8), 4)
    if x.shape[1] != w.shape[1]:
        raise UsageError(f"input has {x.shape[1]} channels (NCHW {list(x.shape)}) but the weight expects "
                         f"{w.shape[1]} (OIHW {list(w.shape)})")
    if bias is not None and bias.shape != (w.shape[0],):
        raise UsageError(f"bias must have one int32 per output channel ({w.shape[0]}), not {list(bias.shape)}")
    op = compile_conv2d(config, x.shape, w.shape, stride=args.stride, padding=args.padding,
                        bias=bias is not None, **_epilogue(args))
    return op, {"x": x, "w": w, "bias": bias}


def cmd_run_op(args: argparse.Namespace) -> None:
    config = _config(args)
    op, inputs = _compile_from_files(args, config)
    with open_device(args.device, config) as device:
        output, result = op.run(device, **inputs)
    _save_npy(args.output, output)
    if args.stats:
        _print_json({"op": args.op, "device": args.device, "config": config.name,
                     "latency_hiding": not args.no_latency_hiding, "output": {
                         "shape": list(output.shape), "dtype": output.dtype.name},
                     "plan": {k: v for k, v in op.plan.items() if isinstance(v, (int, str, bool))},
                     **result.as_dict()})


def cmd_compile_op(args: argparse.Namespace) -> None:
    from gemforge.compiler import compile_conv2d, compile_dense
    config = _config(args)
    options = {"bias": args.bias, **_epilogue(args)}
    if args.op in ("gemm", "dense"):
        m, k, n = _shape(args.shape, "--shape (M,K,N)", 3)
        op = compile_dense(config, m, k, n, **options)
    else:
        op = compile_conv2d(config, _shape(args.input_shape, "--input-shape (N,C,H,W)", 4),
                            _shape(args.weight_shape, "--weight-shape (O,I,KH,KW)", 4),
                            stride=args.stride, padding=args.padding, **options)
    op.program.save(args.output)
    print(json.dumps({"op": args.op, "program": str(args.output),
                      "instructions": len(op.program.instructions), "uops": len(op.program.uops),
                      "tensors": {name: {"shape": list(r.shape), "dtype": r.dtype}
                                  for name, r in op.program.tensors.items()}}, indent=2))


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo
    if not run_demo(args.device):
        raise UsageError("the demo's results differ from numpy")


def cmd_bench(args: argparse.Namespace) -> None:
    from .bench import run_benchmarks
    from .bench_report import render_markdown
    start = time.perf_counter()
    core_configs = [load_config(name) for name in args.core_configs.split(",")] if args.core_configs else []
    results = run_benchmarks(_config(args), quick=args.quick, device=args.device, core_configs=core_configs)
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    text = json.dumps(results, indent=2)
    if args.output:
        write_bytes_atomic(args.output, (text + "\n").encode())
    if args.markdown:
        command = " ".join(["gemforge", "bench", "--config", args.config]
                           + (["--quick"] if args.quick else []) + (["--device", args.device] if args.device else [])
                           + (["--core-configs", args.core_configs] if args.core_configs else [])
                           + ["--markdown", os.path.basename(args.markdown)])
        write_bytes_atomic(args.markdown, render_markdown(results, command).encode())
    print(text)


def cmd_generate(args: argparse.Namespace) -> None:
    from gemforge.hw.generate import generate
    for path in generate(_config(args), args.output):
        print(path)


def cmd_config(args: argparse.Namespace) -> None:
    config = _config(args)
    if args.output:
        config.save(args.output)
    else:
        print(config.to_toml(), end="")


# ---------------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gemforge",
        description="gemforge: a hardware-software co-design kit for deep-learning accelerators.")
    parser.add_argument("--version", action="version", version=f"gemforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    config_help = f"preset ({', '.join(PRESETS)}) or a .toml/.json config file (default: default)"

    p = sub.add_parser("info", help="print a config's derived parameters as JSON, or the ISA reference")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("--isa", action="store_true", help="print the ISA reference (Markdown) for the config")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("config", help="write a preset or config file as TOML or JSON")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("-o", "--output", help="file to write (.toml or .json); default: TOML on stdout")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("generate", help="write the accelerator's Verilog, config, register map and file list")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("-o", "--output", required=True, help="output directory (created if needed)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("asm", help="assemble a text program into a program file")
    p.add_argument("source", help="assembly source (.s)")
    p.add_argument("-o", "--output", required=True, help="program file to write")
    p.add_argument("--config", default="default", help=config_help)
    p.set_defaults(func=cmd_asm)

    p = sub.add_parser("disasm", help="print a program file as assembly text")
    p.add_argument("program", help="program file (from `gemforge asm` or a compiler)")
    p.set_defaults(func=cmd_disasm)

    p = sub.add_parser("run-op", help="compile one operator and run it on a device")
    ops = p.add_subparsers(dest="op", metavar="OP", required=True)
    for name, summary in _OPERATORS.items():
        q = ops.add_parser(name, help=summary, description=summary)
        _operator_inputs(q, name, files=True)
        q.add_argument("-o", "--output", required=True, help="output .npy to write")
        _common_operator_options(q, config_help)
        q.add_argument("--device", default="fsim", help=_DEVICE_HELP)
        q.add_argument("--stats", action="store_true", help="print the plan and the run's counters as JSON")
        q.set_defaults(func=cmd_run_op)

    p = sub.add_parser("compile-op", help="compile one operator to a program file (see `disasm`)")
    ops = p.add_subparsers(dest="op", metavar="OP", required=True)
    for name, summary in _OPERATORS.items():
        q = ops.add_parser(name, help=summary, description=summary)
        _operator_inputs(q, name, files=False)
        q.add_argument("-o", "--output", required=True, help="program file to write")
        _common_operator_options(q, config_help)
        q.set_defaults(func=cmd_compile_op)

    p = sub.add_parser("demo", help="run the kit end to end on embedded defaults")
    p.add_argument("--device", default="fsim", help=_DEVICE_HELP)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="measure performance against in-run baselines; prints JSON")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("--quick", action="store_true", help="small sizes, one repetition (smoke run)")
    p.add_argument("--device", help="also measure GEMM-core utilization on this RTL device (verilator, icarus)")
    p.add_argument("-o", "--output", help="also write the JSON to this file")
    p.add_argument("--markdown", metavar="FILE", help="also write the figures as Markdown (BENCHMARKS.md)")
    p.add_argument("--core-configs", metavar="NAMES",
                   help="with --device: also measure the core rates (DMA, GEMM, ALU) of these comma-separated configs")
    p.set_defaults(func=cmd_bench)

    return parser


_DEVICE_HELP = "device backend: fsim (default), verilator or icarus (RTL co-simulation)"

_OPERATORS = {
    "gemm": "C = A @ B: A (M, K) int8, B (K, N) int8, C (M, N) int32 (dense without epilogue)",
    "dense": "C = A @ B with a fused epilogue: clip((acc + bias) >> shift, lo, 127) as int8 "
             "(lo = 0 with --relu, else -128); without --shift the int32 (acc + bias)",
    "conv2d": "Y = conv2d(X, W): X NCHW int8, W OIHW int8, bias int32 per output channel; "
              "Y NCHW int32, or int8 with --shift",
}


def _operator_inputs(parser: argparse.ArgumentParser, op: str, files: bool) -> None:
    if files and op in ("gemm", "dense"):
        parser.add_argument("--a", required=True, help="A: (M, K) int8 .npy")
        parser.add_argument("--b", required=True, help="B: (K, N) int8 .npy")
    elif files:
        parser.add_argument("--input", required=True, help="X: (N, C, H, W) int8 .npy")
        parser.add_argument("--weight", required=True, help="W: (O, C, KH, KW) int8 .npy")
    elif op in ("gemm", "dense"):
        parser.add_argument("--shape", required=True, help="M,K,N")
    else:
        parser.add_argument("--input-shape", required=True, help="N,C,H,W")
        parser.add_argument("--weight-shape", required=True, help="O,C,KH,KW")
    if op == "gemm":
        parser.set_defaults(bias=None if files else False, shift=None, relu=False, stride=1, padding=0)
        return
    if files:
        parser.add_argument("--bias", help="bias: int32 .npy, one per output channel/column")
    else:
        parser.add_argument("--bias", action="store_true", help="the operator takes a bias input")
    parser.add_argument("--shift", type=int, help="requantize: arithmetic shift right, then clip to int8")
    parser.add_argument("--relu", action="store_true", help="ReLU (clip at 0 instead of -128)")
    if op == "conv2d":
        parser.add_argument("--stride", type=int, default=1, help="stride (default 1)")
        parser.add_argument("--padding", type=int, default=0, help="zero padding on each side (default 0)")
    else:
        parser.set_defaults(stride=1, padding=0)


def _common_operator_options(parser: argparse.ArgumentParser, config_help: str) -> None:
    parser.add_argument("--config", default="default", help=config_help)
    parser.add_argument("--no-latency-hiding", action="store_true",
                        help="one virtual thread: no overlap of loads, compute and stores")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except _user_errors() as exc:
        print(f"gemforge: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `gemforge disasm x | head`
        return 0
    except OSError as exc:  # unwritable output, full disk, ...
        where = f": {exc.filename}" if exc.filename else ""
        print(f"gemforge: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
