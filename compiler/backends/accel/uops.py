"""Micro-op de-duplication: identical micro-op kernels are stored once.

If every distinct kernel fits the micro-op buffer they are loaded by one
LOAD at the start; otherwise a small cache reloads kernels on demand. The
micro-op table lives in the arena after the tensors.
"""

from __future__ import annotations

import dataclasses

from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import Load, MemType, Uop

from .emission import AccelBuild, AccelCompileError, Emitted

__all__ = ["deduplicate_uops", "place_uops"]


def place_uops(build: AccelBuild) -> AccelBuild:
    """The `deduplicate_uops` stage: de-duplicate, then place the table after the arena's tensors."""
    config = build.config
    build.emitted, build.uop_table, _ = deduplicate_uops(config, build.emitted)
    build.uop_offset = build.arena_end
    for rec in build.emitted:
        if isinstance(rec.insn, Load) and rec.insn.mem == MemType.UOP:
            rec.insn = dataclasses.replace(rec.insn, dram_base=rec.insn.dram_base
                                           + build.uop_offset // config.uop_entry_bytes)
    build.arena_end = build.uop_offset + len(build.uop_table) * config.uop_entry_bytes
    return build


def deduplicate_uops(config: AccelConfig, emitted: list[Emitted]) -> tuple[list[Emitted], list[Uop], list[int]]:
    """Store each distinct kernel once and give every GEMM/ALU its micro-op range.

    Returns the instruction stream (with micro-op LOADs inserted), the micro-op
    table for DRAM and, per kernel, its offset in that table."""
    kernels: dict[tuple[Uop, ...], int] = {}
    table: list[Uop] = []
    offsets: list[int] = []
    for rec in emitted:
        if rec.kernel is not None and rec.kernel not in kernels:
            if len(rec.kernel) > config.uop_depth:
                raise AccelCompileError(f"a kernel of {len(rec.kernel)} micro-ops exceeds the "
                                        f"{config.uop_depth}-entry micro-op buffer")
            kernels[rec.kernel] = len(offsets)
            offsets.append(len(table))
            table.extend(rec.kernel)
    out: list[Emitted] = []
    max_x = config.max_dma_size

    def uop_load(sram: int, dram: int, count: int) -> list[Emitted]:
        loads = []
        for start in range(0, count, max_x):
            n = min(max_x, count - start)
            loads.append(Emitted(Load(mem=MemType.UOP, sram_base=sram + start, dram_base=dram + start,
                                      y_size=1, x_size=n, x_stride=n),
                                 writes=[("uop", sram + start, sram + start + n - 1)]))
        return loads

    if len(table) <= config.uop_depth:
        # Everything resident: one load up front, kernels at their table offsets.
        if table:
            out.extend(uop_load(0, 0, len(table)))
        for rec in emitted:
            if rec.kernel is not None:
                base = offsets[kernels[rec.kernel]]
                rec.insn = dataclasses.replace(rec.insn, uop_bgn=base, uop_end=base + len(rec.kernel))
            out.append(rec)
        return out, table, offsets
    # Too many kernels for the buffer: a cache filled in order and flushed when full.
    resident: dict[int, int] = {}
    top = 0
    for rec in emitted:
        if rec.kernel is not None:
            k = kernels[rec.kernel]
            if k not in resident:
                n = len(rec.kernel)
                if top + n > config.uop_depth:
                    resident.clear()
                    top = 0
                out.extend(uop_load(top, offsets[k], n))
                resident[k] = top
                top += n
            base = resident[k]
            rec.insn = dataclasses.replace(rec.insn, uop_bgn=base, uop_end=base + len(rec.kernel))
        out.append(rec)
    return out, table, offsets


