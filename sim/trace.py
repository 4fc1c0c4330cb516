"""Instruction-level tracing of the functional simulator, for locating an RTL mismatch.

`Tracer` observes fsim (`Fsim(..., observer=tracer)`, or `traced_fsim`) and records
who wrote what: for every on-chip buffer entry the instruction that last wrote it,
for every DRAM byte the STORE that last wrote it, for each STORE the instructions
whose results it wrote out, and for each instruction the entries it read and
wrote. It knows no instruction kind: fsim reports each access where its semantics
make it.
`find_race` uses the last with the program's dependency tokens: two instructions
of different engines that touch the same entry (one writing) must be ordered by
tokens, or the hardware may run them either way round and legitimately differ
from fsim. `locate_divergence` turns a DRAM difference between
fsim and the RTL into the first STORE (in program order) that wrote a differing
byte and the instructions that produced what it stored; with the RTL's retire
trace (`gemforge.sim.cosim.harness.read_retire_trace`) it adds the cycle each
of them retired in the RTL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemforge.hw.config import BUFFERS, AccelConfig
from gemforge.hw.isa import TOKEN_POPS, TOKEN_PUSHES, Engine, Instruction, engine_of, mnemonic

from .fsim import AccessObserver, Fsim

__all__ = ["Tracer", "traced_fsim", "StoreRecord", "Divergence", "locate_divergence", "retire_cycles", "find_race"]


@dataclass
class StoreRecord:
    """What one STORE wrote: per tile row, the DRAM bytes ``[start, stop)`` and the on-chip
    ``entries`` of ``buffer`` they hold, and per entry the instruction that last wrote it on
    chip (-1: never written, the reset value)."""

    index: int
    buffer: str
    dram_rows: list[tuple[int, int]]
    entries: np.ndarray            # (rows, entries per row)
    entry_writers: np.ndarray      # the same shape


class Tracer(AccessObserver):
    """Records, from fsim's accesses (`AccessObserver`), who wrote what: for every on-chip
    buffer entry and DRAM byte the instruction that last wrote it, for each STORE the entries
    it wrote out, and for each instruction the entries and bytes it read and wrote."""

    def __init__(self, config: AccelConfig, dram_bytes: int) -> None:
        self.writer = {b: np.full(config.depth(b), -1, np.int64) for b in BUFFERS}
        self.dram_writer = np.full(dram_bytes, -1, np.int64)
        self.stores: dict[int, StoreRecord] = {}
        #: Instruction indices in the order fsim executed them.
        self.order: list[int] = []
        #: Per instruction: {(buffer or "dram", "r" or "w"): sorted unique entry/byte indices}.
        self.accesses: dict[int, dict[tuple[str, str], np.ndarray]] = {}
        self._current = -1

    def executing(self, index: int, insn: Instruction) -> None:
        self._current = index
        self.order.append(index)
        self.accesses[index] = {}

    def read(self, where: str, indices: np.ndarray) -> None:
        self._touch(where, "r", indices)

    def wrote(self, where: str, indices: np.ndarray, sources: tuple[str, np.ndarray] | None = None) -> None:
        self._touch(where, "w", indices)
        if where != "dram":
            self.writer[where][indices] = self._current
            return
        if sources is not None:
            buffer, entries = sources
            self.stores[self._current] = StoreRecord(
                self._current, buffer, [(int(row[0]), int(row[-1]) + 1) for row in indices], entries.copy(),
                self.writer[buffer][entries])
        self.dram_writer[indices.reshape(-1)] = self._current

    def _touch(self, where: str, mode: str, indices: np.ndarray) -> None:
        key = (where, mode)
        new = np.unique(np.asarray(indices, np.int64).reshape(-1))
        old = self.accesses[self._current].get(key)
        self.accesses[self._current][key] = new if old is None else np.union1d(old, new)


def traced_fsim(config: AccelConfig, dram: np.ndarray) -> tuple[Fsim, Tracer]:
    """An `Fsim` on ``dram`` with a `Tracer` attached."""
    tracer = Tracer(config, dram.size)
    return Fsim(config, dram, observer=tracer), tracer


@dataclass
class Divergence:
    """Where the RTL's DRAM first departs from fsim's."""

    differing_bytes: int
    first_address: int
    #: The earliest STORE in program order that last wrote a differing byte (None when
    #: every differing byte is one no instruction stores to).
    store: int | None
    store_bytes: int                 # how many of that store's bytes differ
    entries: list[int]               # its differing on-chip entries (buffer indices)
    producers: list[int]             # the instructions that last wrote those entries
    unstored_bytes: int              # differing bytes no STORE wrote (the RTL wrote stray data)

    def describe(self, instructions: list[Instruction], retired: list[int | None] | None = None,
                 buffer: str | None = None) -> str:
        def name(i: int) -> str:
            when = ""
            if retired is not None and i < len(retired):
                when = (f", retired in the RTL at cycle {retired[i]}" if retired[i] is not None
                        else ", never retired in the RTL")
            return f"instruction {i} ({mnemonic(instructions[i])}{when})"

        lines = [f"{self.differing_bytes} DRAM byte(s) differ, the first at {self.first_address:#x}."]
        if self.store is not None:
            lines.append(f"First diverging instruction: {name(self.store)}: {self.store_bytes} of the bytes it "
                         f"stored differ, from {buffer or 'buffer'} entries "
                         f"{_ranges(self.entries)}.")
            if self.producers:
                made = "; ".join(name(i) if i >= 0 else "never written (reset value)" for i in self.producers)
                lines.append(f"Those entries were last written by: {made}.")
        if self.unstored_bytes:
            lines.append(f"{self.unstored_bytes} differing byte(s) lie where no STORE of the program writes: "
                         "the RTL wrote where it should not.")
        return "\n".join(lines)


def _ranges(values: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1..3, 7"``."""
    out, start = [], None
    for k, v in enumerate(values):
        if start is None:
            start = v
        if k + 1 == len(values) or values[k + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}..{v}")
            start = None
    return ", ".join(out)


def locate_divergence(trace: Tracer, expected: np.ndarray, got: np.ndarray, offset: int = 0) -> Divergence:
    """Compare fsim's DRAM (``expected``) with the RTL's (``got``), both starting at byte
    ``offset`` of the traced DRAM, and name the first STORE whose output differs."""
    diff = np.flatnonzero(expected != got)
    if diff.size == 0:
        raise ValueError("the DRAM images are equal; there is no divergence to locate")
    addresses = diff + offset
    writers = trace.dram_writer[addresses]
    stored = writers[writers >= 0]
    unstored = int((writers < 0).sum())
    if stored.size == 0:
        return Divergence(int(diff.size), int(addresses[0]), None, 0, [], [], unstored)
    first = int(stored.min())
    record = trace.stores[first]
    mine = addresses[writers == first]
    row_entries = record.entries.shape[1]
    entries = set()
    for address in mine:
        # Rows may overlap (x_stride < x_size): the last row holding a byte wrote it.
        for row in reversed(range(len(record.dram_rows))):
            start, stop = record.dram_rows[row]
            if start <= address < stop:
                entries.add((row, (int(address) - start) * row_entries // (stop - start)))
                break
    entries = sorted(entries)
    producers = sorted({int(record.entry_writers[e]) for e in entries})
    return Divergence(int(diff.size), int(addresses[0]), first, int(mine.size),
                      sorted({int(record.entries[e]) for e in entries}), producers, unstored)


def retire_cycles(instructions: list[Instruction], trace: list[tuple[int, str]]) -> list[int | None]:
    """Per instruction (program order), the cycle the RTL retired it, from a retire trace:
    each engine retires its own instructions in program order."""
    per_engine: dict[str, list[int]] = {}
    for cycle, engine in trace:
        per_engine.setdefault(engine, []).append(cycle)
    seen: dict[str, int] = {}
    out: list[int | None] = []
    for insn in instructions:
        engine = engine_of(insn).value
        k = seen.get(engine, 0)
        seen[engine] = k + 1
        cycles = per_engine.get(engine, [])
        out.append(cycles[k] if k < len(cycles) else None)
    return out


def find_race(trace: Tracer, instructions: list[Instruction]) -> tuple[int, int, str] | None:
    """Two instructions of different engines that touch the same entry (one of them
    writing) without a chain of dependency tokens ordering them: ``(first, second,
    where)``, or None when the program is race-free.

    Happens-before comes from vector clocks: each engine runs its instructions in
    order, and the k-th pop of a token queue waits for the k-th push to it."""
    engines = list(Engine)
    slot = {e: i for i, e in enumerate(engines)}
    clock = {e: np.zeros(len(engines), np.int64) for e in engines}
    queues: dict[str, list[np.ndarray]] = {}
    popped: dict[str, int] = {}
    stamp: dict[int, np.ndarray] = {}
    # Program order per engine is execution order per engine; visit in fsim's order so
    # every pop finds its push.
    for index in trace.order:
        insn = instructions[index]
        engine = engine_of(insn)
        vc = clock[engine].copy()
        for flag, queue in TOKEN_POPS[engine].items():
            if getattr(insn, flag):
                k = popped.get(queue, 0)
                popped[queue] = k + 1
                vc = np.maximum(vc, queues[queue][k])
        vc[slot[engine]] += 1
        clock[engine] = vc
        stamp[index] = vc
        for flag, queue in TOKEN_PUSHES[engine].items():
            if getattr(insn, flag):
                queues.setdefault(queue, []).append(vc.copy())

    def before(a: int, b: int) -> bool:
        e = slot[engine_of(instructions[a])]
        return stamp[a][e] <= stamp[b][e]

    indices = sorted(trace.accesses)
    for n, a in enumerate(indices):
        for b in indices[n + 1:]:
            if engine_of(instructions[a]) == engine_of(instructions[b]):
                continue
            if before(a, b) or before(b, a):
                continue
            for (where, mode), entries in trace.accesses[a].items():
                for other_mode in ("r", "w"):
                    if mode == "r" and other_mode == "r":
                        continue
                    other = trace.accesses[b].get((where, other_mode))
                    if other is not None and np.intersect1d(entries, other, assume_unique=True).size:
                        return a, b, where
    return None
