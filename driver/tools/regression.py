"""`gemforge regress`: co-simulation regression from the command line.

Runs random programs on the RTL and fsim (`gemforge.sim.regress`) with a
progress bar on stderr and a JSON summary on stdout; exit status 1 when any
program differs. Each mismatch (up to ``--investigate``) is located, shrunk and
saved under ``-o`` with a waveform and a replay command; ``--replay FILE``
runs one saved (or any) program file the same way; ``--mutant NAME`` runs
against deliberately broken gateware (`gemforge.sim.mutants`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from gemforge.files import check_regular_input
from gemforge.hw.config import AccelConfig, load_config
from gemforge.hw.program import Program
from gemforge.sim import regress
from gemforge.sim.cosim import harness
from gemforge.sim.mutants import MUTANTS, applied

__all__ = ["add_arguments", "cmd_regress"]


def add_arguments(p: argparse.ArgumentParser, config_help: str) -> None:
    p.add_argument("--config", action="append", metavar="CFG",
                   help=f"{config_help}; repeat for several (default: tiny unless --random-configs)")
    p.add_argument("--random-configs", type=int, default=0, metavar="N",
                   help="also N random valid configs, drawn from --config-seed")
    p.add_argument("--config-seed", type=int, default=0,
                   help="seed of the random configs (default: 0), so a later run meets the same ones")
    p.add_argument("--count", type=int, default=200, help="random programs to run (default: 200)")
    p.add_argument("--seed", type=int, default=0,
                   help="first program seed: programs are seeds S..S+count-1, so --seed S --count 1 reruns one")
    p.add_argument("--device", default="verilator", choices=harness.SIMULATORS, help="RTL simulator")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                   help="simulator processes at once (default: the CPU count, at most 8)")
    p.add_argument("--batch", type=int, default=100, help="programs per simulator process (default: 100)")
    p.add_argument("-o", "--output-dir", default="regress-failures",
                   help="where mismatches are saved, one folder each (default: regress-failures)")
    p.add_argument("--investigate", type=int, default=1, metavar="K",
                   help="locate, shrink and save the first K mismatches (default: 1)")
    p.add_argument("--no-shrink", action="store_true", help="save mismatches as they are, without shrinking")
    p.add_argument("--replay", metavar="PROGRAM", help="run this program file (.gfp) on the RTL and fsim instead")
    p.add_argument("--stall", type=int, default=0,
                   help="with --replay: AXI back-pressure, 0-255 (the replay command of a saved mismatch sets it)")
    p.add_argument("--waves", metavar="FILE",
                   help="with --replay or --count 1: write the run's waveform (.vcd on verilator, .fst on icarus)")
    p.add_argument("--mutant", choices=sorted(MUTANTS),
                   help="run against deliberately broken gateware (it must fail): "
                        + "; ".join(f"{m.name}: {m.description}" for m in MUTANTS.values()))


def _configs(args: argparse.Namespace) -> list[AccelConfig]:
    configs = [load_config(spec) for spec in (args.config or [])]
    if args.random_configs < 0:
        raise regress.RegressError(f"--random-configs must be 0 or more, not {args.random_configs}")
    rng = np.random.default_rng([args.config_seed, 0xC0F16])
    configs += [regress.random_config(rng, name=f"random{i}") for i in range(args.random_configs)]
    return configs or [load_config("tiny")]


def _waves_path(args: argparse.Namespace) -> Path | None:
    if not args.waves:
        return None
    formats = harness.WAVE_FORMATS[args.device]
    path = Path(args.waves)
    if path.suffix not in formats:
        raise regress.RegressError(f"{args.device} writes waveforms as {' or '.join(formats)}; "
                                   f"name the file accordingly, not {path.name}")
    if path.is_dir():
        raise regress.RegressError(f"--waves {path} is a directory; give a file name")
    return path


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_regress(args: argparse.Namespace) -> int:
    with applied(args.mutant) if args.mutant else contextlib.nullcontext() as mutant:
        variant = mutant.variant if mutant else ""
        return _replay(args, variant) if args.replay else _regress(args, variant)


def _regress(args: argparse.Namespace, variant: str) -> int:
    for name in ("count", "jobs", "batch"):
        if getattr(args, name) < 1:
            raise regress.RegressError(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.investigate < 0:
        raise regress.RegressError(f"--investigate must be 0 or more, not {args.investigate}")
    for name in ("seed", "config_seed"):
        if getattr(args, name) < 0:
            raise regress.RegressError(f"--{name.replace('_', '-')} must be 0 or more, not {getattr(args, name)}")
    waves = _waves_path(args)
    if waves is not None and args.count != 1:
        raise regress.RegressError("--waves records one program: use it with --replay or --count 1 "
                                   "(a mismatch's waveform is saved under -o anyway)")
    configs = _configs(args)
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise regress.RegressError(f"configs must have distinct names, got {', '.join(names)}")

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task(f"building {len(configs)} config(s)", total=args.count)
        report = regress.regress(
            configs, args.count, args.seed, args.device, jobs=args.jobs, batch=args.batch, variant=variant,
            on_build=lambda c: progress.update(task, description=f"building {c.name} ({args.device})"),
            on_progress=lambda n: progress.update(task, completed=n, description="programs"))
        progress.update(task, completed=report.programs, description="programs")
    if waves is not None:
        case = regress.regress_case(configs[0], args.seed)
        built = harness.build(configs[0], args.device, waves=waves.suffix, variant=variant)
        regress.run_cases(built, [case], waves=waves)
        _say(f"waveform of {case.label}: {waves}")
    for failed in report.mismatches[:args.investigate]:
        out = Path(args.output_dir) / f"{failed.case.config.name}-seed{failed.case.seed}"
        _say(f"MISMATCH {failed.case.label}: {failed.mismatch}")
        built = harness.build(failed.case.config, args.device, variant=variant)
        summary = regress.investigate(built, failed.case, out, shrink_it=not args.no_shrink, on_step=_say)
        report.investigations.append(summary)
        _say(summary["divergence"])
        _say(f"saved in {out}; replay: {summary['replay']}")
    print(json.dumps(report.as_dict(), indent=2))
    verdict = "PASS" if not report.mismatches else "FAIL"
    _say(f"{verdict}: {report.programs} programs on {args.device} ({', '.join(names)}), "
         f"{len(report.mismatches)} mismatch(es), {report.programs_per_second:.1f} programs/s")
    return 1 if report.mismatches else 0


def _replay(args: argparse.Namespace, variant: str) -> int:
    path = Path(args.replay)
    try:
        check_regular_input(path)
        data = path.read_bytes()
    except FileNotFoundError:
        raise regress.RegressError(f"program file {path} does not exist") from None
    except IsADirectoryError:
        raise regress.RegressError(f"{path} is a directory, not a program file") from None
    except OSError as exc:
        raise regress.RegressError(f"cannot read program file {path}: {exc.strerror}") from None
    program = Program.from_bytes(data, source=str(path))
    if not 0 <= args.stall <= 255:
        raise regress.RegressError(f"--stall must be between 0 and 255 (probability in 256ths), not {args.stall}")
    waves = _waves_path(args)
    case = regress.case_from_program(program, stall=args.stall)
    race = regress.race_in(case)
    if race:
        _say(f"warning: {race}; fsim and the RTL may legitimately differ")
    _say(f"building {program.config.name} ({args.device})")
    built = harness.build(program.config, args.device, waves=waves.suffix if waves else "", variant=variant)
    with tempfile.TemporaryDirectory(prefix="gemforge-replay-") as scratch:
        text, mismatch = regress.describe_failure(built, case, Path(scratch) / "retire_trace.txt", waves=waves)
    result = {"program": str(path), "config": program.config.name, "device": args.device, "stall": args.stall,
              "instructions": len(program.instructions), "mismatch": mismatch}
    if mismatch:
        result["divergence"] = text
        _say(text)
    if waves is not None:
        result["waves"] = str(waves)
    print(json.dumps(result, indent=2))
    _say(f"{'FAIL' if mismatch else 'PASS'}: {path.name} on {args.device}")
    return 1 if mismatch else 0
