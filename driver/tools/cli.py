"""The `gemforge` command line.

Each subcommand is a small function over the library; user mistakes (bad
configs, malformed files, wrong shapes, illegal programs) end with one line
``gemforge: error: ...`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import time
import zipfile
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from gemforge import __version__
from gemforge.compiler.graph.ir import MAX_DIM, MAX_ELEMENTS   # an operator's tensors are bounded as a model's
from gemforge.compiler.backends.cpu.cache import cache_dir
from gemforge.compiler.target import CPU_LEVELS, GPU_ARCHS
from gemforge.hw.config import PRESETS, AccelConfig, ConfigError, load_config
from gemforge.hw.isa import IsaError, derived

from ..runtime.device import HOST_DEVICES, DeviceError, available_backends, open_device
from .operators import OPERATORS
from gemforge.files import (check_regular_input, check_writable, file_above, npz_bytes, write_bytes_atomic,
                            write_files_atomic)
from gemforge.hw.program import Program, ProgramError

__all__ = ["main", "build_parser"]


class UsageError(Exception):
    """A mistake in the command line or its input files."""


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that report a user mistake (imported lazily: optional parts)."""
    from gemforge.compiler.errors import CompileError
    from gemforge.hw.asm import AsmError
    from gemforge.hw.flow.synth import SynthError
    from gemforge.sim.cosim.harness import CosimError
    from gemforge.sim.fsim import FsimError
    from gemforge.sim.regress import RegressError
    from gemforge.sim.cycle_model import CycleModelError
    from .operators import OperatorUsageError
    from .sweep import SweepError
    from .workloads import WorkloadError
    return (UsageError, ConfigError, IsaError, ProgramError, DeviceError, FsimError,
            AsmError, CompileError, OperatorUsageError, RegressError, CosimError, SynthError,
            SweepError, WorkloadError, CycleModelError)


# ---------------------------------------------------------------------------- helpers

def _config(args: argparse.Namespace) -> AccelConfig:
    return load_config(args.config)


def _refuse_overwriting(output: str, *inputs: str | None) -> None:
    """An output path that names one of the command's inputs would destroy it."""
    out = Path(output)
    for path in inputs:
        if path and out.exists() and Path(path).exists() and out.resolve() == Path(path).resolve():
            raise UsageError(f"the output {output} is also an input of this command; write it elsewhere")


def _check_output_dir(path: str, option: str = "-o") -> None:
    """Refuse, before any work, an output directory that cannot be made: the path is a file
    (or a dangling link), or it lies under one (mkdir said only 'File exists' or 'Not a directory')."""
    out = Path(path)
    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"{option} {path} exists and is not a directory; give a directory to write into "
                         "(created if needed)")
    blocking = file_above(out)
    if blocking is not None:
        raise UsageError(f"{option} {path} lies under {blocking}, which exists and is not a directory; "
                         "give a directory to write into (created if needed)")


def _check_regular(path: str, named: str) -> None:
    """Refuse a FIFO or device as an input file (``named`` says which) before reading blocks."""
    try:
        check_regular_input(path)
    except OSError as exc:
        raise UsageError(f"{named} {exc.strerror}") from None


def _load_npy(path: str, what: str, dtype: np.dtype | None, ndim: int | None) -> np.ndarray:
    _check_regular(path, f"{what} file {path}")
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"{what} file {path} does not exist") from None
    except (ValueError, OSError, EOFError) as exc:   # EOFError: an empty or truncated file
        if "allow_pickle" in str(exc):
            # numpy's advice to load it "unsafely" is wrong here: the file is not an array, or an
            # array of Python objects, and gemforge never unpickles what it is given.
            raise UsageError(f"{what} file {path} is not a .npy array of numbers (it is another kind of file, or "
                             "holds Python objects, which gemforge does not load)") from None
        raise UsageError(f"{what} file {path} is not a readable .npy array ({exc or 'it ends early'})") from None
    if not isinstance(array, np.ndarray):
        raise UsageError(f"{what} file {path} holds several arrays; give a single-array .npy file")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))  # big-endian files: the same values, native order
    if dtype is not None and array.dtype != dtype:
        raise UsageError(f"{what} must be {np.dtype(dtype).name}, but {path} holds {array.dtype.name}")
    if ndim is not None and array.ndim != ndim:
        raise UsageError(f"{what} must have {ndim} dimensions, but {path} has shape {list(array.shape)}")
    return array           # a 0-d array too: a model's scalar input (the model checks each shape)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _save_npy(path: str, array: np.ndarray) -> None:
    write_bytes_atomic(path, _npy_bytes(array))


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


# ---------------------------------------------------------------------------- commands

def cmd_info(args: argparse.Namespace) -> None:
    config = _config(args)
    if args.isa:
        from gemforge.hw.isa_doc import isa_reference
        print(isa_reference(config), end="")
        return
    _print_json({"config": config.to_dict(), "derived": derived(config),
                 "presets": sorted(PRESETS), "devices": available_backends()})


def cmd_asm(args: argparse.Namespace) -> None:
    from gemforge.hw.asm import assemble
    source = Path(args.source)
    if source.exists() and not source.is_file():
        raise UsageError(f"{args.source} is not a regular file")
    _refuse_overwriting(args.output, args.source)
    try:
        # utf-8-sig: a byte-order mark (as some editors write) is not part of the first line
        text = source.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise UsageError(f"cannot read {args.source}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{args.source} is not an assembly source: not UTF-8 text (byte {exc.start})") from None
    program = assemble(text, _config(args), runnable=True)
    program.save(args.output)


def cmd_disasm(args: argparse.Namespace) -> None:
    from gemforge.hw.asm import disassemble
    print(disassemble(Program.load(args.program)), end="")


def cmd_cycles(args: argparse.Namespace) -> None:
    from gemforge.sim.cycle_model import run_cycle_model
    program = Program.load(args.program)
    start = time.perf_counter()
    report = run_cycle_model(program.instructions, program.config, arena=program.arena_image())
    _print_json({"program": args.program, "config": program.config.name, **report.to_json(),
                 "model_seconds": round(time.perf_counter() - start, 4)})


def _shape(text: str, what: str, rank: int | None) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if (rank is not None and len(dims) != rank) or not dims or min(dims) < 1:
        count = f"{rank} positive integers" if rank is not None else "positive integers"
        raise UsageError(f"{what} must be {count} separated by commas, not {text!r}")
    # The generated code indexes with 64-bit integers (and the accelerator's DMA with far fewer bits).
    if max(dims) > MAX_DIM or math.prod(dims) > MAX_ELEMENTS:
        raise UsageError(f"{what} {text!r} is beyond what gemforge compiles: dimensions up to {MAX_DIM:,} and "
                         f"{MAX_ELEMENTS:,} elements in all")
    return dims


def _target_for(args: argparse.Namespace, device=None):
    """The compilation target of ``--device``: the accelerator of ``--config``, or cpu/gpu."""
    from gemforge.compiler.target import AccelTarget, CpuTarget, GpuTarget
    if device is not None and getattr(device, "target", None) is not None:
        return device.target
    if args.device not in available_backends() and not args.device.startswith("uart:"):   # uart:PORT[@BAUD]
        raise UsageError(f"unknown device {args.device!r}; available: {', '.join(available_backends())}")
    if getattr(args, "arch", None) and args.device != "gpu":
        raise UsageError(f"--arch is for --device gpu, not {args.device}")
    if args.device == "cpu":
        return CpuTarget()
    if args.device == "gpu":
        return GpuTarget(getattr(args, "arch", None) or "sm_80")
    return AccelTarget(_config(args))


def cmd_run_op(args: argparse.Namespace) -> None:
    from .operators import OPERATORS, check_accumulator_range, compile_operator, load_inputs
    config = None if args.device in HOST_DEVICES else _config(args)
    arrays = load_inputs(args, _load_npy, config)
    check_accumulator_range(args, arrays, config)
    _refuse_overwriting(args.output, *(getattr(args, option, None) for _, option, _ in OPERATORS[args.op].inputs))
    dtype = arrays[next(iter(arrays))].dtype.name
    shapes = {k: v.shape for k, v in arrays.items() if k != "bias"}
    options = {}
    if args.waves:
        if args.device not in ("verilator", "icarus"):
            raise UsageError(f"--waves records an RTL simulation: use it with --device verilator or icarus, "
                             f"not {args.device}")
        options["waves"] = args.waves
    with open_device(args.device, config, **options) as device:
        target = _target_for(args, device)
        op = compile_operator(args, target, shapes, dtype, "bias" in arrays)
        output, result = op.run(device, **arrays)
    _save_npy(args.output, output)
    if args.stats:
        _print_json({"op": args.op, "device": args.device, **({"config": config.name} if config else {}),
                     "dtype": dtype, "latency_hiding": not getattr(args, "no_latency_hiding", False),
                     "output": {"shape": list(output.shape), "dtype": output.dtype.name},
                     "plan": {k: v for k, v in op.plan.items() if isinstance(v, (int, str, bool))},
                     **result.as_dict()})


def cmd_compile_op(args: argparse.Namespace) -> None:
    from .operators import compile_operator, default_dtype, shapes_from_args
    target = _target_for(args)
    shapes = shapes_from_args(args, _shape)
    from gemforge.compiler.pipeline import tracing
    # No trace function at all without --trace: one that discards the text still had every
    # stage's IR formatted (a global pool's 784-deep max expression overflowed the stack).
    with tracing(lambda text: print(text, file=sys.stderr)) if args.trace else contextlib.nullcontext():
        op = compile_operator(args, target, shapes, args.dtype or default_dtype(args.op, target),
                              bool(getattr(args, "bias", False)))
    summary = {"op": args.op, "device": args.device, "output": str(args.output)}
    if target.kind == "accel":
        if args.emit not in (None, "program"):
            raise UsageError(f"--emit {args.emit} is for the cpu and gpu devices; the accelerator writes a program")
        op.program.save(args.output)
        summary.update(instructions=len(op.program.instructions), uops=len(op.program.uops),
                       tensors={name: {"shape": list(r.shape), "dtype": r.dtype}
                                for name, r in op.program.tensors.items()})
    else:
        emit = args.emit or ("llvm" if target.kind == "cpu" else "ptx")
        texts = {"llvm": op.program.llvm_ir, "asm": op.program.assembly if target.kind == "cpu" else None,
                 "ptx": op.program.ptx if target.kind == "gpu" else None}
        if texts.get(emit) is None:
            raise UsageError(f"--emit {emit} is not available for the {target.kind} device; choose "
                             f"{' or '.join(k for k, v in texts.items() if v is not None)}")
        write_bytes_atomic(args.output, texts[emit].encode())
        summary.update(emit=emit, params={b.name: {"shape": list(b.shape), "dtype": b.dtype}
                                          for b in op.program.params})
        if target.kind == "gpu":
            summary["kernels"] = [{"name": k.func.name, "grid": list(k.grid), "block": list(k.block)}
                                  for k in op.program.program.kernels]
            summary["ptxas"] = "checked" if op.program.cubin is not None else op.program.ptxas_log
    summary["plan"] = {k: v for k, v in op.plan.items() if isinstance(v, (int, str, bool))}
    _print_json(summary)


def _profile_path(args: argparse.Namespace) -> str | None:
    if args.profile is None:
        return None
    if args.profile:
        return args.profile
    base = args.output or args.model
    return str(Path(base).with_suffix("")) + ".profile.png"


def cmd_compile(args: argparse.Namespace) -> None:
    from ..runtime.model import compile_model
    samples = _load_inputs(args.calibrate, "calibration samples") if args.calibrate else None
    if args.calibrate and not args.quantize:
        raise UsageError("--calibrate goes with --quantize int8")
    trace = (lambda text: print(text, file=sys.stderr)) if args.trace else None
    report = lambda text: print(text, file=sys.stderr)  # noqa: E731 - the partition and memory plan
    if args.config is not None and not args.quantize:
        raise UsageError("--config chooses the accelerator of an int8 network; a float32 network (no --quantize) "
                         "runs on the cpu or gpu")
    input_shapes = _input_shapes(args.input_shape or [])
    _refuse_overwriting(args.output, args.model, args.calibrate)
    tuning = ()
    if args.tuning_log:
        from gemforge.compiler.tuning.log import TuningLog
        tuning = TuningLog.load(args.tuning_log)
    model = compile_model(args.model, quantize=args.quantize, calibrate=samples,
                          config=(args.config or "default") if args.quantize else None, batch=args.batch,
                          input_shapes=input_shapes, trace=trace, report=report, tuning=tuning,
                          shipped_tuning=not args.no_shipped_tuning)
    _check_runnable_batch(model, args.batch)
    if args.no_host_kernels and args.cpu != "host":
        raise UsageError("--cpu names the CPU the host kernels are compiled for; leave out --no-host-kernels")
    if not args.no_host_kernels:
        # The host layers' kernels, compiled now for this CPU (or the x86-64 level --cpu names)
        # into the model file (and the kernel cache): a run on a machine they run on starts
        # without compiling; a run on another CPU compiles its own, once.
        start = time.perf_counter()
        count = model.compile_host_kernels(cpu=args.cpu)
        kept = f" and kept in {cache_dir()}" if cache_dir() is not None else ""
        where = "this CPU" if args.cpu == "host" else args.cpu
        report(f"host kernels: {count} compiled for {where} in {time.perf_counter() - start:.1f} s, "
               f"{len(model.net.host_kernels)} CPU kernels carried in the model file{kept}")
    model.save(args.output)
    _print_json(model.summary())


def cmd_tune(args: argparse.Namespace) -> None:
    from .tune import tune_model
    samples = _load_inputs(args.calibrate, "calibration samples") if args.calibrate else None
    if args.calibrate and not args.quantize:
        raise UsageError("--calibrate goes with --quantize int8")
    if args.config is not None and not args.quantize:
        raise UsageError("--config chooses the accelerator of an int8 network: add --quantize int8")
    if args.time_budget is not None and not args.time_budget > 0:
        raise UsageError(f"--time-budget is a positive number of seconds, not {args.time_budget}")
    _refuse_overwriting(args.output, args.model, args.calibrate)
    check_writable(args.output)
    if args.scheduler:
        from .sweep import SweepError, _check_reachable
        try:
            _check_reachable(args.scheduler)
        except SweepError as exc:
            raise UsageError(str(exc)) from None
    summary = tune_model(args.model, args.output, device=args.device, trials=args.trials, seed=args.seed,
                         time_budget=args.time_budget, scheduler=args.scheduler, quantize=args.quantize,
                         calibrate=samples, config=args.config, batch=args.batch,
                         input_shapes=_input_shapes(args.input_shape or []), progress=not args.quiet)
    _print_json(summary)


def _check_runnable_batch(model, batch: int) -> None:
    """Refuse a model whose one batch of inputs (float32) is more than `gemforge run` reads
    (`MAX_INPUT_BYTES`): every run of it would be refused. Checked on the compiled model, whose
    input shapes the batch and ``--input-shape`` decide; the message names the largest batch
    that fits."""
    batched = set(model.graph.notes.batched_inputs)
    per_item = sum(math.prod(shape[1:]) * 4 for name, shape in model.inputs.items() if name in batched)
    fixed = sum(math.prod(shape) * 4 for name, shape in model.inputs.items() if name not in batched)
    need = fixed + per_item * (batch if batched else 0)
    if need <= MAX_INPUT_BYTES:
        return
    largest = (MAX_INPUT_BYTES - fixed) // per_item if per_item else 0
    fits = f"; --batch {largest:,} is the largest that fits" if largest >= 1 else ""
    raise UsageError(f"the model's inputs take {need:,} bytes (float32) at --batch {batch:,}, more than the "
                     f"{MAX_INPUT_BYTES:,} a run reads{fits}")


def _input_shapes(texts: list[str]) -> dict[str, tuple[int, ...]]:
    """``--input-shape NAME=D1,D2,…`` options by input name (the model checks the names)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, eq, dims = text.rpartition("=")     # the dimensions follow the last '=': a name may hold one
        if not eq or not name:
            raise UsageError(f"--input-shape takes NAME=D1,D2,… (a model input and its dimensions), not {text!r}")
        if name in shapes:
            raise UsageError(f"--input-shape gives input {name!r} twice")
        shapes[name] = _shape(dims, f"--input-shape {name}", None)
    return shapes


def _load_inputs(path: str, what: str = "input"):
    """A model's float32 inputs (or calibration samples), as the README states them: one .npy
    array (a one-input model), or a .npz archive of arrays by input name; `MAX_INPUT_BYTES` at
    most. An array of another type is refused as run-op refuses one (`_load_npy`), not
    converted: int8 data given for float32 would be read as float values of another scale."""
    _check_regular(path, f"{what} file {path}")
    if not path.endswith(".npz"):
        if os.path.isfile(path) and os.path.getsize(path) > MAX_INPUT_BYTES + _NPY_HEADER_BYTES:
            raise UsageError(f"{what} file {path} holds {os.path.getsize(path):,} bytes, more than the "
                             f"{MAX_INPUT_BYTES:,} gemforge reads")
        return _load_npy(path, what, np.dtype(np.float32), None)
    try:
        with np.load(path, allow_pickle=False) as archive:
            members = archive.zip.infolist()
            unpacked = sum(info.file_size for info in members)
            # A zip bomb would exhaust memory before any check.
            if unpacked > MAX_INPUT_BYTES + _NPY_HEADER_BYTES * len(members):
                raise UsageError(f"{what} file {path} unpacks to {unpacked:,} bytes, more than the "
                                 f"{MAX_INPUT_BYTES:,} gemforge reads")
            arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise UsageError(f"{what} file {path} does not exist") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as exc:
        # NotImplementedError: a compression method zipfile lacks; RuntimeError: an encrypted member.
        raise UsageError(f"{what} file {path} is not a readable .npz archive ({exc or 'it ends early'})") from None
    for name, array in arrays.items():
        if array.dtype.newbyteorder("=") != np.float32:     # big-endian float32 is float32
            raise UsageError(f"{what} must be float32, but {path} holds {array.dtype.name} array {name!r}")
        arrays[name] = array.astype(np.float32, copy=False)
    return arrays


#: Most bytes of arrays gemforge reads as inputs or calibration samples (an .npy, or an .npz's
#: arrays together, each with its header besides), and so the most that one compiled batch of a
#: model's inputs may take (`_check_runnable_batch`).
MAX_INPUT_BYTES = 16 << 30
#: An .npy file's bytes beyond its array: magic, version, length and a header numpy reads up to
#: 10,000 bytes long.
_NPY_HEADER_BYTES = 12 + 10_000


def cmd_run(args: argparse.Namespace) -> None:
    from ..runtime.model import Model
    from ..runtime.profile import profile_png, profile_table, profile_totals
    _refuse_overwriting(args.output, args.model, args.input)
    profile = _profile_path(args)
    if profile is not None and Path(profile).is_dir():     # found before the run, not after its output
        raise UsageError(f"--profile {profile} is a directory; give the PNG file to write")
    # The same file however it is spelled (./out.npy, a link), whether or not it exists yet:
    # the profile would replace the output.
    if profile is not None and (os.path.realpath(profile) == os.path.realpath(args.output) or
                                (Path(profile).is_file() and Path(args.output).exists()
                                 and Path(profile).samefile(args.output))):
        raise UsageError(f"--profile {profile} is the output file itself; give the PNG a name of its own")
    for path in (args.output, profile):     # both checked before either is written
        if path is not None:
            check_writable(path)
    model = Model.load(args.model, file_kernels=not args.no_file_kernels)
    y = model.run(_load_inputs(args.input), args.device, chain=not args.per_layer)
    if isinstance(y, dict):
        if not args.output.endswith(".npz"):
            raise UsageError(f"the model has {len(y)} outputs ({', '.join(y)}); give -o a .npz file to write them all")
        outputs = {args.output: npz_bytes(y)}
    elif args.output.endswith(".npz"):      # one output, asked for as an archive: by its name
        outputs = {args.output: npz_bytes({model.outputs[0]: y})}
    else:
        outputs = {args.output: _npy_bytes(y)}
    if profile is not None:
        outputs[profile] = profile_png(model.last_profile, f"{Path(args.model).name} on {args.device}")
    # Replaced together: a profile that cannot be written leaves the previous output in place.
    write_files_atomic(outputs)
    if profile is not None:
        print(profile_table(model.last_profile), file=sys.stderr)
        _print_json({"profile": [r.as_dict() for r in model.last_profile],
                     "totals": profile_totals(model.last_profile), "png": profile})


def cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo
    _check_output_dir(args.output_dir)
    if not run_demo(args.device, out_dir=Path(args.output_dir)):
        raise UsageError("the demo's results differ from numpy")


def cmd_bench(args: argparse.Namespace) -> None:
    from .bench import run_benchmarks
    from .bench_report import render_markdown
    start = time.perf_counter()
    core_configs = [load_config(name) for name in args.core_configs.split(",")] if args.core_configs else []
    sections = tuple(args.sections.split(",")) if args.sections else None
    known = ("fsim", "rtl", "regress", "cpu", "network", "models", "tuning", "gpu", "synth", "sweep")
    if sections and any(s not in known for s in sections):
        raise UsageError(f"--sections takes {', '.join(known)}, not {args.sections!r}")
    from gemforge.sim.cosim.harness import SIMULATORS
    if args.device is not None and args.device not in SIMULATORS:
        raise UsageError(f"bench's --device is an RTL simulator ({', '.join(SIMULATORS)}), not {args.device!r}")
    # Read before the (long) measurements: a bad file is refused at once.
    merged = []
    for merge in args.merge or ():
        _check_regular(merge, f"--merge {merge}")
        try:
            earlier = json.loads(Path(merge).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--merge {merge} is not a readable JSON file of gemforge bench ({exc})") from None
        if not isinstance(earlier, dict) or not all(isinstance(v, (dict, int, float, str)) for v in earlier.values()):
            raise UsageError(f"--merge {merge} is not the JSON object of sections that gemforge bench writes")
        merged.append((merge, earlier))
    results = run_benchmarks(_config(args), quick=args.quick, device=args.device, core_configs=core_configs,
                             sections=sections)
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    for merge, earlier in merged:
        for key, value in earlier.items():
            if key not in results and key != "wall_seconds":
                results[key] = dict(value, merged_from=os.path.basename(merge)) if isinstance(value, dict) \
                    else value
    text = json.dumps(results, indent=2)
    if args.output:
        write_bytes_atomic(args.output, (text + "\n").encode())
    if args.markdown:
        command = " ".join(["gemforge", "bench", "--config", args.config]
                           + (["--quick"] if args.quick else []) + (["--device", args.device] if args.device else [])
                           + (["--core-configs", args.core_configs] if args.core_configs else [])
                           + (["--sections", args.sections] if args.sections else [])
                           + [part for merge in args.merge or () for part in ("--merge", os.path.basename(merge))]
                           + ["--markdown", os.path.basename(args.markdown)])
        try:
            markdown = render_markdown(results, command)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise UsageError(f"the results (with the --merge files) hold a section the report cannot render "
                             f"({type(exc).__name__}: {exc}); was a merged file written by gemforge bench?") from None
        write_bytes_atomic(args.markdown, markdown.encode())
    print(text)


def cmd_generate(args: argparse.Namespace) -> None:
    from gemforge.hw.flow.generate import generate
    config = _config(args)
    _check_output_dir(args.output)
    for path in generate(config, args.output):
        print(path)


def cmd_synth(args: argparse.Namespace) -> None:
    from contextlib import nullcontext

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gemforge.hw.flow.synth import PlaceOptions, run_synth
    config = _config(args)
    _check_output_dir(args.output)
    place = PlaceOptions(seed=args.seed, router=args.router, timeout_s=args.place_timeout,
                         timing_weight=args.timing_weight)
    what = {"generate": "generating the netlist and the Verilog", "predict": "checking the buffers against the device's RAM",
            "synthesize": f"synthesizing with Yosys ({args.target})",
            "lut_multipliers": "more products than DSP blocks: synthesizing again with some GEMM lanes' "
                               "multipliers in LUT logic",
            "check": "checking the synthesized cells and ports against the device",
            "place": "placing and routing with nextpnr",
            "build": "building the board design: synthesis, place and route, bitstream"}
    console = Console(stderr=True)
    # A terminal gets a live elapsed time per step; a log gets a line when each step starts and ends.
    live = console.is_terminal
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console)
    tasks = {}

    def on_step(name: str, state: str, seconds: float | None) -> None:
        if live and state == "start":
            tasks[name] = progress.add_task(what.get(name, name), total=1)
        elif live:
            progress.update(tasks[name], completed=1, description=f"{what.get(name, name)}: {seconds:.1f} s")
        else:
            console.print(f"{what.get(name, name)}" + (" ..." if state == "start" else f": {seconds:.1f} s"),
                          highlight=False)

    with progress if live else nullcontext():
        report = run_synth(config, args.target, args.output, freq_mhz=args.freq, bitstream=args.bitstream,
                           board=args.board, board_memory=args.board_memory, place=place, on_step=on_step,
                           lut_lanes=args.lut_lanes)
    _print_json({key: report[key] for key in ("config", "target", "device", "status", "resources", "fmax_mhz",
                                              "freq_mhz_requested", "timing_met", "place_options", "steps")}
                | ({"lut_lanes": report["lut_lanes"]} if report.get("lut_lanes") else {})
                | ({"board": report["board"], "bitstream": report["bitstream"]} if report.get("board") else {})
                | {"report": str(Path(args.output) / "report.json")})


def cmd_sweep(args: argparse.Namespace) -> None:
    from .sweep import SweepError, load_space, render_report, run_sweep
    if args.report:
        if args.space or args.output:
            raise SweepError("--report DIR renders an existing sweep; give it alone")
        print(render_report(args.report))
        return
    if not args.space or not args.output:
        raise SweepError("give a space file and an output directory: gemforge sweep SPACE.toml -o DIR")
    if args.jobs < 1:
        raise SweepError(f"--jobs must be at least 1, not {args.jobs}")
    _check_output_dir(args.output)
    space = load_space(args.space)
    points = run_sweep(space, args.output, jobs=args.jobs, scheduler=args.scheduler,
                       progress=not args.quiet, log=lambda line: print(line, file=sys.stderr))
    from .sweep import pareto_front
    front = pareto_front(points, space.area)
    ok = [p for p in points if p.get("status") == "ok"]
    failed = [p for p in points if p.get("status") == "failed"]
    _print_json({"space": space.name, "points": len(points), "ok": len(ok),
                 "invalid": sum(p.get("status") == "invalid" for p in points), "failed": len(failed),
                 "pareto": front, "output": str(Path(args.output) / "sweep.json")})
    # A sweep that evaluated nothing, or measured nothing by its area, did not do its job.
    if not ok:
        why = (f"every valid point failed, the first with: {(str(failed[0].get('error')).splitlines() or ['?'])[-1]}"
               if failed else "the space holds no valid point (see the invalid points' reasons in sweep.json)")
        raise SweepError(f"sweep {space.name}: {why}"[:500])
    if not any(space.area in p.get("resources", {}) for p in ok):
        have = sorted({r for p in ok for r in p.get("resources", {})})
        raise SweepError(f"sweep {space.name}: no point has the area resource {space.area!r}; the points have "
                         f"{', '.join(have)}")


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

    p = sub.add_parser("synth", help="synthesize, place and route the accelerator with the YoWASP tools; "
                                     "writes a resource and Fmax report (JSON and Markdown)")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("--target", default="generic",
                   help="generic (Yosys, no device), ecp5-85f (LFE5U-85F, out of context) or ice40-up5k "
                        "(default: generic)")
    p.add_argument("--freq", type=float, metavar="MHZ",
                   help="nextpnr's target clock in MHz (default: the config's clock_mhz)")
    from gemforge.hw.flow.synth import BOARDS
    p.add_argument("--board", choices=tuple(BOARDS),
                   help="build the board top (the accelerator, block RAM for DRAM, a UART bridge) on this board's "
                        "pins and clock instead of the bare accelerator; ulx3s is an ECP5-85F, icebreaker an iCE40UP5K")
    p.add_argument("--board-memory", type=int, default=64 << 10, metavar="BYTES",
                   help="with a board: bytes of block RAM standing in for DRAM (default 65536)")
    p.add_argument("--bitstream", action="store_true",
                   help="place and route on a board and write its bitstream (the target's board unless --board)")
    from gemforge.hw.flow.synth import PLACER_TIMING_WEIGHT, ROUTERS
    p.add_argument("--seed", type=int, metavar="N",
                   help="nextpnr's placement seed (default: nextpnr's own); another seed is another placement, "
                        "its Fmax a few percent either way")
    p.add_argument("--router", choices=ROUTERS, default="router1", help="nextpnr's router (default: router1)")
    p.add_argument("--timing-weight", type=int, default=PLACER_TIMING_WEIGHT, metavar="N",
                   help="how strongly nextpnr's placer favours the critical paths over wirelength "
                        f"(--placer-heap-timingweight; default: {PLACER_TIMING_WEIGHT}, nextpnr's own 10)")
    p.add_argument("--place-timeout", type=float, metavar="SECONDS",
                   help="stop place and route (or the board build) after this long, as an error (default: no limit)")
    p.add_argument("--lut-lanes", type=int, metavar="N",
                   help="GEMM dot-product lanes (of batch × block_out) whose multipliers are built from LUT logic "
                        "instead of DSP blocks (default: none where the DSP blocks suffice, else as many as it takes "
                        "for them to fit, found by a second synthesis)")
    p.add_argument("-o", "--output", required=True,
                   help="output directory: report.json, report.md, the Verilog, netlist and tool logs")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("asm", help="assemble a text program into a program file")
    p.add_argument("source", help="assembly source (.s)")
    p.add_argument("-o", "--output", required=True, help="program file to write")
    p.add_argument("--config", default="default", help=config_help)
    p.set_defaults(func=cmd_asm)

    p = sub.add_parser("disasm", help="print a program file as assembly text")
    p.add_argument("program", help="program file (from `gemforge asm` or a compiler)")
    p.set_defaults(func=cmd_disasm)

    p = sub.add_parser("cycles", help="a program file's cycles and per-engine busy/stall breakdown from the "
                                      "cycle model (no RTL), as JSON")
    p.add_argument("program", help="program file (from `gemforge asm`, `compile-op` or a compiler)")
    p.set_defaults(func=cmd_cycles)

    p = sub.add_parser("run-op", help="compile one operator and run it on a device")
    ops = p.add_subparsers(dest="op", metavar="OP", required=True)
    for name, spec in OPERATORS.items():
        q = ops.add_parser(name, help=spec.summary, description=spec.summary)
        _operator_arguments(q, name, files=True)
        q.add_argument("-o", "--output", required=True, help="output .npy to write")
        _common_operator_options(q, config_help)
        q.add_argument("--device", default="fsim", help=_DEVICE_HELP)
        q.add_argument("--stats", action="store_true", help="print the plan and the run's counters as JSON")
        q.add_argument("--waves", metavar="FILE",
                       help="on verilator or icarus: write the run's waveform (.vcd on verilator, .fst on icarus)")
        q.set_defaults(func=cmd_run_op)

    p = sub.add_parser("compile-op", help="compile one operator: a program file for the accelerator, "
                                          "LLVM IR, assembly or PTX for the cpu and gpu")
    ops = p.add_subparsers(dest="op", metavar="OP", required=True)
    for name, spec in OPERATORS.items():
        q = ops.add_parser(name, help=spec.summary, description=spec.summary)
        _operator_arguments(q, name, files=False)
        q.add_argument("-o", "--output", required=True, help="file to write (program, LLVM IR, assembly or PTX)")
        _common_operator_options(q, config_help)
        q.add_argument("--device", default="fsim", help=_DEVICE_HELP + "; the target to compile for")
        q.add_argument("--dtype", choices=("int8", "int32", "float32"),
                       help="operand type (default: int8; int32 for the accelerator's element-wise operators; "
                            "float32 for softmax)")
        q.add_argument("--emit", choices=("program", "llvm", "asm", "ptx"),
                       help="what to write: program (accelerator), llvm or asm (cpu), ptx or llvm (gpu)")
        q.add_argument("--arch", choices=GPU_ARCHS, help="GPU architecture for --device gpu (default sm_80)")
        q.add_argument("--trace", action="store_true", help="print the IR after every compiler stage (stderr)")
        q.set_defaults(func=cmd_compile_op)

    p = sub.add_parser("compile", help="compile an ONNX model into one .gfm file (float32, or int8 for the "
                                       "accelerator)")
    p.add_argument("model", help="ONNX model (opset 13 or newer; opsets 7 to 12 are upgraded to 13 on import)")
    p.add_argument("-o", "--output", required=True, help="the compiled model, .gfm")
    p.add_argument("--quantize", choices=["int8"], help="int8 with power-of-two scales (needs --calibrate)")
    p.add_argument("--calibrate", metavar="SAMPLES.npy",
                   help="float32 sample inputs stacked on a new first axis (a .npz of such arrays by input name for "
                        "a model with several inputs)")
    p.add_argument("--config", help="with --quantize, the accelerator the int8 layers are compiled for: preset "
                                    f"({', '.join(PRESETS)}) or a .toml/.json config file (default: default)")
    p.add_argument("--batch", type=int, default=1, help="the batch size a symbolic (or -1) first input dimension "
                                                         "takes (default 1; runs take any multiple; one batch of "
                                                         "inputs at most 16 GiB)")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="the shape of model input NAME, for one whose dimensions (other than the first, the batch) "
                        "are symbolic; repeat for several inputs")
    p.add_argument("--trace", action="store_true", help="print the graph after every pass on stderr")
    p.add_argument("--no-host-kernels", action="store_true",
                   help="do not compile the host layers' kernels now (by default they are compiled for this CPU "
                        "into the model file and the kernel cache, $GEMFORGE_CACHE or ~/.cache/gemforge, so that "
                        "runs on this CPU start without compiling; GEMFORGE_CACHE=off turns the cache off)")
    p.add_argument("--cpu", default="host", metavar="NAME",
                   help="the CPU the host kernels are compiled for: host (this machine's, default) or an x86-64 "
                        f"level ({', '.join(CPU_LEVELS)}), whose code runs on every machine of that level; a "
                        "run on a machine without its features compiles its own kernels instead")
    p.add_argument("--tuning-log", metavar="LOG",
                   help="use the schedules a `gemforge tune` log found (where it was made for this model, or "
                        "for any, and for this CPU or --config; otherwise the compile says why and goes on "
                        "untuned)")
    p.add_argument("--no-shipped-tuning", action="store_true",
                   help="tile the accelerator's layers with the planner's own choice, not the tilings gemforge ships "
                        "tuned for the preset (compiler/tuning/defaults/)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("tune", help="search the schedules of a model's operators (CPU products on this machine, "
                                    "or the accelerator's tilings on the cycle model) and write a tuning log",
                       description="AutoTVM-style schedule search: each tunable operator's candidate schedules are "
                                   "measured (CPU: timed on this machine; fsim: the calibrated cycle model), "
                                   "chosen by a cost model fitted to the measurements; the best of each is kept "
                                   "in a JSON-lines log for gemforge compile --tuning-log.")
    p.add_argument("model", help="ONNX model")
    p.add_argument("-o", "--output", required=True, help="the tuning log to write (JSON lines)")
    p.add_argument("--device", choices=["cpu", "fsim"], default="cpu",
                   help="cpu: the host kernels' products, timed here (default); fsim: the accelerator's "
                        "convolutions of an int8 network, on the cycle model (reproducible)")
    p.add_argument("--trials", type=int, default=32, help="configurations measured per operator at most (default 32)")
    p.add_argument("--time-budget", type=float, metavar="SECONDS",
                   help="stop after this many seconds (the operators tuned so far are in the log)")
    p.add_argument("--seed", type=int, default=0, help="the search's random choices (default 0)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="measure on this dask.distributed scheduler's workers (e.g. tcp://127.0.0.1:8786); "
                        "for the cpu, workers whose CPU is not this one's are refused")
    p.add_argument("--quantize", choices=["int8"], help="tune the int8 network (needed for --device fsim)")
    p.add_argument("--calibrate", metavar="SAMPLES.npy", help="as for gemforge compile")
    p.add_argument("--config", help=f"with --quantize, the accelerator config ({', '.join(PRESETS)} or a file; "
                                    "default: default)")
    p.add_argument("--batch", type=int, default=1, help="as for gemforge compile")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...", help="as for gemforge compile")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("run", help="run a compiled model (.gfm) on a device")
    p.add_argument("model", help="compiled model, .gfm")
    p.add_argument("--input", required=True, help="input .npy (float32, the ONNX model's layout), or a .npz of "
                                                   "arrays by input name for a model with several inputs")
    p.add_argument("-o", "--output", required=True, help="output .npy, or .npz for a model with several outputs")
    p.add_argument("--device", default="cpu",
                   help="where the network runs: cpu (default; every layer on the LLVM CPU back end) or gpu "
                        "(float32), or an accelerator device for an int8 model (fsim, verilator, icarus or "
                        "uart:PORT[@BAUD], a board; its other layers on the cpu)")
    p.add_argument("--profile", nargs="?", const="", metavar="PNG",
                   help="print a per-layer table and write a PNG of it (default: next to the output)")
    p.add_argument("--no-file-kernels", action="store_true",
                   help="compile the host layers here (once, into the kernel cache) instead of running the native "
                        "code a model file compiled for this CPU carries")
    p.add_argument("--per-layer", action="store_true",
                   help="run each accelerator layer as a program of its own instead of chaining consecutive "
                        "layers into one (a board reads its counters only where a program ends)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("regress", help="co-simulation regression: random programs on the RTL against fsim, "
                                       "mismatches located, shrunk and saved with a replay command")
    from .regression import add_arguments, cmd_regress
    add_arguments(p, "preset or .toml/.json config file")
    p.set_defaults(func=cmd_regress)

    p = sub.add_parser("sweep", help="evaluate a space of accelerator configs on a workload (cycle model, "
                                     "synthesis): CSV, JSON, Pareto and roofline plots",
                       description="Evaluate every point of a design space (see gemforge.driver.tools.sweep and "
                                   "examples/sweeps/small.toml): cycles from the cycle model, resources and Fmax "
                                   "from synthesis, throughput and efficiency; interrupted sweeps resume.")
    p.add_argument("space", nargs="?", help="the space file (.toml)")
    p.add_argument("-o", "--output", help="output directory (points are cached there; a rerun resumes)")
    p.add_argument("--jobs", type=int, default=1, help="local worker processes (default 1)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the points on this dask.distributed scheduler (e.g. tcp://127.0.0.1:8786)")
    p.add_argument("--report", metavar="DIR", help="write DIR/report.md from a finished sweep and print its path")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("demo", help="run the kit end to end on embedded defaults")
    p.add_argument("--device", default="fsim", help=_DEVICE_HELP)
    p.add_argument("-o", "--output-dir", default="build/demo",
                   help="where the Verilog and the profile plot go (default: build/demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="measure performance against in-run baselines; prints JSON")
    p.add_argument("--config", default="default", help=config_help)
    p.add_argument("--quick", action="store_true", help="small sizes, one repetition (smoke run)")
    p.add_argument("--device", help="also measure GEMM-core utilization on this RTL device (verilator, icarus)")
    p.add_argument("-o", "--output", help="also write the JSON to this file")
    p.add_argument("--markdown", metavar="FILE", help="also write the figures as Markdown (BENCHMARKS.md)")
    p.add_argument("--core-configs", metavar="NAMES",
                   help="with --device: also measure the core rates (DMA, GEMM, ALU) of these comma-separated configs")
    p.add_argument("--sections", metavar="LIST",
                   help="what to measure, comma-separated: fsim, rtl, regress, cpu, network, models, tuning, gpu, synth, "
                        "sweep "
                        "(default: fsim, cpu, network (the digits CNN, ResNet-18 and MobileNetV2 compiled whole; on an RTL "
                        "--device too: cycles, useful-MAC utilization, rooflines), models (networks as exporters write them: accuracy, accelerator share, compile time), rtl "
                        "and regress (co-simulation regression throughput) with an RTL --device, gpu where a GPU "
                        "is present; tuning (gemforge tune on ResNet-18 and MobileNetV2, CPU and cycle model: the gain and "
                        "the tuning time, about a quarter of an hour), synth (every preset through Yosys and the ECP5 flow, about "
                        "half an hour) and sweep "
                        "(examples/sweeps/resnet18.toml, under an hour) only when named); cpu's ResNet-18 convolutions are compared with "
                        "ONNX Runtime, measured where it is installed (the dev extra)")
    p.add_argument("--merge", metavar="FILE", action="append",
                   help="also report the sections of an earlier run's JSON (-o) that this run did not measure, "
                        "e.g. GPU figures from a machine with a GPU or the synthesis figures (repeatable)")
    p.set_defaults(func=cmd_bench)

    return parser


_DEVICE_HELP = ("device: fsim (default), verilator or icarus (the accelerator, simulated or co-simulated), "
                "cpu (LLVM, this machine), gpu (LLVM NVPTX, CUDA) or uart:PORT[@BAUD] (a board with the board "
                "top, gemforge.hw.board, through its UART bridge)")


def _operator_arguments(parser: argparse.ArgumentParser, op: str, files: bool) -> None:
    """An operator's inputs (files for run-op, shapes for compile-op) and options."""
    spec = OPERATORS[op]
    if files:
        for key, option, what in spec.inputs:
            parser.add_argument(f"--{option}", required=True, help=f"{what} .npy")
    elif op in ("gemm", "dense"):
        parser.add_argument("--shape", required=True, help="M,K,N")
    elif op == "conv2d":
        parser.add_argument("--input-shape", required=True, help="N,C,H,W")
        parser.add_argument("--weight-shape", required=True, help="O,C/groups,KH,KW")
    else:
        parser.add_argument("--shape", required=True, help="the input's shape, e.g. 1,64,56,56")
        if op in ("add", "mul"):
            parser.add_argument("--other-shape", help="the second input's shape (default: the first's)")
    if spec.epilogue:
        if files:
            parser.add_argument("--bias", help="bias .npy: one per output column/channel (int32, or float32)")
        else:
            parser.add_argument("--bias", action="store_true", help="the operator takes a bias input")
        parser.add_argument("--shift", type=int, help="int8: requantize (arithmetic shift right, clip to int8)")
        parser.add_argument("--relu", action="store_true", help="ReLU (int8 with --shift: clip at 0 instead of -128)")
    if spec.add_options:
        spec.add_options(parser)


def _common_operator_options(parser: argparse.ArgumentParser, config_help: str) -> None:
    parser.add_argument("--config", default="default", help=config_help)
    parser.add_argument("--no-latency-hiding", action="store_true",
                        help="one virtual thread: no overlap of loads, compute and stores")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
    except _user_errors() as exc:
        print(f"gemforge: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `gemforge disasm x | head`
        return 0
    except MemoryError:
        print("gemforge: error: not enough memory for the tensors of this command (check the shapes, "
              "padding and sizes)", file=sys.stderr)
        return 2
    except OSError as exc:  # unwritable output, full disk, ...
        # gemforge.files' errors are whole sentences that begin by naming the file.
        named = (exc.strerror or "").startswith(f"cannot write {exc.filename}: ")
        where = f": {exc.filename}" if exc.filename and not named else ""
        print(f"gemforge: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    return status or 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
