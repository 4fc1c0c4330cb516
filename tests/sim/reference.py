"""An independent, deliberately naive model of the ISA for checking fsim.

It shares no code with fsim: it walks every entry and micro-op with Python
loops and does element arithmetic on Python integers (arbitrary precision,
explicitly wrapped), so a vectorization or int64 trick in fsim cannot hide
behind the same mistake here. Slow on purpose; use it on small programs.
"""

from __future__ import annotations

import numpy as np

from gemforge.hw.isa import Alu, AluOp, Gemm, Load, MemType, Store


#: The first byte past the accelerator's 32-bit address space: a LOAD or STORE that would touch
#: it or anything beyond is refused before it runs (the ISA's DRAM_RANGE fault). Written here,
#: not imported, like every rule of this model.
ADDRESS_TOP = 1 << 32


class AddressSpaceFault(Exception):
    """A LOAD or STORE touches DRAM at or past `ADDRESS_TOP`; nothing of it was done."""


def wrap(value: int, bits: int) -> int:
    half = 1 << (bits - 1)
    return (value + half) % (1 << bits) - half


class ReferenceModel:
    def __init__(self, config, dram: np.ndarray) -> None:
        c = self.config = config
        self.dram = bytearray(dram.tobytes())
        self.shapes = {
            "inp": (c.batch, c.block_in), "wgt": (c.block_out, c.block_in),
            "acc": (c.batch, c.block_out), "out": (c.batch, c.block_out),
        }
        self.widths = {"inp": c.inp_width, "wgt": c.wgt_width, "acc": c.acc_width, "out": c.out_width}
        self.sram = {b: [[[0] * s[1] for _ in range(s[0])] for _ in range(c.depth(b))]
                     for b, s in self.shapes.items()}
        self.uop = [(0, 0, 0)] * c.uop_depth

    # -- element codecs: little-endian two's complement, row-major entries
    def _decode_entry(self, buffer: str, raw: bytes) -> list[list[int]]:
        rows, cols = self.shapes[buffer]
        n = self.widths[buffer] // 8
        values = [int.from_bytes(raw[i * n:(i + 1) * n], "little", signed=True) for i in range(rows * cols)]
        return [values[r * cols:(r + 1) * cols] for r in range(rows)]

    def _encode_entry(self, buffer: str, entry: list[list[int]]) -> bytes:
        n = self.widths[buffer] // 8
        return b"".join(wrap(v, 8 * n).to_bytes(n, "little", signed=True) for row in entry for v in row)

    def write_acc(self, index: int, entry: list[list[int]]) -> None:
        self.sram["acc"][index] = [[wrap(v, self.config.acc_width) for v in row] for row in entry]
        self.sram["out"][index] = [[wrap(v, self.config.out_width) for v in row] for row in entry]

    def load(self, insn: Load) -> None:
        buffer = insn.mem.buffer
        size = self.config.entry_bytes(buffer)
        pitch = insn.x_pad0 + insn.x_size + insn.x_pad1
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        for y in range(rows):
            for x in range(pitch):
                sram_index = insn.sram_base + y * pitch + x
                inside = insn.y_pad0 <= y < insn.y_pad0 + insn.y_size and insn.x_pad0 <= x < insn.x_pad0 + insn.x_size
                if inside:
                    entry = insn.dram_base + (y - insn.y_pad0) * insn.x_stride + (x - insn.x_pad0)
                    raw = bytes(self.dram[entry * size:(entry + 1) * size])
                if insn.mem == MemType.UOP:
                    word = int.from_bytes(raw, "little")
                    c = self.config
                    dst = word & ((1 << c.uop_dst_bits) - 1)
                    src = (word >> c.uop_dst_bits) & ((1 << c.uop_src_bits) - 1)
                    wgt = (word >> (c.uop_dst_bits + c.uop_src_bits)) & ((1 << c.uop_wgt_bits) - 1)
                    self.uop[sram_index] = (dst, src, wgt)
                    continue
                rows_, cols_ = self.shapes[buffer]
                entry_value = self._decode_entry(buffer, raw) if inside else [[0] * cols_ for _ in range(rows_)]
                if buffer == "acc":
                    self.write_acc(sram_index, entry_value)
                else:
                    self.sram[buffer][sram_index] = entry_value

    def store(self, insn: Store) -> None:
        buffer = insn.mem.buffer
        written = "out" if insn.requant else buffer   # the DRAM side's entries
        size = self.config.entry_bytes(written)
        for y in range(insn.y_size):
            for x in range(insn.x_size):
                entry = insn.dram_base + y * insn.x_stride + x
                value = self.sram[buffer][insn.sram_base + y * insn.x_size + x]
                if insn.requant:
                    value = self._requantize(insn, y, value)
                data = self._encode_entry(written, value)
                self.dram[entry * size:(entry + 1) * size] = data

    def _requantize(self, insn: Store, y: int, entry: list[list[int]]) -> list[list[int]]:
        """The ISA's requantization of one accumulator entry of row ``y`` (`isa.Store`)."""
        c = self.config
        if insn.bias:
            bias = self.sram["acc"][insn.bias_base + (y if insn.bias_per_row else 0)]
            entry = [[wrap(v + b, c.acc_width) for v, b in zip(row, brow)] for row, brow in zip(entry, bias)]
        low, high = (0 if insn.relu else -(1 << (c.out_width - 1))), (1 << (c.out_width - 1)) - 1
        return [[min(max(v >> insn.shift, low), high) for v in row] for row in entry]

    def _loop(self, insn):
        for i in range(insn.iter_out):
            for j in range(insn.iter_in):
                for u in range(insn.uop_bgn, insn.uop_end):
                    dst, src, wgt = self.uop[u]
                    yield (dst + i * insn.dst_factor_out + j * insn.dst_factor_in,
                           src + i * insn.src_factor_out + j * insn.src_factor_in,
                           wgt + i * getattr(insn, "wgt_factor_out", 0) + j * getattr(insn, "wgt_factor_in", 0))

    def gemm(self, insn: Gemm) -> None:
        c = self.config
        for d, s, w in self._loop(insn):
            if insn.reset:
                self.write_acc(d, [[0] * c.block_out for _ in range(c.batch)])
                continue
            acc = self.sram["acc"][d] if not insn.overwrite else [[0] * c.block_out for _ in range(c.batch)]
            x, wt = self.sram["inp"][s], self.sram["wgt"][w]
            new = [[acc[b][o] + sum(x[b][k] * wt[o][k] for k in range(c.block_in))
                    for o in range(c.block_out)] for b in range(c.batch)]
            self.write_acc(d, new)

    def alu_scalar(self, op: AluOp, a: int, b: int) -> int:
        width = self.config.acc_width
        if op == AluOp.MIN:
            return min(a, b)
        if op == AluOp.MAX:
            return max(a, b)
        if op == AluOp.ADD:
            return wrap(a + b, width)
        if op == AluOp.MUL:
            return wrap(a * b, width)
        if op == AluOp.SHR:
            if b >= 0:
                return a >> min(b, width)  # Python's >> is arithmetic
            return wrap(a << min(-b, width), width)
        raise AssertionError(op)

    def alu(self, insn: Alu) -> None:
        for d, s, _ in self._loop(insn):
            a = self.sram["acc"][d]
            operand = self.sram["acc"][s]
            new = [[self.alu_scalar(insn.op, a[r][k], insn.imm if insn.imm is not None else operand[r][k])
                    for k in range(len(a[r]))] for r in range(len(a))]
            self.write_acc(d, new)

    def dram_bytes(self, insn: Load | Store):
        """Every DRAM byte address a LOAD or STORE touches, entry by entry."""
        written = "out" if isinstance(insn, Store) and insn.requant else insn.mem.buffer
        size = self.config.entry_bytes(written)
        for y in range(insn.y_size):
            for x in range(insn.x_size):
                entry = insn.dram_base + y * insn.x_stride + x
                yield from range(entry * size, (entry + 1) * size)

    def execute(self, insn) -> None:
        if isinstance(insn, (Load, Store)) and any(b >= ADDRESS_TOP for b in self.dram_bytes(insn)):
            raise AddressSpaceFault(f"{insn} touches DRAM past byte {ADDRESS_TOP:#x}")
        if isinstance(insn, Load):
            self.load(insn)
        elif isinstance(insn, Store):
            self.store(insn)
        elif isinstance(insn, Gemm):
            self.gemm(insn)
        elif isinstance(insn, Alu):
            self.alu(insn)

    def buffer(self, name: str) -> np.ndarray:
        if name == "uop":
            return np.array(self.uop, dtype=np.int64)
        return np.array(self.sram[name], dtype=np.int64)
