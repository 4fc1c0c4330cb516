"""The `gemforge` command line.

Each subcommand is a small function over the library; user mistakes (bad
configs, malformed files, wrong shapes, illegal programs) end with one line
``gemforge: error: ...`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
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
    from gemforge.compiler.hand_gemm import GemmShapeError
    from gemforge.hw.asm import AsmError
    from gemforge.sim.fsim import FsimError
    return (UsageError, ConfigError, IsaError, ProgramError, DeviceError, FsimError,
            GemmShapeError, AsmError)


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


def cmd_run_op(args: argparse.Namespace) -> None:
    from gemforge.compiler.hand_gemm import run_gemm
    config = _config(args)
    if args.op != "gemm":  # argparse restricts the choices; kept for clarity
        raise UsageError(f"unknown operator {args.op!r}")
    a = _load_npy(args.a, "A", np.dtype(np.int8), 2)
    b = _load_npy(args.b, "B", np.dtype(np.int8), 2)
    if a.shape[1] != b.shape[0]:
        raise UsageError(f"A is {list(a.shape)} and B is {list(b.shape)}: A's columns must equal B's rows")
    with open_device(args.device, config) as device:
        c, result = run_gemm(device, a, b)
    _save_npy(args.output, c)
    if args.stats:
        _print_json({"op": "gemm", "device": args.device, "config": config.name,
                     "shape": {"m": a.shape[0], "k": a.shape[1], "n": b.shape[1]}, **result.as_dict()})


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo
    if not run_demo(args.device):
        raise UsageError("the demo's results differ from numpy")


def cmd_bench(args: argparse.Namespace) -> None:
    from .bench import run_benchmarks
    results = run_benchmarks(_config(args), quick=args.quick)
    text = json.dumps(results, indent=2)
    if args.output:
        write_bytes_atomic(args.output, (text + "\n").encode())
    print(text)


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

    p = sub.add_parser("asm", help="assemble a text program into a program file")
    p.add_argument("source", help="assembly source (.s)")
    p.add_argument("-o", "--output", required=True, help="program file to write")
    p.add_argument("--config", default="default", help=config_help)
    p.set_defaults(func=cmd_asm)

    p = sub.add_parser("disasm", help="print a program file as assembly text")
    p.add_argument("program", help="program file (from `gemforge asm` or a compiler)")
    p.set_defaults(func=cmd_disasm)

    p = sub.add_parser("run-op", help="run one operator on a device")
    p.add_argument("op", choices=["gemm"], help="operator: gemm (C = A @ B, int8 x int8 -> int32)")
    p.add_argument("--a", required=True, help="A: (M, K) int8 .npy")
    p.add_argument("--b", required=True, help="B: (K, N) int8 .npy")
    p.add_argument("-o", "--output", required=True, help="C: (M, N) int32 .npy to write")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("--device", default="fsim", help="device backend (default: fsim)")
    p.add_argument("--stats", action="store_true", help="print the run's counters as JSON")
    p.set_defaults(func=cmd_run_op)

    p = sub.add_parser("demo", help="run the kit end to end on embedded defaults")
    p.add_argument("--device", default="fsim", help="device backend (default: fsim)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="measure performance against in-run baselines; prints JSON")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("--quick", action="store_true", help="small sizes, one repetition (smoke run)")
    p.add_argument("-o", "--output", help="also write the JSON to this file")
    p.set_defaults(func=cmd_bench)

    return parser


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
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
