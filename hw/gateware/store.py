"""The store engine: STOREs from the output or accumulator buffer to DRAM.

Entries are read from SRAM contiguously from ``sram_base`` into a small
queue (reads are issued only with room to spare, so the one-cycle read
latency never overflows it) and streamed to the DMA writer of the buffer's
entry size. The instruction completes when the last write response arrives,
so a token pushed after a STORE means its data is in DRAM.
"""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import MemType, Opcode
from .axi import AxiWriteSignature
from .dma import DmaWriter
from .engine import STATE_BITS, EngineSequencer, TokenPort, insn_layout
from ..regmap import ENGINE_STATES

__all__ = ["StoreEngine"]

_QUEUE_DEPTH = 4


class StoreEngine(wiring.Component):
    """Runs the store engine's instruction queue.

    Attributes
    ----------
    cmd : In(stream of insn_bits)
    prev_pop, prev_push : Out(TokenPort)
        compute→store queue (pop side) and store→compute queue (push side).
    bus : Out(AxiWriteSignature)
    out_rd_addr/out_rd_data, acc_rd_addr/acc_rd_data : synchronous SRAM read ports.
    bytes_written : Out(8)
        Bytes accepted by the DMA writers this cycle (for the counter).
    """

    def __init__(self, config):
        self._config = config
        c = config
        super().__init__({
            "cmd": In(stream.Signature(c.insn_bits)),
            "prev_pop": Out(TokenPort()), "prev_push": Out(TokenPort()),
            "bus": Out(AxiWriteSignature(c.bus_width)),
            "out_rd_addr": Out(c.acc_index_bits), "out_rd_data": In(c.out_entry_bytes * 8),
            "acc_rd_addr": Out(c.acc_index_bits), "acc_rd_data": In(c.acc_entry_bytes * 8),
            "state": Out(STATE_BITS), "busy": Out(1), "token_stall": Out(1), "mem_stall": Out(1),
            "retire": Out(1), "bytes_written": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        writers = {"out": DmaWriter(c.out_entry_bytes, c.bus_bytes),
                   "acc": DmaWriter(c.acc_entry_bytes, c.bus_bytes)}
        for name, writer in writers.items():
            m.submodules[f"{name}_writer"] = writer

        word = Signal(c.insn_bits)
        layout = insn_layout(c, Opcode.STORE)
        insn = data.View(layout, word[:layout.size])
        use_acc = Signal()
        m.d.comb += use_acc.eq(insn.mem == MemType.ACC)

        # Bus: the writer of the current instruction drives it.
        active_bus = writers["out"].bus
        for name, writer in writers.items():
            sel = use_acc if name == "acc" else ~use_acc
            with m.If(sel):
                m.d.comb += [
                    self.bus.awaddr.eq(writer.bus.awaddr), self.bus.awlen.eq(writer.bus.awlen),
                    self.bus.awvalid.eq(writer.bus.awvalid), writer.bus.awready.eq(self.bus.awready),
                    self.bus.wdata.eq(writer.bus.wdata), self.bus.wstrb.eq(writer.bus.wstrb),
                    self.bus.wlast.eq(writer.bus.wlast), self.bus.wvalid.eq(writer.bus.wvalid),
                    writer.bus.wready.eq(self.bus.wready),
                    writer.bus.bresp.eq(self.bus.bresp), writer.bus.bvalid.eq(self.bus.bvalid),
                    self.bus.bready.eq(writer.bus.bready),
                ]
            m.d.comb += [
                writer.cmd.p.base.eq(insn.dram_base), writer.cmd.p.y_size.eq(insn.y_size),
                writer.cmd.p.x_size.eq(insn.x_size), writer.cmd.p.x_stride.eq(insn.x_stride),
            ]

        # SRAM → queue → writer.
        m.submodules.queue = queue = fifo.SyncFIFO(width=c.acc_entry_bytes * 8, depth=_QUEUE_DEPTH)
        addr = Signal(c.sram_addr_bits)
        row = Signal(16)
        col = Signal(16)
        reading = Signal()
        inflight = Signal()
        can_issue = reading & (queue.level + inflight < _QUEUE_DEPTH - 1)
        m.d.comb += [self.out_rd_addr.eq(addr), self.acc_rd_addr.eq(addr)]
        m.d.sync += inflight.eq(can_issue)
        m.d.comb += [queue.w_en.eq(inflight),
                     queue.w_data.eq(Mux(use_acc, self.acc_rd_data, self.out_rd_data))]
        with m.If(can_issue):
            m.d.sync += addr.eq(addr + 1)
            with m.If(col + 1 == insn.x_size):
                m.d.sync += [col.eq(0), row.eq(row + 1)]
                with m.If(row + 1 == insn.y_size):
                    m.d.sync += reading.eq(0)
            with m.Else():
                m.d.sync += col.eq(col + 1)
        for name, writer in writers.items():
            sel = use_acc if name == "acc" else ~use_acc
            m.d.comb += writer.inp.p.eq(queue.r_data)
            with m.If(sel):
                m.d.comb += [writer.inp.valid.eq(queue.r_rdy), queue.r_en.eq(writer.inp.ready)]
        m.d.comb += self.bytes_written.eq(Mux(queue.r_en & queue.r_rdy,
                                              Mux(use_acc, c.acc_entry_bytes, c.out_entry_bytes), 0))

        seq = EngineSequencer(m, c, self.cmd, word, {"prev": (self.prev_pop, self.prev_push)})
        exec_state = ENGINE_STATES["exec"]
        with m.FSM():
            seq.idle_state()
            seq.pop_state("LAUNCH")
            with m.State("LAUNCH"):
                m.d.comb += [seq.state.eq(exec_state), seq.busy.eq(1)]
                with m.If((insn.y_size == 0) | (insn.x_size == 0)):
                    m.next = "PUSH"
                with m.Else():
                    for name, writer in writers.items():
                        sel = use_acc if name == "acc" else ~use_acc
                        with m.If(sel):
                            m.d.comb += writer.cmd.valid.eq(1)
                            with m.If(writer.cmd.ready):
                                m.d.sync += [reading.eq(1), addr.eq(insn.sram_base), row.eq(0), col.eq(0)]
                                m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += [seq.state.eq(ENGINE_STATES["drain"]), seq.busy.eq(1)]
                with m.If(~reading & ~inflight & ~queue.r_rdy &
                          ~writers["out"].busy & ~writers["acc"].busy):
                    m.next = "PUSH"
            seq.push_state()

        m.d.comb += [
            self.state.eq(seq.state), self.busy.eq(seq.busy), self.token_stall.eq(seq.token_stall),
            self.retire.eq(seq.retire),
            self.mem_stall.eq(seq.busy & ((self.bus.awvalid & ~self.bus.awready) |
                                          (self.bus.wvalid & ~self.bus.wready))),
        ]
        return m
