"""Random valid programs for RTL-versus-fsim regression.

`random_program(config, rng, base)` builds a program of ``groups`` rounds in
VTA style: the load engine fills input/weight tiles, compute loads micro-ops
(and sometimes accumulators) and runs GEMMs and ALU ops, the store engine
writes results out. Tokens are balanced so the three engines overlap exactly
as a compiler's double-buffered schedule lets them:

* load of round g+1 waits for compute of round g (compute→load token);
* compute of round g waits for load of round g (load→compute) and for store
  of round g−1 (store→compute), so it never overwrites what is being stored;
* store of round g waits for compute of round g (compute→store);
* FINISH waits for the last store.

Everything is random within the ISA's rules and the buffers' bounds: shapes,
strides, paddings, loop factors, micro-ops, ALU ops and operands. Stores write
to a DRAM area no load reads, so the engines never race on DRAM. Tile and loop
sizes shrink to fit any valid config, down to one-entry buffers.

With ``uop_heavy`` every round's compute also reloads random 2-D spans of the
micro-op table (rows of up to the whole table, starting and ending anywhere in a
bus beat, from anywhere in the table's DRAM area), so micro-op DMA groups of
every size and alignment meet the GEMMs that use them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemforge.hw.config import BUFFERS, AccelConfig
from gemforge.hw.isa import (
    Alu, AluOp, Finish, Gemm, Instruction, Load, MemType, Store, Uop, encode_program, encode_uops,
)

__all__ = ["RandomProgram", "random_program", "area_bytes", "data_bytes", "AREAS"]

#: Areas in the data region, in order.
AREAS = ("inp", "wgt", "acc", "uop", "out")


def area_bytes(config: AccelConfig) -> int:
    """Bytes of each DRAM area: room for 128 of the config's largest entries (so a tile's
    rows always fit somewhere in it), in whole 4 KiB pages. Small, because every program
    of a regression moves its data region into and out of the simulator."""
    largest = max(config.entry_bytes(b) for b in BUFFERS)
    return -(-128 * largest // 4096) * 4096


def data_bytes(config: AccelConfig) -> int:
    """Bytes of a random program's data region (its areas, in `AREAS` order)."""
    return len(AREAS) * area_bytes(config)


@dataclass
class RandomProgram:
    """A program laid out at byte ``base``: ``data`` (the areas) then the instruction stream."""

    instructions: list[Instruction]
    data: np.ndarray          # bytes of the data region (`data_bytes`)
    insn_bytes: bytes
    base: int

    @property
    def insn_address(self) -> int:
        return self.base + self.data.size

    def install(self, dram: np.ndarray) -> None:
        dram[self.base:self.base + self.data.size] = self.data
        dram[self.insn_address:self.insn_address + len(self.insn_bytes)] = np.frombuffer(self.insn_bytes, np.uint8)


def random_program(config: AccelConfig, rng: np.random.Generator, base: int, *, groups: int = 3,
                   max_loop: int = 3, max_tile: int = 4, uop_heavy: bool = False) -> RandomProgram:
    """A random valid program whose data region starts at byte ``base`` (aligned to 4096)."""
    assert base % 4096 == 0
    c = config
    area_size = area_bytes(c)
    area = {name: base + i * area_size for i, name in enumerate(AREAS)}
    data = rng.integers(0, 256, len(AREAS) * area_size, dtype=np.uint8)

    # Micro-ops: indices leave room for every loop offset the program can add; loops
    # shrink until that room exists in the smallest buffer.
    smallest = min(c.inp_depth, c.wgt_depth, c.acc_depth)
    while max_loop > 1 and 2 * (max_loop - 1) * max_loop >= smallest:
        max_loop -= 1
    margin = 2 * (max_loop - 1) * max_loop
    n_uops = min(c.uop_depth, area_size // c.uop_entry_bytes, 32)
    uops = [Uop(dst=int(rng.integers(0, c.acc_depth - margin)),
                src=int(rng.integers(0, min(c.inp_depth, c.acc_depth) - margin)),
                wgt=int(rng.integers(0, c.wgt_depth - margin))) for _ in range(n_uops)]
    uop_bytes = np.frombuffer(encode_uops(uops, c), np.uint8)
    off = area["uop"] - base
    data[off:off + uop_bytes.size] = uop_bytes
    data[off + uop_bytes.size:off + area_size] = 0

    def tile(depth: int, padded: bool) -> tuple[int, int, tuple[int, ...]]:
        """(y, x, pads) of a tile whose padded size fits ``depth`` entries."""
        for _ in range(8):
            y, x = int(rng.integers(1, max_tile + 1)), int(rng.integers(1, max_tile + 1))
            pads = tuple(int(p) for p in rng.integers(0, 3, 4)) if padded else (0, 0, 0, 0)
            if (pads[0] + y + pads[1]) * (pads[2] + x + pads[3]) <= depth:
                return y, x, pads
        return 1, 1, (0, 0, 0, 0)

    def dram_rows(buffer: str, area_name: str, y: int, x: int, stride: int) -> int:
        entries = area_size // c.entry_bytes(buffer)
        span = (y - 1) * stride + x
        first = area[area_name] // c.entry_bytes(buffer)
        return first + int(rng.integers(0, entries - span + 1))

    def load(mem: MemType, **deps) -> Load:
        """A LOAD into inp, wgt or acc."""
        buffer = mem.buffer
        depth = c.depth(buffer)
        y, x, pads = tile(depth, padded=True)
        stride = x + int(rng.integers(0, 3))
        rows, pitch = pads[0] + y + pads[1], pads[2] + x + pads[3]
        sram = int(rng.integers(0, depth - rows * pitch + 1))
        dram = dram_rows(buffer, buffer, y, x, stride)
        return Load(mem=mem, sram_base=sram, dram_base=dram, y_size=y, x_size=x, x_stride=stride,
                    y_pad0=pads[0], y_pad1=pads[1], x_pad0=pads[2], x_pad1=pads[3], **deps)

    def loop_fields(prefixes):
        fields = {"iter_out": int(rng.integers(1, max_loop + 1)), "iter_in": int(rng.integers(1, max_loop + 1))}
        for p in prefixes:
            fields[f"{p}_factor_out"] = int(rng.integers(0, max_loop + 1))
            fields[f"{p}_factor_in"] = int(rng.integers(0, max_loop + 1))
        bgn = int(rng.integers(0, n_uops))
        end = int(rng.integers(bgn + 1, min(n_uops, bgn + 6) + 1))
        return {"uop_bgn": bgn, "uop_end": end, **fields}

    def uop_reload() -> Load:
        """A LOAD of random rows of the micro-op area (the table, then zeros) into the table."""
        window = min(area_size // c.uop_entry_bytes, 4 * n_uops + 8)    # DRAM entries to read from
        y = int(rng.integers(1, min(3, n_uops) + 1))
        x = int(rng.integers(1, n_uops // y + 1))
        stride = int(rng.integers(0, min(2 * x + 1, (window - x) // max(1, y - 1)) + 1))
        sram = int(rng.integers(0, n_uops - y * x + 1))
        span = (y - 1) * stride + x
        dram = area["uop"] // c.uop_entry_bytes + int(rng.integers(0, window - span + 1))
        return Load(mem=MemType.UOP, sram_base=sram, dram_base=dram, y_size=y, x_size=x, x_stride=stride)

    def gemm(**deps) -> Gemm:
        return Gemm(reset=bool(rng.random() < 0.15), overwrite=bool(rng.random() < 0.2),
                    **loop_fields(("dst", "src", "wgt")), **deps)

    def alu(**deps) -> Alu:
        op = AluOp(int(rng.integers(0, len(AluOp))))
        imm = None
        if rng.random() < 0.6:
            imm = int(rng.integers(-40, 41)) if op == AluOp.SHR else int(rng.integers(-(1 << 15), 1 << 15))
        return Alu(op=op, imm=imm, **loop_fields(("dst", "src")), **deps)

    def store(**deps) -> Store:
        mem = MemType.ACC if rng.random() < 0.4 else MemType.OUT
        y, x, _ = tile(c.depth(mem.buffer), padded=False)
        stride = x + int(rng.integers(0, 3))
        sram = int(rng.integers(0, c.depth(mem.buffer) - y * x + 1))
        requant = {}
        if mem == MemType.ACC and rng.random() < 0.5:
            # Requantize (acc → out entries): random shift, ReLU and bias (one, or one per row).
            requant = dict(requant=True, shift=int(rng.integers(0, c.acc_width)), relu=bool(rng.random() < 0.5))
            if rng.random() < 0.7:
                per_row = bool(rng.random() < 0.5)
                requant.update(bias=True, bias_per_row=per_row,
                               bias_base=int(rng.integers(0, c.acc_depth - (y if per_row else 1) + 1)))
        written = MemType.OUT.buffer if requant else mem.buffer
        return Store(mem=mem, sram_base=sram, dram_base=dram_rows(written, "out", y, x, stride),
                     y_size=y, x_size=x, x_stride=stride, **deps, **requant)

    insns: list[Instruction] = []
    # The uop loads are placed before the first GEMM of each round; the first round
    # loads the whole table so every range is defined.
    for g in range(groups):
        first, last = g == 0, g == groups - 1
        # ---- load engine
        n_loads = int(rng.integers(1, 4))
        loads = [load(MemType.INP if rng.random() < 0.5 else MemType.WGT) for _ in range(n_loads)]
        loads[0] = _with(loads[0], pop_next=not first)
        loads[-1] = _with(loads[-1], push_next=True)
        insns += loads
        # ---- compute engine
        body: list[Instruction] = []
        if first:
            body.append(Load(mem=MemType.UOP, sram_base=0, dram_base=area["uop"] // c.uop_entry_bytes,
                             y_size=1, x_size=n_uops, x_stride=n_uops))
        if uop_heavy:
            body += [uop_reload() for _ in range(int(rng.integers(1, 4)))]
        if rng.random() < 0.4:
            body.append(load(MemType.ACC))
        for _ in range(int(rng.integers(1, 5))):
            body.append(gemm() if rng.random() < 0.6 else alu())
        body[0] = _with(body[0], pop_prev=True, pop_next=not first)
        body[-1] = _with(body[-1], push_next=True, push_prev=not last)
        insns += body
        # ---- store engine
        stores = [store() for _ in range(int(rng.integers(1, 3)))]
        stores[0] = _with(stores[0], pop_prev=True)
        stores[-1] = _with(stores[-1], push_prev=True)
        insns += stores
    insns.append(Finish(pop_next=True))
    # The rounds' store→compute tokens: round g's store pushes one that round g+1's
    # compute pops; the last one is popped by FINISH.
    return RandomProgram(insns, data, encode_program(insns, c), base)


def _with(insn, **flags):
    import dataclasses
    return dataclasses.replace(insn, **flags)
