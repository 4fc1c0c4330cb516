"""The store engine: STOREs from the output or accumulator buffer to DRAM.

Entries are read from SRAM contiguously from ``sram_base`` into a small
queue (reads are issued only with room to spare, so the one-cycle read
latency never overflows it) and streamed to the DMA writer of the buffer's
entry size. Reads go by groups: each read takes, through the buffer's group
read port, exactly the entries the writer will pack into one beat (the same
`DmaWalk` over the DRAM side of the command), so narrow entries leave at a
beat per cycle. The instruction completes when the last write response
arrives, so a token pushed after a STORE means its data is in DRAM.

STOREs pipeline: the next STORE is popped and launched as soon as the previous
one's SRAM reads are issued, so its AW and W go out while the previous STORE's
write responses are outstanding; each instruction's pushes wait in
`PendingPushes` until its writer reports the last response, and leave in
program order. The bus belongs to one writer at a time (``owner``): a STORE
from the other buffer waits until the owner's writes are all answered, so
every write response reaches the writer that issued the burst.
"""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..isa import Engine, MemType, Opcode, insn_bits
from .axi import AxiWriteSignature, connect_when_selected
from .banked import GroupReadSignature, buffer_lanes, group_layout
from .dma import DmaCommand, DmaWalk, dma_command_from
from .dma_write import DmaWriter
from .engine import STATE_BITS, EngineSequencer, PendingPushes, insn_layout, token_members, token_ports
from ..regmap import ENGINE_STATES

__all__ = ["StoreEngine"]

_QUEUE_DEPTH = 4


class StoreEngine(wiring.Component):
    """Runs the store engine's instruction queue.

    Attributes
    ----------
    cmd : In(stream of insn_bits)
    prev_pop : Out(TokenPopSignature)
    prev_push : Out(TokenPushSignature)
        The token queues from and to the compute engine (`engine.token_members`).
        compute→store queue (pop side) and store→compute queue (push side).
    bus : Out(AxiWriteSignature)
    out_rd, acc_rd : Out(GroupReadSignature)
        Group read ports of the output and accumulator buffers (`buffer_lanes` entries).
    state, busy, token_stall, mem_stall, retire : status for counters and debug.
        ``busy``: an instruction is being popped or launched, or a launched one has
        not been retired (data or write responses in flight, push pending);
        ``retire``: an instruction's pushes are done (its data is in DRAM).
    bytes_written : Out(range(largest group's bytes + 1))
        Bytes accepted by the DMA writers this cycle (for the counter): a group of
        entries, at most a beat when entries are narrower, one entry otherwise.
    """

    def __init__(self, config):
        self._config = config
        c = config
        super().__init__({
            "cmd": In(stream.Signature(insn_bits(c))),
            **token_members(Engine.STORE),
            "bus": Out(AxiWriteSignature(c.bus_width)),
            "out_rd": Out(GroupReadSignature(c.out_entry_bytes * 8, buffer_lanes(c, "out"), c.acc_index_bits)),
            "acc_rd": Out(GroupReadSignature(c.acc_entry_bytes * 8, buffer_lanes(c, "acc"), c.acc_index_bits)),
            "state": Out(STATE_BITS), "busy": Out(1), "token_stall": Out(1), "mem_stall": Out(1),
            "retire": Out(1),
            "bytes_written": Out(range(max(c.bus_bytes, c.out_entry_bytes, c.acc_entry_bytes) + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        # buffer: (read port, entry bytes, lanes)
        buffers = {name: (getattr(self, f"{name}_rd"), c.entry_bytes(name), buffer_lanes(c, name))
                   for name in ("out", "acc")}
        writers = {name: DmaWriter(entry, c.bus_bytes, lanes) for name, (_, entry, lanes) in buffers.items()}
        for name, writer in writers.items():
            m.submodules[f"{name}_writer"] = writer

        word = Signal(insn_bits(c))
        layout = insn_layout(c, Opcode.STORE)
        insn = data.View(layout, word[:layout.size])
        insn_acc = insn.mem == MemType.ACC
        insn_cmd = Signal(DmaCommand)
        m.d.comb += dma_command_from(insn_cmd, insn)
        for writer in writers.values():
            m.d.comb += writer.cmd.p.eq(insn_cmd)

        # Bus: the owner's writer drives it (set at each launch; see the module docstring).
        use_acc = Signal()      # the owner, and the buffer of the SRAM reads in progress
        selected = {"out": ~use_acc, "acc": use_acc}
        for name, writer in writers.items():
            with m.If(selected[name]):
                m.d.comb += connect_when_selected(self.bus, writer.bus)

        # SRAM → queue → writer, a group per read. Each buffer has its own walk (its
        # entries per beat); only the selected one advances. `dma_cmd` holds the
        # command being read, as the instruction word moves on at launch.
        dma_cmd = Signal(DmaCommand)
        layouts = {name: group_layout(entry * 8, lanes) for name, (_, entry, lanes) in buffers.items()}
        group_bits = max(layout.size for layout in layouts.values())
        m.submodules.queue = queue = fifo.SyncFIFO(width=group_bits, depth=_QUEUE_DEPTH)
        addr = Signal(c.sram_addr_bits)
        reading = Signal()
        inflight = Signal()
        can_issue = reading & (queue.level + inflight < _QUEUE_DEPTH - 1)
        walks = {name: DmaWalk(m, dma_cmd, exact_log2(max(1, c.bus_bytes // entry)), lanes)
                 for name, (_, entry, lanes) in buffers.items()}
        count = Mux(use_acc, walks["acc"].count, walks["out"].count)
        last = Mux(use_acc, walks["acc"].last, walks["out"].last)
        inflight_count = Signal(range(max(lanes for _, _, lanes in buffers.values()) + 1))
        m.d.sync += [inflight.eq(can_issue), inflight_count.eq(count)]
        read_groups = {}
        for name, (port, _, _) in buffers.items():
            m.d.comb += port.addr.eq(addr)
            group = read_groups[name] = Signal(layouts[name], name=f"{name}_group")
            m.d.comb += [group.entries.eq(port.data), group.count.eq(inflight_count)]
        m.d.comb += [queue.w_en.eq(inflight),
                     queue.w_data.eq(Mux(use_acc, read_groups["acc"].as_value(), read_groups["out"].as_value()))]
        with m.If(can_issue):
            m.d.sync += addr.eq(addr + count)
            for name, walk in walks.items():
                with m.If(selected[name]):
                    walk.advance()
            with m.If(last):
                m.d.sync += reading.eq(0)
        m.d.comb += self.bytes_written.eq(0)
        for name, writer in writers.items():
            m.d.comb += writer.inp.p.eq(queue.r_data[:len(writer.inp.p.as_value())])
            with m.If(selected[name]):
                m.d.comb += [writer.inp.valid.eq(queue.r_rdy), queue.r_en.eq(writer.inp.ready)]
                with m.If(queue.r_en & queue.r_rdy):
                    m.d.comb += self.bytes_written.eq(writer.inp.p.count * buffers[name][1])

        seq = EngineSequencer(m, c, self.cmd, word, token_ports(self, Engine.STORE))
        pushes = PendingPushes(m, token_ports(self, Engine.STORE),
                               [writers["out"].done, writers["acc"].done])
        exec_state = ENGINE_STATES["exec"]
        with m.FSM():
            seq.idle_state()
            seq.pop_state("LAUNCH")
            with m.State("LAUNCH"):
                m.d.comb += [seq.state.eq(exec_state), seq.busy.eq(1)]
                # (Fetch dispatches no STORE with a zero size: `InsnChecker`.)
                # The reads of the previous STORE are issued; a change of buffer also
                # waits for the previous owner's last write response.
                owner_busy = Mux(use_acc, writers["acc"].busy, writers["out"].busy)
                switch_ok = (insn_acc == use_acc) | ~owner_busy
                for name, writer in writers.items():
                    with m.If(insn_acc if name == "acc" else ~insn_acc):
                        launch_ok = ~reading & pushes.ready & switch_ok
                        m.d.comb += writer.cmd.valid.eq(launch_ok)
                        with m.If(writer.cmd.ready & launch_ok):
                            m.d.sync += [reading.eq(1), addr.eq(insn.sram_base), dma_cmd.eq(insn_cmd),
                                         use_acc.eq(insn_acc)]
                            for walk in walks.values():
                                walk.start(insn_cmd)
                            pushes.add(m, seq.header, insn_acc)
                            m.next = "IDLE"

        state, busy, token_stall = pushes.engine_status(m, seq)
        m.d.comb += [
            self.state.eq(state), self.busy.eq(busy), self.token_stall.eq(token_stall),
            self.retire.eq(pushes.retire),
            self.mem_stall.eq(busy & ((self.bus.awvalid & ~self.bus.awready) |
                                      (self.bus.wvalid & ~self.bus.wready))),
        ]
        return m
