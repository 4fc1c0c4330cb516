"""The fetch engine: reads the instruction stream and dispatches it by kind.

Instructions are read in chunks of `CHUNK` (one DMA command each; the read
channels are held only for a chunk) into a local queue that always has room
for the chunk, so reading never waits on dispatch. Dispatch takes the head of
that queue to the load, compute or store command queue in program order and
stalls while the target queue is full.

Every instruction passes `InsnChecker` first: one that would fault is not
dispatched; fetch holds it and reports the fault and its index instead.
"""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..isa import LOAD_ENGINE, OPCODE_ENGINE, PIPELINE, Opcode, insn_bits, insn_bytes
from ..regmap import ENGINE_STATES, Fault
from ..timing import FETCH_CHUNK
from .axi import AxiReadSignature
from .dma_read import DmaReader
from .engine import STATE_BITS, insn_layout
from .insn_check import FAULT_BITS, InsnChecker

__all__ = ["FetchEngine", "CHUNK"]

#: Instructions per read request.
CHUNK = FETCH_CHUNK


class FetchEngine(wiring.Component):
    """Attributes
    ----------
    start : In(1)
        Pulse: fetch ``count`` instructions from byte ``address``.
    address, count : In(32)
    bus : Out(AxiReadSignature)
    load, compute, store : Out(stream of insn_bits)
        Instruction words for each engine's command queue (`isa.PIPELINE`), routed by the
        ISA's table (`isa.OPCODE_ENGINE`, `isa.LOAD_ENGINE`).
    busy : Out(1)
        Instructions remain to be read or dispatched.
    fetched : Out(32)
        Instructions dispatched since ``start``.
    fault : Out(FAULT_BITS)
        The head instruction's `Fault` (`Fault.NONE` while there is none): it is not
        dispatched. Its index is ``fetched``.
    """

    def __init__(self, config):
        self._config = config
        c = config
        super().__init__({
            "start": In(1), "address": In(32), "count": In(32),
            "bus": Out(AxiReadSignature(c.bus_width)),
            **{e.value: Out(stream.Signature(insn_bits(c))) for e in PIPELINE},
            "busy": Out(1), "mem_stall": Out(1), "queue_stall": Out(1),
            "state": Out(STATE_BITS), "fetched": Out(32), "fault": Out(FAULT_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        # One instruction per cycle: dispatch takes no more, so wider groups would buy nothing.
        m.submodules.reader = reader = DmaReader(insn_bytes(c), c.bus_bytes, lanes=1)
        wiring.connect(m, wiring.flipped(self.bus), reader.bus)
        # Each queue entry carries its instruction's check result and destination, worked out
        # in register stages before the queue (as many as the check's latency), so neither
        # the check's multiplier nor the decode lies on the dispatch path.
        # ``go`` is one bit per engine: the instruction passed its check and goes there. Decoded
        # before the queue, so dispatch is the head's bit AND the engine's ready (the fault's
        # compare and the destination's decode between the queue's output register and its
        # read enable made the fetch queue's level tiny's ECP5 critical path).
        entry = data.StructLayout({"word": insn_bits(c), "fault": FAULT_BITS, "go": len(PIPELINE)})
        # An instruction and its engine (its index in PIPELINE) while the check works on it.
        checking = data.StructLayout({"word": insn_bits(c), "to": range(len(PIPELINE))})
        m.submodules.queue = queue = fifo.SyncFIFOBuffered(width=entry.size, depth=2 * CHUNK)

        next_entry = Signal(32)      # entry index of the next chunk
        to_read = Signal(32)         # instructions not yet requested
        to_dispatch = Signal(32)
        total = Signal(32)           # the program's instruction count
        arrived = Signal(32)         # instructions read so far (to know the last one)
        # Entries in the queue plus those requested but not yet in it: requests never take it
        # beyond 2·CHUNK, so a request is due only while it holds at most CHUNK. Kept as a
        # counter of its own, with ``room`` (at most CHUNK) a register updated with it: from
        # the queue's level (its output register's valid plus the inner FIFO's count, an
        # adder) through the compare into the reader's command was tiny's ECP5 critical path
        # (`fetch.queue.r_rdy → fetch.cmd payload`, 11.2 ns).
        occupied = Signal(range(2 * CHUNK + 1))
        room = Signal(init=1)
        insn_log = exact_log2(insn_bytes(c))

        # The next request's size, min(to_read, CHUNK), and whether one is due, are registers
        # kept with `to_read` (a 32-bit compare and zero test in front of the reader's command
        # registers was one of tiny's longest paths on the ECP5).
        chunk = Signal(range(CHUNK + 1))
        to_request = Signal()       # to_read != 0

        def set_to_read(value):
            m.d.sync += [to_read.eq(value), chunk.eq(Mux(value < CHUNK, value, CHUNK)), to_request.eq(value != 0)]
        m.d.comb += [
            reader.cmd.p.base.eq(next_entry), reader.cmd.p.y_size.eq(1),
            reader.cmd.p.x_size.eq(chunk), reader.cmd.p.x_stride.eq(0),
            reader.cmd.valid.eq(to_request & room),
            reader.out.ready.eq(1),      # requests never exceed the queue's free room
        ]
        req_fire = reader.cmd.valid & reader.cmd.ready
        got = reader.out.valid & reader.out.ready

        m.submodules.check = check = InsnChecker(c)
        word = reader.out.p.entries[0]
        header = data.View(insn_layout(c, Opcode.FINISH), word[:insn_layout(c, Opcode.FINISH).size])
        ld_l = insn_layout(c, Opcode.LOAD)
        mem = data.View(ld_l, word[:ld_l.size]).mem
        staged = Signal(checking)
        staged_valid = Signal()
        m.d.comb += [check.word.eq(word), check.last.eq(arrived + 1 == total), check.en.eq(got)]
        m.d.sync += staged_valid.eq(got)
        # `staged`, delayed until the check's fault is ready (`InsnChecker.LATENCY` cycles after `got`).
        queued, queued_valid = staged, staged_valid
        for k in range(InsnChecker.LATENCY - 1):
            later, later_valid = Signal(checking, name=f"queued{k}"), Signal(name=f"queued{k}_valid")
            m.d.sync += [later.eq(queued), later_valid.eq(queued_valid)]
            queued, queued_valid = later, later_valid
        # The engine (its index in PIPELINE) by the ISA's routing; an instruction the check
        # refuses is never dispatched, so where it would have gone does not matter.
        to = Signal.like(staged.to)
        with m.Switch(header.opcode):
            with m.Case(Opcode.LOAD):
                with m.Switch(mem):
                    for buffer, engine in LOAD_ENGINE.items():
                        with m.Case(buffer):
                            m.d.comb += to.eq(PIPELINE.index(engine))
            for opcode, engine in OPCODE_ENGINE.items():
                with m.Case(opcode):
                    m.d.comb += to.eq(PIPELINE.index(engine))
        with m.If(got):
            m.d.sync += [staged.word.eq(word), arrived.eq(arrived + 1), staged.to.eq(to)]
        written = Signal(entry)
        m.d.comb += [written.word.eq(queued.word), written.fault.eq(check.fault),
                     written.go.eq(Mux(check.fault == Fault.NONE, 1 << queued.to, 0)),
                     queue.w_data.eq(written), queue.w_en.eq(queued_valid)]
        with m.If(req_fire):
            m.d.sync += next_entry.eq(next_entry + chunk)
            set_to_read(to_read - chunk)

        # Dispatch.
        head = data.View(entry, queue.r_data)
        m.d.comb += self.fault.eq(Mux(queue.r_rdy, head.fault, Fault.NONE))
        ports = [getattr(self, e.value) for e in PIPELINE]
        for index, port in enumerate(ports):
            m.d.comb += [port.payload.eq(head.word), port.valid.eq(queue.r_rdy & head.go[index])]
        m.d.comb += queue.r_en.eq(Cat(port.valid & port.ready for port in ports).any())
        dispatched = queue.r_en & queue.r_rdy
        with m.If(dispatched):
            m.d.sync += [to_dispatch.eq(to_dispatch - 1), self.fetched.eq(self.fetched + 1)]
        next_occupied = Signal.like(occupied)
        m.d.comb += next_occupied.eq(occupied + Mux(req_fire, chunk, 0) - dispatched)
        m.d.sync += [occupied.eq(next_occupied), room.eq(next_occupied <= CHUNK)]

        with m.If(self.start):
            m.d.sync += [next_entry.eq(self.address >> insn_log), to_dispatch.eq(self.count), self.fetched.eq(0),
                         arrived.eq(0), total.eq(self.count)]
            set_to_read(self.count)

        m.d.comb += [
            self.busy.eq(to_dispatch != 0),
            self.mem_stall.eq((to_dispatch != 0) & ~queue.r_rdy),
            self.queue_stall.eq(queue.r_rdy & ~queue.r_en),
            self.state.eq(Mux(to_dispatch != 0, ENGINE_STATES["exec"], ENGINE_STATES["idle"])),
        ]
        return m
