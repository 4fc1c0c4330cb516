"""The GEMM/ALU pipeline: one micro-op per cycle, from the micro-op loop to the write-back.

GEMM and ALU share seven stages:

====  ==============================================================
S0    the micro-op loop (`uop_loop.UopLoop`: i, j, u, offsets); micro-op ``u`` arrives
      (read the cycle before, at the loop's next index) and is registered
S1    indices = micro-op fields + loop offsets; read inp, wgt
S2    inp, wgt registered (GEMM, in `GemmCore`); indices checked against the depths;
      read acc[dst], acc[src]
S3    products (GEMM, registered in `GemmCore`); the accumulator's data registered, forward
      from the write-back
S4    adder tree (GEMM) or operand select (ALU); forward from the write-back; MIN/MAX's
      compare and SHR's amount decoded for S5
S5    op(acc, operand), a GEMM's accumulate being the ALU's ADD (acc + dot, or 0 + dot
      when overwriting); the result goes round to S5's registers for the micro-op behind
S6    the result, registered (R6), is written back; an ALU MUL's product has its final add here
====  ==============================================================

The block-RAM reads, the multipliers and the adder tree each have a cycle of
their own (`GemmCore`), and so does the accumulator's read: its data is
registered in S3 and meets the dot products in S4.

Read-after-write: the accumulator read ports are transparent to the write
port, so a micro-op sees every write made up to the cycle it reads (S2). The
writes it can miss are those of the three micro-ops ahead of it:

- the one three ahead writes back while this one is in S3, and the one two
  ahead while it is in S4: each stage takes the written value instead of the
  memory's when the indices match;
- the one directly ahead is in S5: its result, as it leaves the ALU, goes into
  S5's operand registers instead of this one's S4 value when the indices match.

Every such select is a flip-flop, its indices compared the cycle before (the
stages advance together, so the pair of micro-ops is then one stage further
back), and so are the instruction's decoded fields the stages select on.

The pipeline's one-cycle loop is then S5's registers → the op → a 2:1
multiplexer → S5's registers. The op holds no compare and no decode of its
operand: MIN and MAX select by ``a < b`` computed a cycle ahead, into a
register of its own, from S4's values and S5's operands (the result a forward
brings is one of the latter), and SHR shifts by an amount decoded a cycle ahead
from S4's operand. That operand is the immediate or, for an SHR by a register
operand, never the result of the micro-op ahead: that SHR issues at half rate,
like MUL (below). (Its decode in the loop, a 27-bit OR and a select before the
barrel shifter, was the loop's longest path: with tiny's pipeline placed alone
on the ECP5-85F, 10.8 ns, where without SHR the loop took 7.9.)
The write-back comes from R6, a register of the
result, so the write port, the block RAMs' outputs and their transparency logic
are outside the loop (a write-back from S5's unregistered result, forwarded
through S4's selects, was tiny's critical path on the ECP5). An ALU MUL registers
half-width products in S5 and adds them in S6 (`TensorAlu`), too late for that
forward, so its instruction issues a micro-op every second cycle, as does an SHR
by a register operand: the micro-op behind it is two stages back and takes the
product (or result) from the write-back in S4 (the one ahead of that, in S2's
read). Hence micro-ops behave exactly sequentially, as the ISA says, at one
micro-op per cycle (a half-rate instruction's every second cycle). The compute
engine drains the pipeline (``busy``) before an instruction completes, so
nothing crosses an instruction boundary.

A micro-op whose index plus loop offset lies beyond its buffer would wrap in
the address bits; it raises ``index_fault`` (`Fault.BUFFER_RANGE`, as fsim does)
and writes (and forwards) nothing.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..isa import AluOp, Opcode, insn_bits, uop_fields
from .alu import TensorAlu, shr_decode, shr_decode_bits
from .banked import GroupReadSignature, GroupWriteSignature
from .engine import insn_layout
from .gemm import GemmCore, lanes
from .uop_loop import OFFSET_BITS, UopLoop

__all__ = ["ComputePipeline", "uop_layout"]


def uop_layout(config):
    """`data.StructLayout` of a packed micro-op (dst | src | wgt from bit 0)."""
    return data.StructLayout({f.name: f.width for f in uop_fields(config)})


class ComputePipeline(wiring.Component):
    """Runs the micro-ops of one GEMM or ALU instruction.

    Attributes
    ----------
    insn : In(insn_bits)
        The instruction, held from the cycle before ``start`` until ``busy`` falls (the
        loop's bounds are decoded from it a cycle ahead).
    start : In(1)
        Begin the instruction's micro-op loop (fetch dispatches no empty loop: `InsnChecker`).
    issuing : Out(1)
        S0 issues a micro-op this cycle (the loop is running).
    busy : Out(1)
        A micro-op is in S0–S6.
    uop_rd, inp_rd, wgt_rd, acc_rda, acc_rdb : Out(GroupReadSignature) of one lane
        Synchronous read ports (data one cycle after the address); the accumulator ports
        must be transparent to the buffer's write port (see the module docstring).
    wb : Out(GroupWriteSignature) of one lane
        S6's write-back into the accumulator (``en`` only for a micro-op within range).
    index_fault : Out(1)
        A micro-op's index plus its loop offsets lies beyond its buffer; raised the cycle
        after the micro-op's S2 (where the index sums are compared).
    gemm_active, gemm_reset, alu_active : Out(1)
        A GEMM micro-op (a resetting one) / an ALU micro-op enters the pipeline this cycle.
    """

    def __init__(self, config):
        self._config = config
        c = config
        acc_w = c.acc_entry_bytes * 8
        super().__init__({
            "insn": In(insn_bits(c)), "start": In(1), "issuing": Out(1), "busy": Out(1),
            "uop_rd": Out(GroupReadSignature(c.uop_bits, 1, c.uop_index_bits)),
            "inp_rd": Out(GroupReadSignature(c.inp_entry_bytes * 8, 1, c.inp_index_bits)),
            "wgt_rd": Out(GroupReadSignature(c.wgt_entry_bytes * 8, 1, c.wgt_index_bits)),
            "acc_rda": Out(GroupReadSignature(acc_w, 1, c.acc_index_bits)),
            "acc_rdb": Out(GroupReadSignature(acc_w, 1, c.acc_index_bits)),
            "wb": Out(GroupWriteSignature(acc_w, 1, c.acc_index_bits)),
            "index_fault": Out(1),
            "gemm_active": Out(1), "gemm_reset": Out(1), "alu_active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        acc_bits = c.acc_index_bits

        # The GEMM and ALU layouts share their loop fields' names; pick by opcode.
        header_l, gm_l, al_l = (insn_layout(c, op) for op in (Opcode.FINISH, Opcode.GEMM, Opcode.ALU))
        header = data.View(header_l, self.insn[:header_l.size])
        gm = data.View(gm_l, self.insn[:gm_l.size])
        al = data.View(al_l, self.insn[:al_l.size])
        is_alu = header.opcode == Opcode.ALU
        is_mul = Signal()       # the instruction is an ALU MUL: half rate, its product added in S6
        half_rate = Signal()    # a MUL, or an SHR by a register operand (its amount decoded ahead)
        m.d.comb += [is_mul.eq(is_alu & (al.op == AluOp.MUL)),
                     half_rate.eq(is_mul | (is_alu & (al.op == AluOp.SHR) & ~al.use_imm))]
        # What S4–S6 select on, decoded once and registered: the instruction is held from
        # ``start`` and its first micro-op reaches S1 the cycle after, so the registers are
        # valid for every micro-op. S4's operand selects then start from flip-flops, not from
        # the instruction word's decode (which fanned out to every operand bit: on the ECP5
        # the instruction → S5 path was next after the loop). S0 decodes from the word itself,
        # since the loop takes its bounds in the start cycle.
        r_is_alu, r_is_mul, r_use_imm, zero_acc, zero_b = (
            Signal(name=name) for name in ("r_is_alu", "r_is_mul", "r_use_imm", "zero_acc", "zero_b"))
        r_alu_op = Signal.like(al.op)
        # A GEMM that overwrites adds its dot product to zero; one that resets adds zero to zero.
        # Both are decided in S4, so S5's loop carries no such select.
        m.d.sync += [r_is_alu.eq(is_alu), r_is_mul.eq(is_mul), r_use_imm.eq(al.use_imm),
                     zero_acc.eq(~is_alu & (gm.overwrite | gm.reset)), zero_b.eq(~is_alu & gm.reset),
                     r_alu_op.eq(Mux(is_alu, al.op, AluOp.ADD))]

        def loop_field(name):
            return Mux(is_alu, getattr(al, name), getattr(gm, name))

        factors = {
            "dst": (loop_field("dst_factor_out"), loop_field("dst_factor_in")),
            "src": (loop_field("src_factor_out"), loop_field("src_factor_in")),
            "wgt": (gm.wgt_factor_out, gm.wgt_factor_in),
        }

        # ---------------------------------------------------------------- S0: the micro-op loop
        m.submodules.uop_loop = loop = UopLoop(c.uop_index_bits, kinds=tuple(factors))
        # The bounds the loop takes in the start cycle are decoded from the word a cycle ahead and
        # registered, so its counters and flags load from flip-flops: the opcode decode, the
        # GEMM/ALU select and the compare of ``uop_bgn + 1`` with ``uop_end`` behind it were one
        # of tiny's slowest paths on the ECP5 (12.1 ns). The compute engine holds the word from
        # its POP state on, a cycle at least before ``start``.
        bounds = {name: Signal.like(loop_field(name), name=f"loop_{name}")
                  for name in ("uop_bgn", "uop_end", "iter_out", "iter_in")}
        r_half_rate = Signal()
        m.d.sync += [*(bounds[name].eq(loop_field(name)) for name in bounds), r_half_rate.eq(half_rate)]
        m.d.comb += [loop.start.eq(self.start), loop.half_rate.eq(r_half_rate),
                     *(getattr(loop, name).eq(value) for name, value in bounds.items())]
        # So are the factors, which the loop adds from the cycle after ``start`` on: their
        # GEMM/ALU select in front of the offsets' adders was the next of tiny's slow paths
        # (`pipeline.insn → uop_loop.dst_offset`, 10.4 ns).
        for k, (fo, fi) in factors.items():
            r_fo = Signal.like(fo, name=f"loop_{k}_factor_out")
            r_fi = Signal.like(fi, name=f"loop_{k}_factor_in")
            m.d.sync += [r_fo.eq(fo), r_fi.eq(fi)]
            m.d.comb += [getattr(loop, f"{k}_factor_out").eq(r_fo), getattr(loop, f"{k}_factor_in").eq(r_fi)]
        issue = loop.running
        off = {k: getattr(loop, f"{k}_offset") for k in factors}
        # The micro-op buffer is read a cycle ahead (at the loop's next index), so the micro-op
        # arrives in its issue cycle and S1 starts from a register, not from a block RAM's
        # unregistered output (on the ECP5 that read alone is 5.6 ns of S1's adder path).
        s1_uop_bits = Signal(uop_layout(c).size)
        m.d.comb += self.uop_rd.addr.eq(loop.uop_next)
        m.d.sync += s1_uop_bits.eq(self.uop_rd.data[0][:uop_layout(c).size])

        # ---------------------------------------------------------------- S1: indices, operand reads
        s1_valid = Signal()
        s1_off = {k: Signal(OFFSET_BITS, name=f"s1_{k}_off") for k in factors}
        m.d.sync += s1_valid.eq(issue)
        for k in factors:
            m.d.sync += s1_off[k].eq(off[k])
        uop = data.View(uop_layout(c), s1_uop_bits)
        # Each index = micro-op field + loop offset, whole (32-bit offsets): its low bits address
        # inp and wgt now and the accumulator in S3; the whole sum is registered and compared
        # against the depths in S2 (not the wrapped address bits), off the carry chains of S1.
        index = {k: Signal(OFFSET_BITS + 1, name=f"s1_{k}_index") for k in factors}
        full = {k: Signal(OFFSET_BITS + 1, name=f"s2_{k}_full") for k in factors}
        for k in factors:
            m.d.comb += index[k].eq(getattr(uop, k) + s1_off[k])
            m.d.sync += full[k].eq(index[k])
        m.d.comb += [self.inp_rd.addr.eq(index["src"]), self.wgt_rd.addr.eq(index["wgt"])]

        # ---------------------------------------------------------------- S2: operand registers, range check
        s2_valid = Signal()
        m.d.sync += s2_valid.eq(s1_valid)
        beyond = Mux(r_is_alu, (full["dst"] >= c.acc_depth) | (full["src"] >= c.acc_depth),
                     (full["dst"] >= c.acc_depth) | (full["src"] >= c.inp_depth) | (full["wgt"] >= c.wgt_depth))
        m.d.sync += self.index_fault.eq(s2_valid & beyond)
        # The stages carry the fact to the write-back, which then writes nothing.
        s3_bad, s4_bad, s5_bad, s6_bad = (Signal(name=f"s{k}_bad") for k in range(3, 7))
        m.d.sync += [s3_bad.eq(beyond), s4_bad.eq(s3_bad), s5_bad.eq(s4_bad), s6_bad.eq(s5_bad)]
        m.submodules.gemm = gemm = GemmCore(c)      # its LATENCY: S2 registers the operands, S3 the products
        m.d.comb += [gemm.inp.eq(self.inp_rd.data[0]), gemm.wgt.eq(self.wgt_rd.data[0])]

        # The later stages' registers, declared here for the forwards into S3 and S4.
        s5_valid = Signal()
        s5_dst = Signal(acc_bits)
        s5_acc = Signal(c.acc_entry_bytes * 8)
        s5_b = Signal(c.acc_entry_bytes * 8)
        s6_valid = Signal()
        s6_dst = Signal(acc_bits)
        s6_result = Signal(c.acc_entry_bytes * 8)        # R6
        m.submodules.alu = alu = TensorAlu(c)

        # Every micro-op writes back from S6: R6, or a MUL's product.
        wb_data = Signal(c.acc_entry_bytes * 8)
        m.d.comb += wb_data.eq(Mux(r_is_mul, alu.product, s6_result))

        # Every forward's select is a register, set the cycle before it is used: the stages
        # advance every cycle, so "the micro-op in S6 writes the entry the one in S3 reads" is
        # "the micro-op in S5 writes the entry the one in S2 reads" a cycle earlier. The selects
        # then reach the multiplexers early, from flip-flops, with no index compare before them.
        s5_writes = s5_valid & ~s5_bad      # the micro-op in S5 writes back (from S6, next cycle)

        def select_next(condition, name):
            select = Signal(name=name)
            m.d.sync += select.eq(condition)
            return select

        # The accumulator is read in S2, from the registered index sums, and its data registered
        # in S3: a block RAM's output (5.6 ns on the ECP5) then ends at a register after one
        # forward instead of running through the operand selects into S5.
        m.d.comb += [self.acc_rda.addr.eq(full["dst"][:acc_bits]), self.acc_rdb.addr.eq(full["src"][:acc_bits])]

        # ---------------------------------------------------------------- S3: products, accumulator data
        s3_valid = Signal()
        s3_dst = Signal(acc_bits)
        s3_src = Signal(acc_bits)
        m.d.sync += [s3_valid.eq(s2_valid), s3_dst.eq(full["dst"][:acc_bits]), s3_src.eq(full["src"][:acc_bits])]
        # The micro-op three ahead writes back now; this one's read came a cycle before.
        wb3_a = select_next(s5_writes & (s5_dst == full["dst"][:acc_bits]), "wb3_a")
        wb3_b = select_next(s5_writes & (s5_dst == full["src"][:acc_bits]), "wb3_b")
        s4_acc_a = Signal(c.acc_entry_bytes * 8)
        s4_acc_b = Signal(c.acc_entry_bytes * 8)
        m.d.sync += [s4_acc_a.eq(Mux(wb3_a, wb_data, self.acc_rda.data[0])),
                     s4_acc_b.eq(Mux(wb3_b, wb_data, self.acc_rdb.data[0]))]

        # ---------------------------------------------------------------- S4: dot / operand, forwarding
        s4_valid = Signal()
        s4_dst = Signal(acc_bits)
        s4_src = Signal(acc_bits)
        m.d.sync += [s4_valid.eq(s3_valid), s4_dst.eq(s3_dst), s4_src.eq(s3_src)]
        # The micro-op two ahead writes back now, after this one's data was registered.
        wb4_a = select_next(s5_writes & (s5_dst == s3_dst), "wb4_a")
        wb4_b = select_next(s5_writes & (s5_dst == s3_src), "wb4_b")
        fwd_a = Mux(wb4_a, wb_data, s4_acc_a)
        fwd_b = Mux(wb4_b, wb_data, s4_acc_b)
        lane_count = c.batch * c.block_out
        imm_lane = Signal(c.acc_width)
        m.d.comb += imm_lane.eq(al.imm.as_signed())
        imm_lanes = Cat(*([imm_lane] * lane_count))
        operand = Mux(r_use_imm, imm_lanes, fwd_b)
        # The micro-op now in S5 writes what this one reads: S5's registers take its result as
        # it leaves the ALU. The selects are registers (set when the two were in S4 and S3), so
        # the result passes one 2:1 multiplexer on its way round (and R6 takes it for the
        # write-back). A half-rate instruction takes none: a MUL's result is not ready here, and
        # an SHR by a register has decoded its amount from S4's value (see the module docstring).
        ahead = s4_valid & ~s4_bad & ~r_half_rate
        take_a = select_next(ahead & (s4_dst == s3_dst) & ~zero_acc, "take_a")
        take_b = select_next(ahead & (s4_dst == s3_src) & r_is_alu & ~r_use_imm, "take_b")
        m.d.sync += [s5_valid.eq(s4_valid), s5_dst.eq(s4_dst),
                     s5_acc.eq(Mux(take_a, alu.result, Mux(zero_acc, 0, fwd_a))),
                     s5_b.eq(Mux(take_b, alu.result, Mux(zero_b, 0, Mux(r_is_alu, operand, gemm.dot))))]
        # MIN/MAX's compare of the operands S5 takes next, a cycle ahead (`TensorAlu.lt`), so the
        # loop holds no compare. Only a MIN or MAX instruction reads it, and there S5's result is
        # one of its operands, ``r`` = ``a`` where the lane takes a, else ``b``. An operand taken
        # from that result is then one of the two, and its compare one of two precomputed ones:
        # the next (a, b) is (r, r), (r, B), (A, r) or (A, B), A and B being S4's values. These
        # take the write-back from R6 directly (MIN/MAX has no MUL product in it) and B is the
        # immediate or the register operand (no GEMM's dot or zero): ALU values only.
        def signed_lanes(value):
            return [v.as_signed() for v in lanes(value, lane_count, c.acc_width)]

        def less(x, y):
            # The sign of the 33-bit difference: the carry chain's last sum bit, where ``x < y``
            # costs a sign correction after the chain (a LUT level more on the ECP5).
            return (x - y)[-1]

        s5_lt = Signal(lane_count)
        takes_a = Signal(lane_count)      # where the lane's MIN/MAX result is its a (else its b)
        m.d.comb += takes_a.eq(s5_lt ^ (r_alu_op == AluOp.MAX).replicate(lane_count))
        next_lt, next_shr = [], []
        for i, (a5, b5, a4, b4) in enumerate(zip(
                signed_lanes(s5_acc), signed_lanes(s5_b),
                signed_lanes(Mux(wb4_a, s6_result, s4_acc_a)),
                signed_lanes(Mux(r_use_imm, imm_lanes, Mux(wb4_b, s6_result, s4_acc_b))))):
            result_lt_b4 = Mux(takes_a[i], less(a5, b4), less(b5, b4))
            a4_lt_result = Mux(takes_a[i], less(a4, a5), less(a4, b5))
            next_lt.append(Mux(take_a, ~take_b & result_lt_b4, Mux(take_b, a4_lt_result, less(a4, b4))))
            next_shr.append(shr_decode(b4, c.acc_width))
        m.d.sync += s5_lt.eq(Cat(*next_lt))
        # SHR's shift amount, decoded a cycle ahead (`TensorAlu.shr`) from S4's operand: the
        # immediate, or the register operand, whose SHR issues at half rate so that it is never
        # S5's result (the forward into S5's b is for full-rate ALU ops only).
        s5_shr = Signal(lane_count * shr_decode_bits(c.acc_width))
        m.d.sync += s5_shr.eq(Cat(*next_shr))

        # A MUL's operands again, in registers that feed only the multipliers (`TensorAlu.mul_a`);
        # loaded only for a MUL, so synthesis does not merge them with s5_acc and s5_b. A MUL
        # needs no S5 forward: the micro-op ahead of it is two stages on.
        s5_mul_a = Signal.like(s5_acc)
        s5_mul_b = Signal.like(s5_b)
        with m.If(r_is_mul):
            m.d.sync += [s5_mul_a.eq(fwd_a), s5_mul_b.eq(operand)]

        # ---------------------------------------------------------------- S5: the op, R6
        # A GEMM's accumulate is the ALU's ADD, so the loop has no GEMM/ALU select of its own.
        m.d.comb += [alu.op.eq(r_alu_op),
                     alu.a.eq(s5_acc), alu.b.eq(s5_b), alu.lt.eq(s5_lt), alu.shr.eq(s5_shr),
                     alu.mul_a.eq(s5_mul_a), alu.mul_b.eq(s5_mul_b)]
        m.d.sync += [s6_valid.eq(s5_valid), s6_dst.eq(s5_dst), s6_result.eq(alu.result)]

        # ---------------------------------------------------------------- S6: write-back
        m.d.comb += [self.wb.addr.eq(s6_dst), self.wb.count.eq(1), self.wb.data[0].eq(wb_data),
                     self.wb.en.eq(s6_valid & ~s6_bad)]

        m.d.comb += [
            self.issuing.eq(issue),
            self.busy.eq(issue | s1_valid | s2_valid | s3_valid | s4_valid | s5_valid | s6_valid),
            self.gemm_active.eq(issue & ~is_alu),
            self.gemm_reset.eq(issue & ~is_alu & gm.reset),
            self.alu_active.eq(issue & is_alu),
        ]
        return m
