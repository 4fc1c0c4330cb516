"""DRAM → buffer: `DmaReader` gathers the beats of a 2-D strided read into groups of
entries (the DMA's shared parts and conventions are in `gemforge.hw.gateware.dma`)."""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .axi import AxiReadSignature
from .banked import group_layout
from .dma import BurstGenerator, DmaCommand, DmaWalk, GroupDma, refuse_unless_positive
from .skid import RegisteredStage, SkidBuffer, registered_w_rdy

__all__ = ["DmaReader", "read_group_layout"]


def read_group_layout(width, lanes):
    """A `group_layout` with ``row_end``: the group holds its row's last entry. A consumer that
    follows the rows (a tile loader's data run is one row) then needs no count of its own to
    compare with the group's, a compare that would start at the bus's valid."""
    return data.StructLayout({**group_layout(width, lanes).members, "row_end": 1})


class DmaReader(GroupDma):
    """DRAM → stream of entry groups, over the read half of an AXI4 master.

    Parameters
    ----------
    entry_bytes, bus_bytes : int
        Entry and beat sizes (powers of two).
    lanes : int
        Most entries per group (a power of two, at most the entries of a beat;
        default: a beat's worth). 1 gives one entry per cycle.
    depth : int
        Commands in flight: a command is accepted while up to ``depth - 1`` earlier
        ones still wait for their data, so its bursts go out while theirs arrive
        (AXI returns the read data of one ID in order).
    registered : bool
        The groups leave through a `RegisteredStage` (a cycle after their beat, from
        registers) instead of a `SkidBuffer` (in their beat's cycle).

    Attributes
    ----------
    cmd : In(stream of DmaCommand)
        ``x_size`` and ``y_size`` must be non-zero. Accepted when the burst
        generator is free, fewer than ``depth`` commands are in flight and, unless
        none is, no other bus client asks (``bus.contended``).
    out : Out(stream of read_group_layout(entry_bytes·8, lanes))
        The entries of the tiles, command after command, row by row, in the groups
        of `dma_groups`: the entries of one beat that belong to one row,
        ``entries[0]`` first; ``row_end`` marks a row's last group.
    bus : Out(AxiReadSignature)
        ``req`` is held from the first command until the last beat of the last
        command in flight is taken.
    busy : Out(1)
        A command is in flight.
    """

    @classmethod
    def check_arguments(cls, entry_bytes, bus_bytes, lanes=None, depth=4, registered=False):
        super().check_arguments(entry_bytes, bus_bytes, lanes)
        refuse_unless_positive(depth, "Command depth")

    group_shape = staticmethod(read_group_layout)

    def __init__(self, entry_bytes, bus_bytes, lanes=None, depth=4, registered=False):
        self._depth = depth
        self._registered = registered
        super().__init__(entry_bytes, bus_bytes, lanes, lambda group: {
            "cmd": In(stream.Signature(DmaCommand)),
            "out": Out(group),
            "bus": Out(AxiReadSignature(bus_bytes * 8)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.bursts = bursts = BurstGenerator(self._entry_bytes, self._bus_bytes)
        # The groups leave through a skid buffer: the consumer's ready (a tile loader's
        # choice between padding and data) would otherwise run through this reader's
        # handshake, its walk and its command queue in the same cycle. A registered stage
        # also cuts the way forward: the walk's count and row end, and the bus's valid, then
        # reach the consumer's decision from flip-flops.
        m.submodules.out_stage = stage = (RegisteredStage if self._registered else SkidBuffer)(self.out.p.shape())
        wiring.connect(m, stage.o, wiring.flipped(self.out))
        out = stage.i
        e_log, n_log = exact_log2(self._entry_bytes), exact_log2(self._bus_bytes)
        k_log = max(0, n_log - e_log)
        bus = self.bus

        # Commands go to the burst generator and, in order, to the data side's queue.
        # The data side walks `cmd` (``active``) and takes the next queued command in
        # the cycle its last entry leaves, so consecutive tiles stream back to back.
        m.submodules.pending = pending = fifo.SyncFIFO(width=DmaCommand.size, depth=self._depth)
        cmd = Signal(DmaCommand)
        active = Signal()
        walk = DmaWalk(m, cmd, k_log, self._lanes)
        # Beats still to come (the bus is needed), and the reader's work in flight (beats, or
        # groups still in the output stage, which need no bus).
        beats_due, in_flight = Signal(), Signal()
        m.d.comb += [beats_due.eq(active | pending.r_rdy | bursts.busy), in_flight.eq(beats_due | stage.holding)]
        # The queue's w_rdy, kept in a flip-flop from its level's next value, so a command's
        # acceptance starts at registers (a client's request logic waits on it: fetch's next
        # chunk, `fetch.reader.pending.level → fetch.to_read`, 10.0 ns on the ECP5).
        pending_room = registered_w_rdy(m, pending, self._depth)
        admit = pending_room & (~in_flight | ~bus.contended)

        m.d.comb += [
            bursts.cmd.p.eq(self.cmd.p),
            bursts.cmd.valid.eq(self.cmd.valid & admit),
            self.cmd.ready.eq(bursts.cmd.ready & admit),
            pending.w_data.eq(self.cmd.p),
            pending.w_en.eq(self.cmd.valid & self.cmd.ready),
            bus.araddr.eq(bursts.burst.p.addr),
            bus.arlen.eq(bursts.burst.p.len),
            bus.arvalid.eq(bursts.burst.valid & bus.gnt),
            bursts.burst.ready.eq(bus.arready & bus.gnt),
            bus.req.eq(beats_due),
            self.busy.eq(in_flight),
            out.p.count.eq(walk.count),
            out.p.row_end.eq(walk.row_end),
        ]
        finishing = Signal()

        if e_log >= n_log:
            # Gather entry_bytes/bus_bytes beats per entry, first beat lowest.
            beats = 1 << (e_log - n_log)
            width = self._bus_bytes * 8
            entry = Signal(self._entry_bytes * 8)
            count = Signal(range(beats + 1))
            full = count == beats
            take = Signal()
            m.d.comb += [
                out.valid.eq(full),
                out.p.entries[0].eq(entry),
                bus.rready.eq(active & (~full | out.ready)),
                take.eq(bus.rvalid & bus.rready),
            ]
            shifted = Cat(entry[width:], bus.rdata) if beats > 1 else bus.rdata
            with m.If(take):
                m.d.sync += entry.eq(shifted)
            with m.If(out.valid & out.ready):
                m.d.sync += count.eq(take)
                walk.advance()
                with m.If(walk.last):
                    m.d.comb += finishing.eq(1)
                    m.d.sync += active.eq(0)
            with m.Elif(take):
                m.d.sync += count.eq(count + 1)
        else:
            # Present the current beat's entries from the walk's lane on; release the
            # beat when its last lane or the row's last entry is taken.
            k = 1 << k_log
            bits = self._entry_bytes * 8
            m.d.comb += out.valid.eq(active & bus.rvalid)
            for i in range(self._lanes):
                m.d.comb += out.p.entries[i].eq(bus.rdata.word_select((walk.lane + i)[:k_log], bits))
            with m.If(out.valid & out.ready):
                walk.advance()
                m.d.comb += bus.rready.eq(walk.row_end | (walk.lane + walk.count == k))
                with m.If(walk.last):
                    m.d.comb += finishing.eq(1)
                    m.d.sync += active.eq(0)

        # After the data path's statements, so a new command's walk overrides the old one's.
        with m.If(pending.r_rdy & (~active | finishing)):
            following = DmaCommand(pending.r_data)
            m.d.comb += pending.r_en.eq(1)
            m.d.sync += [cmd.eq(following), active.eq(1)]
            walk.start(following)
        return m
