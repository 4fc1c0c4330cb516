"""Buffer → DRAM: `DmaWriter` packs groups of entries into the beats of a 2-D strided
write (the DMA's shared parts and conventions are in `gemforge.hw.gateware.dma`)."""

from amaranth import *
from amaranth.lib import fifo, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .axi import AxiWriteSignature
from .dma import BurstGenerator, DmaCommand, DmaWalk, GroupDma, refuse_unless_positive

__all__ = ["DmaWriter"]


class DmaWriter(GroupDma):
    """Stream of entry groups → DRAM, over the write half of an AXI4 master.

    Parameters
    ----------
    entry_bytes, bus_bytes, lanes : int
        As for `DmaReader`.
    responses : int
        Bursts whose write response may be outstanding (AW stalls beyond).

    Attributes
    ----------
    cmd : In(stream of DmaCommand)
        ``x_size`` and ``y_size`` must be non-zero. Accepted once the previous
        command's entries have all been taken and its bursts generated, so a
        command's AW and W go out while earlier commands' write responses are
        still on their way.
    inp : In(stream of group_layout(entry_bytes·8, lanes))
        The tiles' entries, command after command, in the groups of `dma_groups`
        (each group fills the lanes of one beat that belong to one row; ``count``
        must be the walk's).
    bus : Out(AxiWriteSignature)
    done : Out(1)
        Pulses once per command, in order, when its last write response arrives.
    busy : Out(1)
        High until the last write response of the last command has arrived.
    """

    @classmethod
    def check_arguments(cls, entry_bytes, bus_bytes, lanes=None, responses=32):
        super().check_arguments(entry_bytes, bus_bytes, lanes)
        refuse_unless_positive(responses, "Outstanding responses")

    def __init__(self, entry_bytes, bus_bytes, lanes=None, responses=32):
        self._responses = responses
        super().__init__(entry_bytes, bus_bytes, lanes, lambda group: {
            "cmd": In(stream.Signature(DmaCommand)),
            "inp": In(group),
            "bus": Out(AxiWriteSignature(bus_bytes * 8)),
            "done": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.bursts = bursts = BurstGenerator(self._entry_bytes, self._bus_bytes)
        # Write responses come back in AW order (one ID): this queue says, per burst
        # awaiting its response, whether it ends a command.
        m.submodules.responses = responses = fifo.SyncFIFO(width=1, depth=self._responses)
        # AW runs ahead of W; W learns each burst's length from this queue.
        m.submodules.lengths = lengths = fifo.SyncFIFOBuffered(width=8, depth=8)
        e_log, n_log = exact_log2(self._entry_bytes), exact_log2(self._bus_bytes)
        k_log = max(0, n_log - e_log)
        bus = self.bus
        width = self._bus_bytes * 8

        cmd = Signal(DmaCommand)
        data_done = Signal(init=1)      # every entry of `cmd` taken (or no command yet)
        walk = DmaWalk(m, cmd, k_log, self._lanes)
        free_for_cmd = data_done & bursts.cmd.ready
        room = lengths.w_rdy & responses.w_rdy

        m.d.comb += [
            bursts.cmd.p.eq(self.cmd.p),
            bursts.cmd.valid.eq(self.cmd.valid & data_done),
            self.cmd.ready.eq(free_for_cmd),
            bus.awaddr.eq(bursts.burst.p.addr),
            bus.awlen.eq(bursts.burst.p.len),
            bus.awvalid.eq(bursts.burst.valid & room),
            bursts.burst.ready.eq(bus.awready & room),
            lengths.w_data.eq(bursts.burst.p.len),
            lengths.w_en.eq(bus.awvalid & bus.awready),
            responses.w_data.eq(bursts.burst.p.last),
            responses.w_en.eq(bus.awvalid & bus.awready),
            bus.bready.eq(1),
            responses.r_en.eq(bus.bvalid),
            self.done.eq(bus.bvalid & responses.r_rdy & responses.r_data),
        ]
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [cmd.eq(self.cmd.p), data_done.eq(0)]
            walk.start(self.cmd.p)

        # W beats: `beat`/`strb` hold the beat being presented.
        beat = Signal(width)
        strb = Signal(width // 8)
        beat_valid = Signal()
        w_count = Signal(8)
        m.d.comb += [
            bus.wdata.eq(beat), bus.wstrb.eq(strb),
            bus.wvalid.eq(beat_valid & lengths.r_rdy),
            # Gated with the queue's r_rdy: before the first burst the queue's read register
            # holds no value yet (X in simulation), and WLAST is an output like any other.
            bus.wlast.eq(lengths.r_rdy & (w_count == lengths.r_data)),
        ]
        w_fire = bus.wvalid & bus.wready
        with m.If(w_fire):
            m.d.sync += beat_valid.eq(0)
            with m.If(bus.wlast):
                m.d.comb += lengths.r_en.eq(1)
                m.d.sync += w_count.eq(0)
            with m.Else():
                m.d.sync += w_count.eq(w_count + 1)

        free = ~beat_valid | w_fire
        holding = Signal()      # an entry wider than a beat still has beats to present
        m.d.comb += self.busy.eq(~data_done | holding | beat_valid | bursts.busy | lengths.r_rdy |
                                 responses.r_rdy)
        if e_log >= n_log:
            beats = 1 << (e_log - n_log)
            entry = Signal(self._entry_bytes * 8)
            index = Signal(range(max(2, beats)))
            m.d.comb += self.inp.ready.eq(~data_done & (~holding | (free & (index == beats - 1))))
            with m.If(holding & free):
                m.d.sync += [beat.eq(entry.word_select(index, width)), strb.eq(~0), beat_valid.eq(1),
                             index.eq(index + 1)]
                with m.If(index == beats - 1):
                    m.d.sync += [holding.eq(0), index.eq(0)]
            with m.If(self.inp.valid & self.inp.ready):
                m.d.sync += [entry.eq(self.inp.p.entries[0]), holding.eq(1), index.eq(0)]
                walk.advance()
                with m.If(walk.last):
                    m.d.sync += data_done.eq(1)
        else:
            # Lane j of the beat takes entry (j - lane) mod k of the group, if the group has it.
            k = 1 << k_log
            lane_bytes = self._entry_bytes
            l_log = exact_log2(self._lanes)
            m.d.comb += self.inp.ready.eq(~data_done & free)
            with m.If(self.inp.valid & self.inp.ready):
                walk.advance()
                lanes = Signal(width // 8)
                for j in range(k):
                    i = Signal(k_log, name=f"index{j}")
                    m.d.comb += i.eq(j - walk.lane)
                    with m.If(i < walk.count):
                        entry = self.inp.p.entries[i[:l_log]] if l_log else self.inp.p.entries[0]
                        m.d.sync += beat.word_select(j, lane_bytes * 8).eq(entry)
                        m.d.comb += lanes[j * lane_bytes:(j + 1) * lane_bytes].eq(~0)
                m.d.sync += strb.eq(Mux(beat_valid, 0, strb) | lanes)
                with m.If(walk.row_end | (walk.lane + walk.count == k)):
                    m.d.sync += beat_valid.eq(1)
                with m.If(walk.last):
                    m.d.sync += data_done.eq(1)
            with m.Elif(w_fire):
                m.d.sync += strb.eq(0)
        return m
