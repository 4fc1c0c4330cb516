"""Instruction-level tracing of the functional simulator, for locating an RTL mismatch.

`TracingFsim` runs a program exactly as `Fsim` does and records who wrote what:
for every on-chip buffer entry the instruction that last wrote it, for every
DRAM byte the STORE that last wrote it, and for each STORE the instructions
whose results it wrote out. `locate_divergence` turns a DRAM difference between
fsim and the RTL into the first STORE (in program order) that wrote a differing
byte and the instructions that produced what it stored; with the RTL's retire
trace (`gemforge.sim.cosim.harness.read_retire_trace`) it adds the cycle each
of them retired in the RTL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemforge.hw.isa import Instruction, Load, MemType, Store, engine_of, mnemonic

from .fsim import Fsim

__all__ = ["TracingFsim", "StoreRecord", "Divergence", "locate_divergence", "retire_cycles"]


@dataclass
class StoreRecord:
    """What one STORE wrote: DRAM bytes ``[start, stop)`` per row and, per stored entry,
    the instruction that last wrote it on chip (-1: never written, the reset value)."""

    index: int
    buffer: str
    sram_base: int
    dram_rows: list[tuple[int, int]]
    entry_writers: np.ndarray


class TracingFsim(Fsim):
    """`Fsim` that records, per instruction, the on-chip entries and DRAM bytes it wrote."""

    def __init__(self, config, dram: np.ndarray) -> None:
        super().__init__(config, dram)
        c = config
        self.writer = {b: np.full(c.depth(b), -1, np.int64) for b in ("inp", "wgt", "acc", "out", "uop")}
        self.dram_writer = np.full(dram.size, -1, np.int64)
        self.stores: dict[int, StoreRecord] = {}
        #: Instruction indices in the order fsim executed them.
        self.order: list[int] = []
        self._current = -1

    def execute(self, insn: Instruction, index: int = 0) -> None:
        self._current = index
        self.order.append(index)
        super().execute(insn, index)

    def _write_acc(self, indices, values) -> None:
        super()._write_acc(indices, values)
        self.writer["acc"][indices] = self._current
        self.writer["out"][indices] = self._current

    def _load(self, insn: Load, index: int) -> None:
        super()._load(insn, index)
        if insn.mem != MemType.ACC:            # accumulator loads go through _write_acc
            rows = insn.y_pad0 + insn.y_size + insn.y_pad1
            pitch = insn.x_pad0 + insn.x_size + insn.x_pad1
            self.writer[insn.mem.buffer][insn.sram_base:insn.sram_base + rows * pitch] = index

    def _store(self, insn: Store, index: int) -> None:
        super()._store(insn, index)
        buffer = insn.mem.buffer
        entry = self.config.entry_bytes(buffer)
        count = insn.y_size * insn.x_size
        rows = []
        for y in range(insn.y_size):
            start = (insn.dram_base + y * insn.x_stride) * entry
            rows.append((start, start + insn.x_size * entry))
            self.dram_writer[start:start + insn.x_size * entry] = index
        writers = self.writer[buffer][insn.sram_base:insn.sram_base + count].copy()
        self.stores[index] = StoreRecord(index, buffer, insn.sram_base, rows, writers)


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


def locate_divergence(trace: TracingFsim, expected: np.ndarray, got: np.ndarray, offset: int = 0) -> Divergence:
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
    entry_bytes = trace.config.entry_bytes(record.buffer)
    row_entries = (record.dram_rows[0][1] - record.dram_rows[0][0]) // entry_bytes
    entries = set()
    for address in mine:
        # Rows may overlap (x_stride < x_size): the last row holding a byte wrote it.
        for row in reversed(range(len(record.dram_rows))):
            start, stop = record.dram_rows[row]
            if start <= address < stop:
                entries.add(row * row_entries + (int(address) - start) // entry_bytes)
                break
    entries = sorted(entries)
    producers = sorted({int(record.entry_writers[e]) for e in entries})
    return Divergence(int(diff.size), int(addresses[0]), first, int(mine.size),
                      [record.sram_base + e for e in entries], producers, unstored)


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
