"""DRAM → buffer: `DmaReader` gathers the beats of a 2-D strided read into groups of
entries (the DMA's shared parts and conventions are in `gemforge.hw.gateware.dma`)."""

from amaranth import *
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .axi import AxiReadSignature
from .dma import BurstGenerator, DmaCommand, DmaWalk, GroupDma, refuse_unless_positive
from .skid import SkidBuffer

__all__ = ["DmaReader"]


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

    Attributes
    ----------
    cmd : In(stream of DmaCommand)
        ``x_size`` and ``y_size`` must be non-zero. Accepted when the burst
        generator is free, fewer than ``depth`` commands are in flight and, unless
        none is, no other bus client asks (``bus.contended``).
    out : Out(stream of group_layout(entry_bytes·8, lanes))
        The entries of the tiles, command after command, row by row, in the groups
        of `dma_groups`: the entries of one beat that belong to one row,
        ``entries[0]`` first.
    bus : Out(AxiReadSignature)
        ``req`` is held from the first command until the last entry of the last
        command in flight is delivered.
    busy : Out(1)
        A command is in flight.
    """

    @classmethod
    def check_arguments(cls, entry_bytes, bus_bytes, lanes=None, depth=4):
        super().check_arguments(entry_bytes, bus_bytes, lanes)
        refuse_unless_positive(depth, "Command depth")

    def __init__(self, entry_bytes, bus_bytes, lanes=None, depth=4):
        self._depth = depth
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
        # handshake, its walk and its command queue in the same cycle.
        m.submodules.skid = skid = SkidBuffer(self.out.p.shape())
        wiring.connect(m, skid.o, wiring.flipped(self.out))
        out = skid.i
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
        in_flight = Signal()
        m.d.comb += in_flight.eq(active | pending.r_rdy | bursts.busy | skid.holding)
        admit = pending.w_rdy & (~in_flight | ~bus.contended)

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
            bus.req.eq(in_flight),
            self.busy.eq(in_flight),
            out.p.count.eq(walk.count),
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
