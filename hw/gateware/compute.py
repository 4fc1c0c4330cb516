"""The compute engine: GEMM/ALU instructions, accumulator and micro-op loads.

GEMM and ALU instructions run through the seven-stage `pipeline.ComputePipeline`
(one micro-op per cycle); the engine pops the instruction's tokens, starts the
pipeline, waits for it to drain and pushes. The pipeline's write-back and the
accumulator LOADs share the accumulator's group write port (never in the same
cycle: one instruction runs at a time), and every accumulator write is mirrored
into the output buffer (each lane's low ``out_width`` bits).

LOADs into the micro-op and accumulator buffers write a bus beat's worth of
entries per cycle through the buffers' group write ports (`banked`); the
pipeline reads and writes single entries through one-lane ports, with the same
one-cycle read latency as a plain memory.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import Engine, MemType, Opcode, insn_bits
from ..regmap import ENGINE_STATES
from ..microarch import buffer_lanes
from .axi import AxiReadSignature
from .banked import GroupReadSignature, GroupWriteSignature
from .engine import (STATE_BITS, EngineSequencer, insn_layout, registered_stall, token_members,
                     token_ports)
from .gemm import lanes
from .pipeline import ComputePipeline
from .tile_load import TileLoader

__all__ = ["ComputeEngine", "mirror"]


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
        raised the cycle after the micro-op's S2.
    gemm_active, alu_active : Out(1)
        A GEMM / ALU micro-op enters the pipeline this cycle.
    gemm_reset : Out(1)
        The GEMM micro-op entering is a reset (it multiplies nothing).
    state, busy, token_stall, mem_stall, retire
        Status for counters and debug, as the other engines'; ``mem_stall``: the
        accumulator or micro-op loader waited for DRAM or the bus two cycles before
        (`TileLoader.mem_stall`, `engine.registered_stall`).
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

        # ---------------------------------------------------------------- loaders
        m.submodules.acc_loader = acc_loader = TileLoader(c, "acc")
        m.submodules.uop_loader = uop_loader = TileLoader(c, "uop")
        wiring.connect(m, wiring.flipped(self.acc_bus), acc_loader.bus)
        wiring.connect(m, wiring.flipped(self.uop_bus), uop_loader.bus)
        wiring.connect(m, uop_loader.wr, wiring.flipped(self.uop_wr))

        # ---------------------------------------------------------------- instruction views
        word = Signal(insn_bits(c))
        header = data.View(insn_layout(c, Opcode.FINISH), word[:insn_layout(c, Opcode.FINISH).size])
        ld_l = insn_layout(c, Opcode.LOAD)
        ld = data.View(ld_l, word[:ld_l.size])
        for loader in (acc_loader, uop_loader):
            for name in loader.cmd.p.shape().members:        # `tile_load.load_command_layout`
                m.d.comb += loader.cmd.p[name].eq(ld[name])

        # ---------------------------------------------------------------- GEMM / ALU
        m.submodules.pipeline = pipe = ComputePipeline(c)
        m.d.comb += pipe.insn.eq(word)
        for port in ("uop_rd", "inp_rd", "wgt_rd", "acc_rda", "acc_rdb"):
            wiring.connect(m, getattr(pipe, port), wiring.flipped(getattr(self, port)))

        # The accumulator's write port: the pipeline's write-back, else the LOADs' groups.
        acc_wr, out_wr = self.acc_wr, self.out_wr
        with m.If(pipe.wb.en):
            m.d.comb += [acc_wr.addr.eq(pipe.wb.addr), acc_wr.count.eq(1), acc_wr.data[0].eq(pipe.wb.data[0]),
                         acc_wr.en.eq(1)]
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
                        m.d.comb += pipe.start.eq(1)
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
                with m.If(~pipe.issuing):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += [seq.state.eq(ENGINE_STATES["drain"]), seq.busy.eq(1)]
                with m.If(~pipe.busy):
                    m.next = "PUSH"
            seq.push_state()

        m.d.comb += [
            self.state.eq(seq.state), self.busy.eq(seq.busy), self.token_stall.eq(seq.token_stall),
            self.retire.eq(seq.retire),
            self.finish.eq(seq.retire & (header.opcode == Opcode.FINISH)),
            self.index_fault.eq(pipe.index_fault),
            self.gemm_active.eq(pipe.gemm_active),
            self.gemm_reset.eq(pipe.gemm_reset),
            self.alu_active.eq(pipe.alu_active),
            self.mem_stall.eq(registered_stall(m, acc=acc_loader.mem_stall, uop=uop_loader.mem_stall)),
        ]
        return m
