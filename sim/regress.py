"""Co-simulation regression: random valid programs on the RTL against fsim, bit for bit.

A *case* is one random program (`gemforge.sim.cosim.random_program`) for one
config, drawn from one integer seed, together with the AXI back-pressure the
DRAM model applies while it runs; the same seed always gives the same case, so
``--seed S --count 1`` replays case S. Each case runs on fsim (the reference)
and on the RTL; the DRAM window afterwards must be identical, the RTL must
finish without touching memory outside it, and it must retire every
instruction and write exactly the bytes the program's STOREs write.

Throughput comes from batching: the simulator is built once per config and
runs a batch of cases per process (`harness.run_batch`); ``jobs`` batches run at
once. A mismatch is investigated (`investigate`): the first diverging
instruction is located from fsim's instruction trace and the RTL's retire trace
(`gemforge.sim.trace`), the program is shrunk to a minimal one that still fails
(`shrink`), and the reproducer is saved as a program file, the config, a
waveform of the failing run and a one-line replay command.

A case is laid out exactly as `Device.load_program` lays out a program on a
fresh device (the arena at the first aligned address, the instruction stream
right after it), so replaying the saved program file on a device reproduces
the same bus addresses.

About one case in `FAULT_CASES` is a *fault case* (`random_fault_case`): its
random program has one more LOAD or STORE, whose DRAM tile runs past the top of
the 32-bit address space (`Fault.DRAM_RANGE`) or ends exactly at it, beyond the
simulated DRAM (`Fault.BUS_ERROR`). The RTL must end it with fsim's fault and the
ERROR_INFO the datasheet gives, without touching DRAM outside the window where
the fault is found before the access.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from gemforge.files import write_bytes_atomic, write_text_atomic
from gemforge.hw.config import AccelConfig, ConfigError
from gemforge.hw.isa import (
    DEP_FLAGS, LOAD_ENGINE, STORE_MEMS, TOKEN_POPS, TOKEN_PUSHES, Alu, Gemm, Instruction, Load, MemType, Store,
    encode_program, encode_uops, engine_of, mnemonic,
)
from gemforge.hw.program import Program, TensorRegion, arena_alignment
from gemforge.hw.microarch import READ_CLIENTS
from gemforge.hw.regmap import ADDRESS_TOP, ERROR_INFO_WRITE, Fault

from .cosim import harness
from .cosim.random_program import random_program
from .fsim import Fsim, FsimError
from .trace import Divergence, Tracer, find_race, locate_divergence, retire_cycles

__all__ = ["Case", "CaseResult", "Report", "RegressError", "random_case", "random_fault_case", "regress_case",
           "random_config", "case_from_program", "FAULT_CASES",
           "run_cases", "regress", "investigate", "shrink", "describe_failure", "race_in", "STALLS"]

#: AXI back-pressure levels (the DRAM model withholds each handshake with probability
#: stall/256), cycled through by case seed: a third of the cases run without stalls.
STALLS = (0, 64, 0, 115, 0, 160)
#: The DRAM model's stall generator seed (see `run_cases`).
STALL_SEED = 1


#: The RTL counters each case checks (their values are defined by the program alone).
CHECKED_COUNTERS = ("insns_retired", "dma_bytes_written")
#: One case in this many (drawn by seed) is a fault case (`random_fault_case`).
FAULT_CASES = 8


class RegressError(RuntimeError):
    """The regression could not run (not a mismatch: a build failure, a bad option)."""


@dataclass(frozen=True)
class Case:
    """One program for one config, and the back-pressure it runs under."""

    config: AccelConfig
    seed: int | None          # None for a program that came from a file
    stall: int
    program: Program          # relocatable: one constant tensor "data" (the data region)
    #: For a fault case, the fault and ERROR_INFO the program must end with (fsim's and the
    #: RTL's); None for a program that must run to DONE.
    fault: tuple[Fault, int] | None = None

    @property
    def label(self) -> str:
        what = f"seed {self.seed}" if self.seed is not None else "program"
        return f"{self.config.name} {what}" + (f" (fault case, {self.fault[0].name})" if self.fault else "")


def random_case(config: AccelConfig, seed: int) -> Case:
    """The case of ``seed``: program options and data are all drawn from it."""
    rng = np.random.default_rng([seed, 0x9E3779B9])
    options = {"groups": int(rng.integers(1, 5)), "max_loop": int(rng.integers(1, 4)),
               "max_tile": int(rng.choice([2, 4, 8])), "uop_heavy": bool(rng.random() < 0.3)}
    rp = random_program(config, rng, 0, **options)
    return case_from_instructions(config, rp.instructions, rp.data, seed=seed, stall=STALLS[seed % len(STALLS)])


def regress_case(config: AccelConfig, seed: int) -> Case:
    """The case `regress` runs for ``seed``: a fault case for about one seed in `FAULT_CASES`
    (drawn from a stream of its own, so the other seeds' cases equal `random_case`'s)."""
    if np.random.default_rng([seed, 0xFA17]).integers(FAULT_CASES) == 0:
        return random_fault_case(config, seed)
    return random_case(config, seed)


def random_fault_case(config: AccelConfig, seed: int) -> Case:
    """``random_case(config, seed)`` with one LOAD or STORE more, without dependency flags,
    whose DRAM tile (after the case's relocation) runs past the top of the address space by
    a few entries — `Fault.DRAM_RANGE` at its dispatch, ERROR_INFO its index — or, one case in
    four, ends exactly at the top, beyond the simulated DRAM: `Fault.BUS_ERROR`, ERROR_INFO the
    AXI ID of the engine's DMA client (or the write flag). It goes at a random place in the
    program where fsim reaches it (else first): instructions before it that wait for tokens
    from after it could keep it from ever being dispatched."""
    case = random_case(config, seed)
    rng = np.random.default_rng([seed, 0xFA17, 1])
    c = config
    if rng.random() < 0.5:
        mem = MemType(int(rng.choice(list(LOAD_ENGINE))))
        kind, extra, buffer = Load, {}, mem.buffer
        client = f"{LOAD_ENGINE[mem].value}_{mem.buffer}"
        bus_info = READ_CLIENTS.index(client)
    else:
        mem = MemType(int(rng.choice(list(STORE_MEMS))))
        requant = mem == MemType.ACC and bool(rng.random() < 0.5)
        kind, extra, buffer = Store, {"requant": requant}, "out" if requant else mem.buffer
        bus_info = ERROR_INFO_WRITE | 0
    # A tile inside its on-chip buffer (a BUFFER_RANGE fault would come first).
    x = int(rng.integers(1, min(3, c.depth(mem.buffer)) + 1))
    y = int(rng.integers(1, min(3, c.depth(mem.buffer) // x) + 1))
    stride = int(rng.choice([x, x + int(rng.integers(1, 64))]))
    entry = c.entry_bytes(buffer)
    past = int(rng.integers(1, 4)) if rng.random() < 0.75 else 0      # entries past the top
    span = (y - 1) * stride + x
    # dram_base is a 32-bit field: with 1-byte entries the tile can pass the top only by its
    # length, so the base is capped there and the fault follows from where the tile really ends.
    absolute = min(ADDRESS_TOP // entry + past - span, ADDRESS_TOP - 1)
    past = (absolute + span) * entry > ADDRESS_TOP
    # Arena-relative: relocation adds the arena's base (`_layout`).
    dram_base = absolute - arena_alignment(c) // entry
    extra_insn = kind(mem=mem, sram_base=0, dram_base=dram_base, y_size=y, x_size=x, x_stride=stride, **extra)
    insns = case.program.instructions
    data = case.program.constants["data"]
    for place in (int(rng.integers(0, len(insns))), 0):
        faulty = insns[:place] + [extra_insn] + insns[place:]
        fault = (Fault.DRAM_RANGE, place) if past else (Fault.BUS_ERROR, bus_info)
        candidate = dataclasses.replace(
            case_from_instructions(c, faulty, data, seed=seed, stall=case.stall), fault=fault)
        try:
            fsim_reference(candidate, _window_bytes([candidate]))
        except FsimError as exc:
            if exc.fault == fault[0]:
                return candidate
    raise RegressError(f"{case.label}: fsim does not reach the out-of-range instruction even first")  # pragma: no cover


def case_from_instructions(config: AccelConfig, instructions: list[Instruction], data: np.ndarray, *,
                           seed: int | None, stall: int) -> Case:
    """A case of arena-relative ``instructions`` over the data region ``data``."""
    program = Program(config, list(instructions), arena_bytes=data.size,
                      tensors={"data": TensorRegion("data", 0, (data.size,), "uint8")}, constants={"data": data})
    return Case(config, seed, stall, program)


def case_from_program(program: Program, stall: int = 0) -> Case:
    """A case from a program file: one that `investigate` saved (a "data" tensor covering
    the arena), or any program, whose arena is then its micro-ops and constants."""
    data = np.zeros(max(program.arena_bytes, 1), np.uint8)
    if program.uops:
        raw = np.frombuffer(encode_uops(program.uops, program.config), np.uint8)
        data[program.uop_offset:program.uop_offset + raw.size] = raw
    for name, array in program.constants.items():
        region = program.tensors[name]
        data[region.offset:region.offset + region.nbytes] = np.frombuffer(np.ascontiguousarray(array).tobytes(),
                                                                           np.uint8)
    size = -(-data.size // 4096) * 4096
    data = np.concatenate([data, np.zeros(size - data.size, np.uint8)])
    return case_from_instructions(program.config, program.instructions, data, seed=None, stall=stall)


def random_config(rng: np.random.Generator, name: str = "random") -> AccelConfig:
    """A random valid config of a size the RTL simulators build in about a minute:
    any shape and widths the ISA allows, buffers of 2 to 1024 entries, any bus width."""
    for _ in range(100):
        shape = {k: 1 << int(rng.integers(0, 4)) for k in ("batch", "block_in", "block_out")}
        inp_width, wgt_width = (int(rng.choice((8, 16))) for _ in range(2))
        acc_width = int(rng.choice((16, 32)))
        out_width = int(rng.choice([w for w in (8, 16, 32) if w <= acc_width]))
        entry = {"inp": shape["batch"] * shape["block_in"] * inp_width // 8,
                 "wgt": shape["block_out"] * shape["block_in"] * wgt_width // 8,
                 "acc": shape["batch"] * shape["block_out"] * acc_width // 8,
                 "out": shape["batch"] * shape["block_out"] * out_width // 8}
        depth = {b: 1 << int(rng.integers(1, 11)) for b in ("inp", "wgt", "acc")}
        depth["out"] = depth["acc"]
        if sum(depth[b] * entry[b] for b in entry) > 256 * 1024:
            continue              # a few hundred KiB of buffers at most: builds stay quick
        try:
            return AccelConfig(
                name=name, **shape, inp_width=inp_width, wgt_width=wgt_width, acc_width=acc_width,
                out_width=out_width, **{f"{b}_buffer_bytes": depth[b] * entry[b] for b in entry},
                uop_buffer_bytes=(1 << int(rng.integers(2, 10))) * 8,
                bus_width=int(rng.choice((64, 128, 256, 512))),
                cmd_queue_depth=1 << int(rng.integers(1, 6)), token_queue_depth=1 << int(rng.integers(1, 6)))
        except ConfigError:
            continue
    raise RegressError("could not draw a valid random config")  # pragma: no cover


# ---------------------------------------------------------------------------- layout and reference

def _layout(case: Case) -> tuple[int, list[Instruction], np.ndarray]:
    """(base, absolute instructions, data+instruction bytes) as a fresh device lays the case out."""
    base = arena_alignment(case.config)
    insns = case.program.relocated(base)
    data = case.program.constants["data"]
    stream = np.frombuffer(encode_program(insns, case.config), np.uint8)
    return base, insns, np.concatenate([data, stream])


def _window_bytes(cases: list[Case]) -> int:
    """One DRAM window size for a batch: the largest case, in whole 4 KiB pages."""
    return max(-(-(_layout(c)[2].size) // 4096) * 4096 for c in cases)


def _image(case: Case, window: int) -> tuple[int, np.ndarray, int, int]:
    base, insns, content = _layout(case)
    image = np.zeros(window, np.uint8)
    image[:content.size] = content
    return base, image, base + case.program.constants["data"].size, len(insns)


class Reference(NamedTuple):
    """fsim's run of a case: the window afterwards, its counters, and its `Tracer` when asked for."""

    window: np.ndarray
    counters: dict[str, int]
    tracer: Tracer | None

    @property
    def stored_bytes(self) -> int:
        """The DRAM bytes the run wrote: what the RTL's ``dma_bytes_written`` must count."""
        return sum(v for k, v in self.counters.items() if k.startswith("store_bytes_"))


def fsim_reference(case: Case, window: int, tracing: bool = False,
                   laid_out: tuple[int, np.ndarray, int, int] | None = None) -> Reference:
    """Run the case on fsim (with a `Tracer` watching, when ``tracing``). ``laid_out`` is the
    case's `_image` when the caller has it already."""
    base, image, insn_addr, count = laid_out or _image(case, window)
    dram = np.zeros(base + window, np.uint8)
    dram[base:] = image
    tracer = Tracer(case.config, dram.size) if tracing else None
    sim = Fsim(case.config, dram, observer=tracer)
    counters = sim.run(insn_addr, count)
    return Reference(dram[base:].copy(), counters, tracer)


def compare(case: Case, expected: Reference | None, got: np.ndarray, result: dict, base: int) -> str | None:
    """Why the RTL's run differs from fsim's (one sentence), or None when it matches;
    ``expected`` is fsim's run (None for a fault case, whose outcome is its fault and not its
    DRAM) and ``base`` the DRAM address of the windows' first byte."""
    status = result.get("status")
    if case.fault is not None:
        fault, info = case.fault
        if status != "fault" or result.get("fault") != fault.name or result.get("fault_info") != info:
            got = f"{status} {result.get('fault', '')} ERROR_INFO {result.get('fault_info', 0):#x}" \
                if status == "fault" else f"{status}: {result.get('message', '')}"
            return f"fsim ends the program with {fault.name} (ERROR_INFO {info:#x}), the RTL with {got}"
        if result.get("oob") and fault != Fault.BUS_ERROR:
            return f"the RTL accessed DRAM outside the program's window before its {fault.name} fault"
        return None
    if status != "done":
        detail = result.get("message") or json.dumps(result.get("debug", {}), sort_keys=True)
        return f"the RTL did not finish ({status}): {detail}"
    if result.get("oob"):
        return "the RTL accessed DRAM outside the program's window"
    if not np.array_equal(expected.window, got):
        diff = np.flatnonzero(expected.window != got)
        return f"{diff.size} DRAM byte(s) differ, the first at {base + diff[0]:#x}"
    counters = result.get("counters", {})
    count = len(case.program.instructions)
    if counters.get("insns_retired") != count:
        return f"the RTL retired {counters.get('insns_retired')} instructions, not {count}"
    if counters.get("dma_bytes_written") != expected.stored_bytes:
        return (f"the RTL wrote {counters.get('dma_bytes_written')} DRAM bytes, fsim's run "
                f"{expected.stored_bytes}")
    return None


# ---------------------------------------------------------------------------- running

@dataclass
class CaseResult:
    case: Case
    mismatch: str | None
    cycles: int | None


def run_cases(built: harness.Build, cases: list[Case], *, progress: Callable[[int], None] | None = None,
              waves: Path | None = None, retire_trace: Path | None = None,
              watchdog_cycles: int = 100_000) -> list[CaseResult]:
    """Run ``cases`` (one config, one stall level) in one simulator process and compare each
    with fsim. A case fsim rejects is a generator bug and raises."""
    if not cases:
        return []
    stall = cases[0].stall
    if any(c.stall != stall or c.config != built.config for c in cases):
        raise RegressError("a batch runs cases of one config and one stall level")
    window = _window_bytes(cases)
    expected, programs = [], []
    for case in cases:
        laid_out = _image(case, window)
        base, image, insn_addr, count = laid_out
        try:
            expected.append(fsim_reference(case, window, laid_out=laid_out))
            if case.fault is not None:
                raise RegressError(f"{case.label}: fsim runs the program, which should end with "
                                   f"{case.fault[0].name}")
        except FsimError as exc:
            if case.fault is None or exc.fault != case.fault[0]:
                raise RegressError(f"{case.label}: fsim rejects the program ({exc})") from None
            expected.append(None)      # a faulted run's DRAM is not dumped
        programs.append(harness.BatchProgram(image, insn_addr, count))
    base = arena_alignment(built.config)
    # One stall seed for every case: each program starts from reset with the DRAM model's
    # random stalls at the same state, so a case behaves alike alone or in a batch.
    outs = harness.run_batch(built, programs, base, stall=stall, seed=STALL_SEED, progress=progress, waves=waves,
                             retire_trace=retire_trace, watchdog_cycles=watchdog_cycles,
                             counters=list(CHECKED_COUNTERS))
    return [CaseResult(case, compare(case, exp, got, result, base), result.get("cycles"))
            for case, exp, (got, result) in zip(cases, expected, outs)]


@dataclass
class Report:
    """The outcome of a regression run."""

    simulator: str
    programs: int = 0
    mismatches: list[CaseResult] = field(default_factory=list)
    per_config: dict[str, dict] = field(default_factory=dict)
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    cycles: int = 0
    investigations: list[dict] = field(default_factory=list)

    @property
    def programs_per_second(self) -> float:
        return self.programs / self.run_seconds if self.run_seconds else 0.0

    def as_dict(self) -> dict:
        return {"simulator": self.simulator, "programs": self.programs, "mismatches": len(self.mismatches),
                "programs_per_s": round(self.programs_per_second, 2), "cycles": self.cycles,
                "build_s": round(self.build_seconds, 2), "run_s": round(self.run_seconds, 2),
                "configs": self.per_config,
                "failures": [{"case": r.case.label, "why": r.mismatch} for r in self.mismatches],
                "investigations": self.investigations}


def regress(configs: list[AccelConfig], count: int, seed: int, simulator: str, *, jobs: int = 1,
            batch: int = 100, variant: str = "", on_build: Callable[[AccelConfig], None] | None = None,
            on_progress: Callable[[int], None] | None = None) -> Report:
    """Run cases ``seed .. seed+count-1`` (case k on ``configs[k % len(configs)]``) on
    ``simulator`` and fsim. ``on_progress(n)`` is told the number of programs finished."""
    if count < 1:
        raise RegressError(f"count must be at least 1, not {count}")
    if jobs < 1 or batch < 1:
        raise RegressError("jobs and batch must be at least 1")
    report = Report(simulator)
    t0 = time.perf_counter()
    builds = {}
    for config in configs:
        if on_build:
            on_build(config)
        try:
            builds[config] = harness.build(config, simulator, variant=variant)
        except harness.CosimError as exc:
            raise RegressError(str(exc)) from None
    report.build_seconds = time.perf_counter() - t0

    # Batches: per config and stall level, in seed order, at most `batch` cases each;
    # split further so every job has work.
    groups: dict[tuple, list[int]] = {}
    for k in range(count):
        s = seed + k
        config = configs[k % len(configs)]
        groups.setdefault((config, STALLS[s % len(STALLS)]), []).append(k)
    size = max(1, min(batch, -(-count // jobs)))
    batches = [ks[i:i + size] for ks in groups.values() for i in range(0, len(ks), size)]
    lock = threading.Lock()
    finished = {id(b): 0 for b in batches}

    def work(ks: list[int]) -> list[CaseResult]:
        cases = [regress_case(configs[k % len(configs)], seed + k) for k in ks]

        def progress(done: int) -> None:
            with lock:
                finished[id(ks)] = done
                if on_progress:
                    on_progress(sum(finished.values()))

        try:
            return run_cases(builds[cases[0].config], cases, progress=progress)
        except harness.CosimError as exc:
            raise RegressError(str(exc)) from None

    t1 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = [r for rs in pool.map(work, batches) for r in rs]
    report.run_seconds = time.perf_counter() - t1
    results.sort(key=lambda r: r.case.seed)
    for r in results:
        report.programs += 1
        report.cycles += r.cycles or 0
        stats = report.per_config.setdefault(r.case.config.name, {"programs": 0, "fault_programs": 0,
                                                                  "mismatches": 0})
        stats["programs"] += 1
        stats["fault_programs"] += r.case.fault is not None
        if r.mismatch:
            stats["mismatches"] += 1
            report.mismatches.append(r)
    return report


# ---------------------------------------------------------------------------- shrinking

def _transfer_flags(insns: list[Instruction], drop: int) -> list[Instruction] | None:
    """``insns`` without instruction ``drop``, its dependency flags moved to neighbours of
    the same engine so every token is still pushed and popped (pops to the next such
    instruction, pushes to the previous one, else the next). None when a flag has
    nowhere to go."""
    victim = insns[drop]
    out = list(insns)
    engine = engine_of(victim)
    same = [i for i, insn in enumerate(insns) if i != drop and engine_of(insn) == engine]
    before = [i for i in same if i < drop]
    after = [i for i in same if i > drop]
    for flag in DEP_FLAGS:
        if not getattr(victim, flag):
            continue
        targets = (after[:1] if flag.startswith("pop") else before[-1:] + after[:1])
        for t in targets:
            if not getattr(out[t], flag):
                out[t] = dataclasses.replace(out[t], **{flag: True})
                break
        else:
            return None
    del out[drop]
    return out


def _simplifications(insn: Instruction) -> list[Instruction]:
    """Smaller versions of one instruction (fewer loop iterations, smaller tiles, no padding)."""
    out = []
    if isinstance(insn, (Gemm, Alu)):
        for changes in ({"iter_out": 1}, {"iter_in": 1}, {"uop_end": insn.uop_bgn + 1}):
            if any(getattr(insn, k) != v for k, v in changes.items()):
                out.append(dataclasses.replace(insn, **changes))
        if isinstance(insn, Gemm) and (insn.reset or insn.overwrite):
            out.append(dataclasses.replace(insn, reset=False, overwrite=False))
    if isinstance(insn, Store) and insn.requant:
        out.append(dataclasses.replace(insn, requant=False, shift=0, relu=False, bias=False, bias_per_row=False,
                                       bias_base=0))
    if isinstance(insn, (Load, Store)):
        for changes in ({"y_size": 1}, {"x_size": 1}):
            if any(getattr(insn, k) != v for k, v in changes.items()):
                out.append(dataclasses.replace(insn, **changes))
        if isinstance(insn, Load) and insn.mem != MemType.UOP and \
                any((insn.y_pad0, insn.y_pad1, insn.x_pad0, insn.x_pad1)):
            out.append(dataclasses.replace(insn, y_pad0=0, y_pad1=0, x_pad0=0, x_pad1=0))
    return out


def _token_links(insns: list[Instruction]) -> list[tuple[int, str, int, str]]:
    """Every dependency as ``(pusher, push flag, popper, pop flag)``: the k-th push to a
    token queue is consumed by the k-th pop from it."""
    pushes: dict[str, list[tuple[int, str]]] = {}
    pops: dict[str, list[tuple[int, str]]] = {}
    for i, insn in enumerate(insns):
        engine = engine_of(insn)
        for flag, queue in TOKEN_PUSHES[engine].items():
            if getattr(insn, flag):
                pushes.setdefault(queue, []).append((i, flag))
        for flag, queue in TOKEN_POPS[engine].items():
            if getattr(insn, flag):
                pops.setdefault(queue, []).append((i, flag))
    return [(i, pf, j, qf) for queue, pushed in pushes.items()
            for (i, pf), (j, qf) in zip(pushed, pops.get(queue, []))]


def _without(insns: list[Instruction], drop: set[int], links) -> list[Instruction]:
    """``insns`` without the instructions in ``drop`` and without their dependencies: the
    other end of each token they push or pop is cleared too, so the tokens still balance."""
    out = list(insns)
    for i, push_flag, j, pop_flag in links:
        if i in drop and j not in drop:
            out[j] = dataclasses.replace(out[j], **{pop_flag: False})
        elif j in drop and i not in drop:
            out[i] = dataclasses.replace(out[i], **{push_flag: False})
    return [insn for k, insn in enumerate(out) if k not in drop]


def _candidates(insns: list[Instruction]) -> list[list[Instruction]]:
    """Smaller programs, largest reductions first: runs of instructions removed (halves,
    quarters, ... down to one; each both with its dependencies moved to neighbours and
    with them removed), then single dependencies removed, then single instructions
    simplified. Validity (`_valid`) is checked by the caller."""
    links = _token_links(insns)
    out = []
    body = len(insns) - 1                 # FINISH stays
    chunk = max(1, body // 2)
    while True:
        for start in range(0, body, chunk):
            drop = set(range(start, min(start + chunk, body)))
            out.append(_without(insns, drop, links))
            current = list(insns)
            for k in sorted(drop, reverse=True):
                current = _transfer_flags(current, k)
                if current is None:
                    break
            else:
                out.append(current)
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    for i, push_flag, j, pop_flag in links:
        current = list(insns)
        current[i] = dataclasses.replace(current[i], **{push_flag: False})
        current[j] = dataclasses.replace(current[j], **{pop_flag: False})
        out.append(current)
    for i, insn in enumerate(insns[:-1]):
        for smaller in _simplifications(insn):
            out.append(insns[:i] + [smaller] + insns[i + 1:])
    return out


def _size(case: Case) -> tuple[int, int, int]:
    """What shrinking minimizes, in order: instructions, work (micro-ops and entries
    moved), then dependency flags, padding and resets."""
    work = extras = 0
    for insn in case.program.instructions:
        extras += sum(getattr(insn, flag) for flag in DEP_FLAGS)
        if isinstance(insn, (Gemm, Alu)):
            work += insn.uop_count
            extras += int(isinstance(insn, Gemm) and insn.reset)
        elif isinstance(insn, (Load, Store)):
            work += insn.y_size * insn.x_size
            if isinstance(insn, Load):
                extras += insn.y_pad0 + insn.y_pad1 + insn.x_pad0 + insn.x_pad1
    return len(case.program.instructions), work, extras


def shrink(built: harness.Build, case: Case, *, max_rounds: int = 40, max_seconds: float = 300.0,
           batch: int = 200, on_round: Callable[[int, Case], None] | None = None) -> Case:
    """The smallest program found that still fails: greedy, each round runs every valid
    smaller candidate in one simulator process and keeps the smallest that still fails,
    until none does, ``max_rounds`` or ``max_seconds``. A candidate is valid when fsim
    runs it and it has no data race (`find_race`): a racy program may legitimately
    differ between fsim and the RTL, so it would shrink towards a false reproducer."""
    t0 = time.perf_counter()
    data = case.program.constants["data"]
    for round_ in range(max_rounds):
        if time.perf_counter() - t0 > max_seconds:
            break
        candidates = []
        seen = set()
        current = _size(case)
        for insns in _candidates(case.program.instructions):
            key = encode_program(insns, case.config)
            if key in seen:
                continue
            seen.add(key)
            candidate = case_from_instructions(case.config, insns, data, seed=case.seed, stall=case.stall)
            if _size(candidate) >= current or not _valid(candidate):
                continue
            candidates.append(candidate)
            if len(candidates) >= batch:
                break
        if not candidates:
            break
        failing = [r.case for r in run_cases(built, candidates) if r.mismatch]
        if not failing:
            break
        case = min(failing, key=_size)
        if on_round:
            on_round(round_, case)
    return case


def _valid(case: Case) -> bool:
    """fsim runs the case and it has no data race."""
    try:
        trace = fsim_reference(case, _window_bytes([case]), tracing=True).tracer
    except FsimError:
        return False                  # tokens unbalanced, out of bounds, ...
    return find_race(trace, case.program.instructions) is None


# ---------------------------------------------------------------------------- investigating a mismatch

def investigate(built: harness.Build, case: Case, out_dir: Path, *, shrink_it: bool = True,
                on_step: Callable[[str], None] | None = None) -> dict:
    """Locate, shrink and save a failing case under ``out_dir``. Returns a summary with the
    reproducer's paths, the replay command and the localization text."""
    step = on_step or (lambda message: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    original = case
    if shrink_it and case.fault is None:     # shrinking keeps programs fsim runs to DONE
        step(f"shrinking {case.label} ({len(case.program.instructions)} instructions)")
        case = shrink(built, case, on_round=lambda r, c: step(
            f"  round {r + 1}: {len(c.program.instructions)} instructions still fail"))
    step("locating the first divergence")
    text, mismatch = describe_failure(built, case, out_dir / "retire_trace.txt")
    if mismatch is None:
        mismatch = "no mismatch when run alone (it failed after other programs in one simulation)"
        case = original
    program_path = out_dir / "repro.gfp"
    write_bytes_atomic(program_path, case.program.to_bytes())
    write_text_atomic(out_dir / "config.toml", case.config.to_toml())
    waves_suffix = harness.WAVE_FORMATS[built.simulator][0]
    waves = out_dir / f"failing{waves_suffix}"
    try:
        step(f"writing the waveform {waves.name}")
        traced = harness.build(case.config, built.simulator, built.dram_bytes, waves=waves_suffix,
                               variant=built.variant)
        run_cases(traced, [case], waves=waves)
        waves_note = str(waves)
    except (harness.CosimError, RegressError) as exc:
        waves_note = f"none ({exc})"
    replay = " ".join(["gemforge", "regress", "--replay", shlex.quote(str(program_path)), "--device",
                       built.simulator, "--stall", str(case.stall)])
    summary = {
        "case": original.label, "why": mismatch,
        "instructions": {"original": len(original.program.instructions),
                         "reproducer": len(case.program.instructions)},
        "reproducer": str(program_path), "config": str(out_dir / "config.toml"), "waves": waves_note,
        "replay": replay, "divergence": text,
    }
    from gemforge.hw.asm import disassemble
    listing = disassemble(case.program)
    write_text_atomic(out_dir / "README.md", "\n".join([
        f"# Co-simulation mismatch: {original.label} on {built.simulator}", "",
        f"{mismatch}.", "", "## Where", "", text, "",
        f"## Reproducer ({len(case.program.instructions)} of {len(original.program.instructions)} instructions)",
        "", "```", listing.rstrip(), "```", "",
        "## Replay", "", "```", replay, "```", "",
        f"Config: `config.toml`. Waveform: `{Path(waves_note).name if waves_note == str(waves) else waves_note}`. "
        "Retire trace of the RTL (`cycle engine`): `retire_trace.txt`.", ""]))
    write_text_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def describe_failure(built: harness.Build, case: Case, retire_trace: Path,
                     waves: Path | None = None) -> tuple[str, str | None]:
    """Run ``case`` once more with the RTL's retire trace (and ``waves``) on and fsim
    tracing; returns (where it first diverges, the one-sentence mismatch), or
    ("...", None) when it matches."""
    window = _window_bytes([case])
    base, image, insn_addr, count = _image(case, window)
    expected = fsim_reference(case, window, tracing=True) if case.fault is None else None
    got, result = harness.run(built, image, base, insn_addr, count, stall=case.stall, seed=STALL_SEED,
                              watchdog_cycles=100_000, retire_trace=retire_trace, waves=waves)
    mismatch = compare(case, expected, got, result, base)
    if mismatch is None:
        return "The RTL matches fsim.", None
    if case.fault is not None:
        return (f"{mismatch}. fsim stops at the fault before any access past the window; the DRAM "
                "contents of a faulted run are not compared."), mismatch
    insns = case.program.relocated(base)
    retired = retire_cycles(insns, harness.read_retire_trace(retire_trace)) if retire_trace.exists() else None
    if np.array_equal(expected.window, got):
        lines = [mismatch + "."]
        stuck = [i for i, c in enumerate(retired or []) if c is None]
        if stuck:
            lines.append(f"The first instruction the RTL never retired: instruction {stuck[0]} "
                         f"({mnemonic(insns[stuck[0]])}); fsim ran all {count}.")
        return "\n".join(lines), mismatch
    trace = expected.tracer
    divergence: Divergence = locate_divergence(trace, expected.window, got, offset=base)
    buffer = trace.stores[divergence.store].buffer if divergence.store is not None else None
    return divergence.describe(insns, retired, buffer), mismatch


def race_in(case: Case) -> str | None:
    """A sentence naming a data race in the case's program, or None (see `find_race`)."""
    trace = fsim_reference(case, _window_bytes([case]), tracing=True).tracer
    race = find_race(trace, case.program.instructions)
    if race is None:
        return None
    a, b, where = race
    insns = case.program.instructions
    return (f"instructions {a} ({mnemonic(insns[a])}) and {b} ({mnemonic(insns[b])}) touch the same "
            f"{where} entries with no dependency token ordering them")
