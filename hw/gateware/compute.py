"""The compute engine: GEMM/ALU pipeline, accumulator and micro-op loads.

GEMM and ALU share one five-stage pipeline that accepts a micro-op every cycle:

====  ==============================================================
S0    the micro-op loop (`uop_loop.UopLoop`: i, j, u, offsets); read micro-op ``u``
S1    indices = micro-op fields + loop offsets; read inp, wgt
S2    products (GEMM, registered in `GemmCore`); read acc[dst], acc[src]
S3    adder tree (GEMM) or operand select (ALU); forward from S4
S4    acc[dst] = acc + dot (0 + dot when overwriting), or op(acc, operand); write acc and its out mirror
====  ==============================================================

The multipliers and the adder tree are separate stages so neither shares a
cycle with a block-RAM read. The accumulator is read one stage later than the
inputs (S2), so its data arrives with the dot products.

Read-after-write: the accumulator read ports are transparent to the write
port, so a micro-op sees every write made up to the cycle it reads (S2). The
only write it can miss is that of the micro-op directly ahead of it, which is
in S4 while it is in S3: S3 takes S4's result instead of the memory's when the
indices match. Hence micro-ops behave exactly sequentially, as the ISA says,
at one micro-op per cycle. Instructions drain the pipeline before they
complete, so nothing crosses an instruction boundary.

LOADs into the micro-op and accumulator buffers write a bus beat's worth of
entries per cycle through the buffers' group write ports (`banked`); the
pipeline reads and writes single entries through one-lane ports, with the same
one-cycle read latency as a plain memory.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import Engine, MemType, Opcode, insn_bits, uop_fields
from ..regmap import ENGINE_STATES
from .alu import TensorAlu
from .axi import AxiReadSignature
from .banked import GroupReadSignature, GroupWriteSignature, buffer_lanes
from .engine import STATE_BITS, EngineSequencer, insn_layout, token_members, token_ports
from .gemm import GemmCore, lanes
from .tile_load import TileLoader
from .uop_loop import OFFSET_BITS, UopLoop

__all__ = ["ComputeEngine", "uop_layout", "mirror"]


def uop_layout(config):
    """`data.StructLayout` of a packed micro-op (dst | src | wgt from bit 0)."""
    return data.StructLayout({f.name: f.width for f in uop_fields(config)})


def mirror(config, acc_entry):
    """The output-buffer entry of an accumulator entry: the low out_width bits of each lane."""
    n = config.batch * config.block_out
    return Cat(*(lane[:config.out_width] for lane in lanes(acc_entry, n, config.acc_width)))


class ComputeEngine(wiring.Component):
    """Runs the compute engine's instruction queue (GEMM, ALU, LOAD acc/uop, FINISH).

    Attributes
    ----------
    cmd : In(stream of insn_bits)
    prev_pop, next_pop : Out(TokenPopSignature)
    prev_push, next_push : Out(TokenPushSignature)
        The token queues to and from the load and store engines (`engine.token_members`).
    acc_bus, uop_bus : Out(AxiReadSignature)
    uop_wr : Out(GroupWriteSignature)
        The micro-op LOADs' writes into the micro-op buffer (a bus beat's worth of entries).
    uop_rd, inp_rd, wgt_rd, acc_rda, acc_rdb : Out(GroupReadSignature) of one lane
        Synchronous read ports of the buffers (data one cycle after the address); the
        micro-op port is transparent to ``uop_wr``, the two accumulator ports to ``acc_wr``.
    acc_wr, out_wr : Out(GroupWriteSignature)
        Group write ports of the accumulator and output buffers (`buffer_lanes` of acc):
        a GEMM/ALU write-back is a group of one; accumulator LOADs write whole groups,
        mirrored into the output buffer.
    finish : Out(1)
        Pulses when FINISH retires.
    index_fault : Out(1)
        A micro-op's index plus its loop offsets lies beyond its buffer (`Fault.BUFFER_RANGE`);
        raised the cycle after the micro-op's S1.
    gemm_active, alu_active : Out(1)
        A GEMM / ALU micro-op enters the pipeline this cycle.
    gemm_reset : Out(1)
        The GEMM micro-op entering is a reset (it multiplies nothing).
    """

    def __init__(self, config):
        self._config = config
        c = config
        acc_w = c.acc_entry_bytes * 8
        super().__init__({
            "cmd": In(stream.Signature(insn_bits(c))),
            **token_members(Engine.COMPUTE),
            "acc_bus": Out(AxiReadSignature(c.bus_width)),
            "uop_bus": Out(AxiReadSignature(c.bus_width)),
            "inp_rd": Out(GroupReadSignature(c.inp_entry_bytes * 8, 1, c.inp_index_bits)),
            "wgt_rd": Out(GroupReadSignature(c.wgt_entry_bytes * 8, 1, c.wgt_index_bits)),
            "acc_rda": Out(GroupReadSignature(acc_w, 1, c.acc_index_bits)),
            "acc_rdb": Out(GroupReadSignature(acc_w, 1, c.acc_index_bits)),
            "uop_wr": Out(GroupWriteSignature(c.uop_bits, buffer_lanes(c, "uop"), c.uop_index_bits)),
            "uop_rd": Out(GroupReadSignature(c.uop_bits, 1, c.uop_index_bits)),
            "acc_wr": Out(GroupWriteSignature(acc_w, buffer_lanes(c, "acc"), c.acc_index_bits)),
            "out_wr": Out(GroupWriteSignature(c.out_entry_bytes * 8, buffer_lanes(c, "acc"), c.acc_index_bits)),
            "state": Out(STATE_BITS), "busy": Out(1), "token_stall": Out(1), "mem_stall": Out(1),
            "retire": Out(1), "finish": Out(1), "index_fault": Out(1),
            "gemm_active": Out(1), "gemm_reset": Out(1), "alu_active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        acc_bits = c.acc_index_bits

        # ---------------------------------------------------------------- loaders
        uop_rd = self.uop_rd
        m.submodules.acc_loader = acc_loader = TileLoader(c, "acc")
        m.submodules.uop_loader = uop_loader = TileLoader(c, "uop")
        wiring.connect(m, wiring.flipped(self.acc_bus), acc_loader.bus)
        wiring.connect(m, wiring.flipped(self.uop_bus), uop_loader.bus)
        wiring.connect(m, uop_loader.wr, wiring.flipped(self.uop_wr))

        # ---------------------------------------------------------------- instruction views
        word = Signal(insn_bits(c))
        header = data.View(insn_layout(c, Opcode.FINISH), word[:insn_layout(c, Opcode.FINISH).size])
        ld_l = insn_layout(c, Opcode.LOAD)
        gm_l = insn_layout(c, Opcode.GEMM)
        al_l = insn_layout(c, Opcode.ALU)
        ld = data.View(ld_l, word[:ld_l.size])
        gm = data.View(gm_l, word[:gm_l.size])
        al = data.View(al_l, word[:al_l.size])
        is_alu = header.opcode == Opcode.ALU
        for loader in (acc_loader, uop_loader):
            for name in loader.cmd.p.shape().members:        # `tile_load.load_command_layout`
                m.d.comb += loader.cmd.p[name].eq(ld[name])

        # Loop parameters (the GEMM and ALU layouts share names; pick by opcode).
        def loop_field(name):
            return Mux(is_alu, getattr(al, name), getattr(gm, name))

        uop_bgn, uop_end = loop_field("uop_bgn"), loop_field("uop_end")
        iter_out, iter_in = loop_field("iter_out"), loop_field("iter_in")
        factors = {
            "dst": (loop_field("dst_factor_out"), loop_field("dst_factor_in")),
            "src": (Mux(is_alu, al.src_factor_out, gm.src_factor_out),
                    Mux(is_alu, al.src_factor_in, gm.src_factor_in)),
            "wgt": (gm.wgt_factor_out, gm.wgt_factor_in),
        }

        # ---------------------------------------------------------------- S0: the micro-op loop
        m.submodules.uop_loop = loop = UopLoop(c.uop_index_bits, kinds=tuple(factors))
        m.d.comb += [loop.uop_bgn.eq(uop_bgn), loop.uop_end.eq(uop_end),
                     loop.iter_out.eq(iter_out), loop.iter_in.eq(iter_in)]
        for k, (fo, fi) in factors.items():
            m.d.comb += [getattr(loop, f"{k}_factor_out").eq(fo), getattr(loop, f"{k}_factor_in").eq(fi)]
        issue = loop.running
        off = {k: getattr(loop, f"{k}_offset") for k in factors}
        m.d.comb += uop_rd.addr.eq(loop.uop)

        # ---------------------------------------------------------------- S1: indices, operand reads
        s1_valid = Signal()
        s1_off = {k: Signal(OFFSET_BITS, name=f"s1_{k}_off") for k in factors}
        m.d.sync += s1_valid.eq(issue)
        for k in factors:
            m.d.sync += s1_off[k].eq(off[k])
        uop = data.View(uop_layout(c), uop_rd.data[0][:uop_layout(c).size])
        s1_dst = Signal(acc_bits)
        s1_src_acc = Signal(acc_bits)
        # Indices beyond a buffer would wrap in the address bits: report them instead
        # (`Fault.BUFFER_RANGE`, as fsim does); the whole sums are compared.
        full = {k: getattr(uop, k) + s1_off[k] for k in factors}
        beyond = Mux(is_alu, (full["dst"] >= c.acc_depth) | (full["src"] >= c.acc_depth),
                     (full["dst"] >= c.acc_depth) | (full["src"] >= c.inp_depth) | (full["wgt"] >= c.wgt_depth))
        m.d.sync += self.index_fault.eq(s1_valid & beyond)   # registered: off the address path
        # A micro-op beyond its buffer writes nothing (its address would wrap); the stages
        # carry the fact to the write-back.
        s2_bad, s3_bad, s4_bad = Signal(), Signal(), Signal()
        m.d.sync += [s2_bad.eq(beyond), s3_bad.eq(s2_bad), s4_bad.eq(s3_bad)]
        m.d.comb += [
            s1_dst.eq(uop.dst + s1_off["dst"]),
            s1_src_acc.eq(uop.src + s1_off["src"]),
            self.inp_rd.addr.eq(uop.src + s1_off["src"]),
            self.wgt_rd.addr.eq(uop.wgt + s1_off["wgt"]),
        ]

        # ---------------------------------------------------------------- S2: products, accumulator reads
        s2_valid = Signal()
        s2_dst = Signal(acc_bits)
        s2_src = Signal(acc_bits)
        m.d.sync += [s2_valid.eq(s1_valid), s2_dst.eq(s1_dst), s2_src.eq(s1_src_acc)]
        m.submodules.gemm = gemm = GemmCore(c)
        m.d.comb += [gemm.inp.eq(self.inp_rd.data[0]), gemm.wgt.eq(self.wgt_rd.data[0]),
                     self.acc_rda.addr.eq(s2_dst), self.acc_rdb.addr.eq(s2_src)]

        # ---------------------------------------------------------------- S3: dot / operand, forwarding
        s3_valid = Signal()
        s3_dst = Signal(acc_bits)
        s3_src = Signal(acc_bits)
        m.d.sync += [s3_valid.eq(s2_valid), s3_dst.eq(s2_dst), s3_src.eq(s2_src)]

        s4_valid = Signal()
        s4_dst = Signal(acc_bits)
        s4_acc = Signal(c.acc_entry_bytes * 8)
        s4_b = Signal(c.acc_entry_bytes * 8)
        s4_result = Signal(c.acc_entry_bytes * 8)

        fwd_a = Mux(s4_valid & (s4_dst == s3_dst), s4_result, self.acc_rda.data[0])
        fwd_b = Mux(s4_valid & (s4_dst == s3_src), s4_result, self.acc_rdb.data[0])
        lane_count = c.batch * c.block_out
        imm_lane = Signal(c.acc_width)
        m.d.comb += imm_lane.eq(al.imm.as_signed())
        operand = Mux(al.use_imm, Cat(*([imm_lane] * lane_count)), fwd_b)
        # An overwriting GEMM adds its product to zero instead of the entry's value.
        m.d.sync += [s4_valid.eq(s3_valid), s4_dst.eq(s3_dst), s4_acc.eq(Mux(~is_alu & gm.overwrite, 0, fwd_a)),
                     s4_b.eq(Mux(is_alu, operand, gemm.dot))]

        # ---------------------------------------------------------------- S4: result, write-back
        m.submodules.alu = alu = TensorAlu(c)
        m.d.comb += [alu.op.eq(al.op), alu.a.eq(s4_acc), alu.b.eq(s4_b)]
        sums = [a + b for a, b in zip(lanes(s4_acc, lane_count, c.acc_width),
                                      lanes(s4_b, lane_count, c.acc_width))]
        gemm_result = Mux(gm.reset, 0, Cat(*(s[:c.acc_width] for s in sums)))
        m.d.comb += s4_result.eq(Mux(is_alu, alu.result, gemm_result))

        acc_wr, out_wr = self.acc_wr, self.out_wr
        with m.If(s4_valid):
            m.d.comb += [acc_wr.addr.eq(s4_dst), acc_wr.count.eq(1), acc_wr.data[0].eq(s4_result),
                         acc_wr.en.eq(~s4_bad)]
        with m.Else():
            m.d.comb += [acc_wr.addr.eq(acc_loader.wr.addr), acc_wr.count.eq(acc_loader.wr.count),
                         acc_wr.data.eq(acc_loader.wr.data), acc_wr.en.eq(acc_loader.wr.en)]
        m.d.comb += [out_wr.addr.eq(acc_wr.addr), out_wr.count.eq(acc_wr.count), out_wr.en.eq(acc_wr.en)]
        for lane in range(len(acc_wr.data)):
            m.d.comb += out_wr.data[lane].eq(mirror(c, acc_wr.data[lane]))

        # ---------------------------------------------------------------- sequencing
        seq = EngineSequencer(m, c, self.cmd, word, token_ports(self, Engine.COMPUTE))
        exec_state = ENGINE_STATES["exec"]
        with m.FSM():
            seq.idle_state()
            seq.pop_state("DISPATCH")
            with m.State("DISPATCH"):
                m.d.comb += [seq.state.eq(exec_state), seq.busy.eq(1)]
                with m.Switch(header.opcode):
                    with m.Case(Opcode.GEMM, Opcode.ALU):
                        # Loops are never empty: fetch dispatches no zero count or empty
                        # micro-op range (`InsnChecker`).
                        m.d.comb += loop.start.eq(1)
                        m.next = "RUN"
                    with m.Case(Opcode.LOAD):
                        m.next = "LAUNCH"
                    with m.Default():        # FINISH
                        m.next = "PUSH"
            with m.State("LAUNCH"):
                m.d.comb += [seq.state.eq(exec_state), seq.busy.eq(1)]
                with m.If(ld.mem == MemType.UOP):
                    m.d.comb += uop_loader.cmd.valid.eq(1)
                    with m.If(uop_loader.cmd.ready):
                        m.next = "WAIT"
                with m.Else():
                    m.d.comb += acc_loader.cmd.valid.eq(1)
                    with m.If(acc_loader.cmd.ready):
                        m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += [seq.state.eq(exec_state), seq.busy.eq(1)]
                with m.If(~acc_loader.busy & ~uop_loader.busy):
                    m.next = "PUSH"
            with m.State("RUN"):
                m.d.comb += [seq.state.eq(exec_state), seq.busy.eq(1)]
                with m.If(~issue):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += [seq.state.eq(ENGINE_STATES["drain"]), seq.busy.eq(1)]
                with m.If(~s1_valid & ~s2_valid & ~s3_valid & ~s4_valid):
                    m.next = "PUSH"
            seq.push_state()

        m.d.comb += [
            self.state.eq(seq.state), self.busy.eq(seq.busy), self.token_stall.eq(seq.token_stall),
            self.retire.eq(seq.retire),
            self.finish.eq(seq.retire & (header.opcode == Opcode.FINISH)),
            self.gemm_active.eq(issue & ~is_alu),
            self.gemm_reset.eq(issue & ~is_alu & gm.reset),
            self.alu_active.eq(issue & is_alu),
            self.mem_stall.eq(acc_loader.mem_stall | uop_loader.mem_stall |
                              (acc_loader.bus.req & ~acc_loader.bus.gnt) |
                              (uop_loader.bus.req & ~uop_loader.bus.gnt)),
        ]
        return m
