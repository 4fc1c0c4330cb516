"""The dispatch-time instruction check: the hardware's half of `gemforge.hw.isa.decode`.

Fetch runs every instruction through `InsnChecker` (two pipeline stages) before
dispatching it, so a
program the functional simulator refuses ends with the same `Fault` code on the
hardware instead of running garbage or hanging. Everything the check needs is
in the instruction word (and whether it is the program's last), so it is
derived from the ISA's tables: the field layouts (`insn_layout`), the buffers
each kind may name, which engine runs it and so which dependency flags it may
carry. Micro-op indices depend on the micro-op buffer's contents and are checked
by the compute engine as they run.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..isa import (DEP_FLAGS, LOAD_ENGINE, PIPELINE, STORE_MEMS, TOKEN_POPS, TOKEN_PUSHES, AluOp, Engine,
                   MemType, Opcode, insn_bits)
from ..regmap import ADDRESS_TOP, Fault
from .engine import insn_layout

__all__ = ["InsnChecker", "FAULT_BITS", "dram_entry_limit", "LOAD_ENGINE_MEMS", "STORE_MEMS", "one_of"]

#: Width of a fault code.
FAULT_BITS = 8
#: The buffers a LOAD may fill, and those it fills through the load engine (the rest go
#: to the compute engine); the buffers a STORE may read (`gemforge.hw.isa`).
LOAD_MEMS = tuple(LOAD_ENGINE)
LOAD_ENGINE_MEMS = tuple(m for m, engine in LOAD_ENGINE.items() if engine is Engine.LOAD)
#: Dependency flags an engine has no token queue for: the load engine has no previous
#: stage, the store engine no next one (`gemforge.hw.isa.validate`).
_MISSING_FLAGS = {e: tuple(f for f in DEP_FLAGS if f not in TOKEN_POPS[e] and f not in TOKEN_PUSHES[e])
                  for e in PIPELINE}


def one_of(value, choices):
    """``value`` equals one of ``choices``."""
    result = Const(0)
    for choice in choices:
        result = result | (value == choice)
    return result


def dram_entry_limit(config, buffer):
    """Entries of ``buffer`` below the top of the address space: a LOAD or STORE tile whose
    DRAM side moves these entries must end at or below this entry (`Fault.DRAM_RANGE`)."""
    return ADDRESS_TOP // config.entry_bytes(buffer)


class InsnChecker(wiring.Component):
    """Check of one instruction word, in three stages: the decode checks and the operands of
    the tile-size products in the cycle ``en`` is high, the products in the next, the tile's
    ends and the fault in the one after.

    Attributes
    ----------
    word : In(insn_bits)
    last : In(1)
        The word is the program's last instruction.
    en : In(1)
        Take ``word`` and ``last`` this cycle; ``fault`` gives their result `LATENCY` cycles
        later, and holds it until `LATENCY` cycles after the next ``en``.
    fault : Out(FAULT_BITS)
        `Fault.NONE`, or the fault the instruction raises: `INVALID_INSTRUCTION`,
        `BUFFER_RANGE` (a LOAD/STORE tile or a micro-op range outside its buffer),
        `DRAM_RANGE` (a LOAD/STORE tile whose DRAM side runs past the 32-bit address space)
        or `FINISH_NOT_LAST`, checked in that order as `gemforge.sim.fsim` does.
    """

    #: Cycles from ``en`` to ``fault``.
    LATENCY = 2

    def __init__(self, config):
        self._config = config
        super().__init__({"word": In(insn_bits(config)), "last": In(1), "en": In(1), "fault": Out(FAULT_BITS)})

    def elaborate(self, platform):
        m = Module()
        c = self._config
        word = self.word
        views = {op: data.View(insn_layout(c, op), word[:insn_layout(c, op).size]) for op in Opcode}
        opcode = views[Opcode.FINISH].opcode
        ld, st, gm, al = views[Opcode.LOAD], views[Opcode.STORE], views[Opcode.GEMM], views[Opcode.ALU]

        # Stage 1: everything but the tile's size, whose product is left to stage 2 (the
        # multiplier would otherwise follow the fetch reader's output in one cycle).
        invalid = Signal()
        index_range_bad = Signal()                   # a micro-op range outside its buffer
        # A STORE's bias entries, bias_base + count, against the accumulator's depth: the add and
        # the compare after it are left to stage 2 (two carry chains in series behind the
        # opcode's decode ran from the fetched word into this stage's register, 11.7 ns on the ECP5).
        bias_check = Signal()
        bias_base, bias_count = Signal.like(st.bias_base), Signal.like(st.y_size)
        tile = Signal()                              # a LOAD/STORE: check base + rows · cols
        rows, cols = Signal(len(ld.y_size) + 2), Signal(len(ld.x_size) + 2)   # size plus two pads
        base = Signal.like(ld.sram_base)
        mem = Signal.like(ld.mem)
        # The DRAM side: the tile's last row starts (y_size - 1) · x_stride entries after its
        # first, and the tile ends x_size entries after that; it must end at or below the
        # entry limit of the buffer its DRAM side moves. Here the room from dram_base to the
        # limit (one subtract after the decode, as `rows` has its adds); the product and the
        # row's length follow in stage 2, the compare in stage 3.
        dram_rows = Signal.like(ld.y_size)           # y_size - 1
        dram_stride = Signal.like(ld.x_stride)
        dram_cols = Signal.like(ld.x_size)
        dram_room = Signal(signed(len(ld.dram_base) + 2))
        with m.Switch(opcode):
            for op in Opcode:
                with m.Case(op):
                    size = insn_layout(c, op).size
                    bad = Const(0)
                    if size < insn_bits(c):
                        bad = bad | (word[size:] != 0)       # non-canonical: bits above the fields
                    if op == Opcode.LOAD:
                        bad = bad | ~one_of(ld.mem, LOAD_MEMS)
                        bad = bad | ((ld.mem == MemType.UOP) &
                                     ((ld.y_pad0 | ld.y_pad1 | ld.x_pad0 | ld.x_pad1) != 0))
                        bad = bad | (ld.y_size == 0) | (ld.x_size == 0)
                        for flag in _MISSING_FLAGS[Engine.LOAD]:
                            bad = bad | (one_of(ld.mem, LOAD_ENGINE_MEMS) & getattr(ld, flag))
                        m.d.comb += [tile.eq(1), rows.eq(ld.y_pad0 + ld.y_size + ld.y_pad1),
                                     cols.eq(ld.x_pad0 + ld.x_size + ld.x_pad1), base.eq(ld.sram_base),
                                     mem.eq(ld.mem)]
                        m.d.comb += self._dram_tile(ld, self._dram_limit(ld.mem), dram_rows, dram_stride,
                                                    dram_cols, dram_room)
                    elif op == Opcode.STORE:
                        bad = bad | ~one_of(st.mem, STORE_MEMS) | (st.y_size == 0) | (st.x_size == 0)
                        # requant reads acc; without it (or without bias) its fields are zero
                        # (`isa.validate`); the bias entries lie in the accumulator.
                        bad = bad | (st.requant & (st.mem != MemType.ACC)) | \
                            (~st.requant & ((st.shift != 0) | st.relu | st.bias)) | \
                            (~st.bias & (st.bias_per_row | (st.bias_base != 0)))
                        m.d.comb += [bias_check.eq(st.bias), bias_base.eq(st.bias_base),
                                     bias_count.eq(Mux(st.bias_per_row, st.y_size, 1))]
                        for flag in _MISSING_FLAGS[Engine.STORE]:
                            bad = bad | getattr(st, flag)
                        m.d.comb += [tile.eq(1), rows.eq(st.y_size), cols.eq(st.x_size), base.eq(st.sram_base),
                                     mem.eq(st.mem)]
                        # A requantizing STORE writes output-buffer entries (`Store.dram_buffer`).
                        limit = Mux(st.requant, dram_entry_limit(c, MemType.OUT.buffer), self._dram_limit(st.mem))
                        m.d.comb += self._dram_tile(st, limit, dram_rows, dram_stride, dram_cols, dram_room)
                    elif op in (Opcode.GEMM, Opcode.ALU):
                        loop = gm if op == Opcode.GEMM else al
                        bad = bad | (loop.iter_out == 0) | (loop.iter_in == 0)
                        if op == Opcode.ALU:
                            bad = bad | ~one_of(al.op, list(AluOp)) | (~al.use_imm & (al.imm != 0))
                        m.d.comb += index_range_bad.eq((loop.uop_bgn >= loop.uop_end) | (loop.uop_end > c.uop_depth))
                    m.d.comb += invalid.eq(bad)
            with m.Default():
                m.d.comb += invalid.eq(1)                    # unknown opcode

        stage1 = (("invalid", invalid), ("index_range_bad", index_range_bad), ("tile", tile), ("rows", rows),
                  ("cols", cols), ("base", base), ("mem", mem), ("bias_check", bias_check),
                  ("bias_base", bias_base), ("bias_count", bias_count), ("dram_rows", dram_rows),
                  ("dram_stride", dram_stride), ("dram_cols", dram_cols), ("dram_room", dram_room))
        q = {name: Signal.like(sig, name=f"q_{name}") for name, sig in stage1}
        finish_bad = Signal(name="q_finish_bad")
        with m.If(self.en):
            m.d.sync += [q[name].eq(sig) for name, sig in stage1]
            m.d.sync += finish_bad.eq((opcode == Opcode.FINISH) & ~self.last)

        # Stage 2: the tile's size (a multiplier: registered, so the compare after it gets a
        # cycle of its own), and beside it the room the buffer has from the tile's base and a
        # STORE's bias range.
        q2 = {name: Signal.like(sig, name=f"q2_{name}")
              for name, sig in q.items() if name in ("invalid", "index_range_bad", "tile")}
        q2_finish_bad = Signal(name="q2_finish_bad")
        area = Signal(len(rows) + len(cols), name="q2_area")
        room = Signal(signed(max(len(base), max(c.depth(kind.buffer) for kind in MemType).bit_length()) + 1),
                      name="q2_room")
        m.d.sync += [q2[name].eq(q[name]) for name in q2 if name != "index_range_bad"]
        bias_end = q["bias_base"] + q["bias_count"]
        m.d.sync += q2["index_range_bad"].eq(q["index_range_bad"] | (q["bias_check"] & (bias_end > c.acc_depth)))
        m.d.sync += [q2_finish_bad.eq(finish_bad), area.eq(q["rows"] * q["cols"]),
                     room.eq(self._depth(q["mem"]) - q["base"])]
        # The DRAM side likewise: the last row's offset, and the room left for it once the
        # row's length is taken from the room above dram_base.
        dram_span = Signal(len(q["dram_rows"]) + len(q["dram_stride"]), name="q2_dram_span")
        dram_last_room = Signal(signed(len(dram_room) + 1), name="q2_dram_last_room")
        m.d.sync += [dram_span.eq(q["dram_rows"] * q["dram_stride"]),
                     dram_last_room.eq(q["dram_room"] - q["dram_cols"])]

        # Stage 3: the tile's end (base + area) against its buffer's depth, as area against the
        # room: one compare, where an add and then a compare ran into fetch's queue (on the
        # ECP5, next after the compute pipeline's paths). Then the fault in fsim's order.
        out_of_range = q2["index_range_bad"] | (q2["tile"] & (area > room))
        past_top = q2["tile"] & (dram_span > dram_last_room)
        with m.If(q2["invalid"]):
            m.d.comb += self.fault.eq(Fault.INVALID_INSTRUCTION)
        with m.Elif(out_of_range):
            m.d.comb += self.fault.eq(Fault.BUFFER_RANGE)
        with m.Elif(past_top):
            m.d.comb += self.fault.eq(Fault.DRAM_RANGE)
        with m.Elif(q2_finish_bad):
            m.d.comb += self.fault.eq(Fault.FINISH_NOT_LAST)
        with m.Else():
            m.d.comb += self.fault.eq(Fault.NONE)
        return m

    @staticmethod
    def _dram_tile(insn, limit, rows, stride, cols, room):
        """Stage 1 of the DRAM-side check of a LOAD or STORE view ``insn`` (`dram_entry_limit`).
        The room is signed: dram_base may lie past the limit already. A zero y_size (an
        invalid instruction, whose fault comes first) wraps harmlessly."""
        def signed_value(value):       # zero-extended by a bit, then read as signed
            return Cat(value, Const(0, 1)).as_signed()
        return [rows.eq(insn.y_size - 1), stride.eq(insn.x_stride), cols.eq(insn.x_size),
                room.eq(signed_value(limit) - signed_value(insn.dram_base))]

    @staticmethod
    def _per_buffer(mem, value_of):
        """``value_of(buffer)`` of the buffer ``mem`` names (0 for a value that names none: such an
        instruction is invalid, and that fault comes first)."""
        result = Const(0)
        for kind in MemType:
            result = Mux(mem == kind, value_of(kind.buffer), result)
        return result

    def _dram_limit(self, mem):
        """`dram_entry_limit` of the buffer ``mem`` names."""
        return self._per_buffer(mem, lambda buffer: dram_entry_limit(self._config, buffer))

    def _depth(self, mem):
        """The depth of the buffer ``mem`` names."""
        return self._per_buffer(mem, self._config.depth)
