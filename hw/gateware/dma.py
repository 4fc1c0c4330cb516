"""2-D strided DMA between DRAM (AXI4 bursts) and streams of buffer entries.

A DMA command moves ``y_size`` rows of ``x_size`` entries; row ``y`` starts at
DRAM entry ``base + y·x_stride`` (entries of ``entry_bytes`` bytes, so byte
address = entry index × entry_bytes). Entries and bus beats may differ in size:

* entry ≥ beat: an entry is ``entry_bytes / bus_bytes`` consecutive beats
  (first beat = low bits), every row is beat-aligned;
* entry < beat: a beat holds ``k = bus_bytes / entry_bytes`` entries (lane 0 =
  low bits); a row starting or ending inside a beat reads the whole beat and
  writes only its lanes (``wstrb``).

The data side moves *groups* (`group_layout`), one per cycle: the entries of one
beat that belong to one row, at most ``lanes`` of them (`DmaWalk`, `dma_groups`).
With ``lanes = k`` a long row streams at one beat per cycle whatever the entry
size; a group is one entry when entries are a beat or wider (or ``lanes = 1``).

Bursts never cross a `max_burst`-beat boundary, so they never cross 4 KiB.
Address generation (`BurstGenerator`) runs ahead of the data, so consecutive
bursts overlap and the data channel can stream one beat per cycle.
"""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..isa import DMA_TRANSFER_FIELDS
from .axi import ADDR_BITS, AxiReadSignature, AxiWriteSignature
from .banked import group_layout

__all__ = ["DmaCommand", "dma_command_from", "BurstGenerator", "DmaWalk", "DmaReader", "DmaWriter", "dma_groups", "dma_lanes",
           "max_burst_beats", "refuse_unless_positive"]

#: A DMA command: DRAM entry index of row 0 (``base``), rows, entries per row, entries between
#: row starts: the LOAD/STORE instruction's DRAM-side fields (`isa.DMA_TRANSFER_FIELDS`).
DmaCommand = data.StructLayout({("base" if f.name == "dram_base" else f.name): f.width for f in DMA_TRANSFER_FIELDS})



def dma_command_from(cmd, insn):
    """Assignments of a `DmaCommand` view ``cmd`` from a LOAD or STORE view ``insn`` (its
    DRAM-side fields)."""
    return [cmd["base" if f.name == "dram_base" else f.name].eq(insn[f.name]) for f in DMA_TRANSFER_FIELDS]


#: A burst: byte address, AxLEN (beats − 1), and whether it is its command's last.
BurstLayout = data.StructLayout({"addr": ADDR_BITS, "len": 8, "last": 1})


def max_burst_beats(bus_bytes):
    """Longest burst issued: 64 beats, fewer on wide buses so a burst stays within 4 KiB."""
    return min(64, 4096 // bus_bytes)


def _check_sizes(entry_bytes, bus_bytes):
    for name, value in (("entry_bytes", entry_bytes), ("bus_bytes", bus_bytes)):
        if not isinstance(value, int) or value <= 0 or value & (value - 1):
            raise TypeError(f"{name} must be a positive power of two, not {value!r}")


class BurstGenerator(wiring.Component):
    """Splits 2-D DMA commands into AXI bursts (byte address, AxLEN).

    Parameters
    ----------
    entry_bytes, bus_bytes : int
        Entry and beat sizes (powers of two).

    Attributes
    ----------
    cmd : In(stream of DmaCommand)
        One command at a time; ``x_size`` and ``y_size`` must be non-zero.
    burst : Out(stream of BurstLayout)
        Bursts in order; ``len`` is beats − 1; ``last`` marks a command's last burst.
    busy : Out(1)
        A command is being split.
    """

    def __init__(self, entry_bytes, bus_bytes):
        _check_sizes(entry_bytes, bus_bytes)
        self._entry_bytes = entry_bytes
        self._bus_bytes = bus_bytes
        super().__init__({
            "cmd": In(stream.Signature(DmaCommand)),
            "burst": Out(stream.Signature(BurstLayout)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        e_log, n_log = exact_log2(self._entry_bytes), exact_log2(self._bus_bytes)
        maxb = max_burst_beats(self._bus_bytes)
        beat_bits = ADDR_BITS - n_log

        cmd = Signal(DmaCommand)
        row = Signal.like(cmd.y_size)
        row_addr = Signal.like(cmd.base)
        beat = Signal(beat_bits)
        left = Signal(32)

        first_beat = Signal(beat_bits)
        beat_count = Signal(32)
        if e_log >= n_log:
            m.d.comb += [first_beat.eq(row_addr << (e_log - n_log)),
                         beat_count.eq(cmd.x_size << (e_log - n_log))]
        else:
            k_log = n_log - e_log
            last = Signal(33)
            m.d.comb += [last.eq(row_addr + cmd.x_size - 1),
                         first_beat.eq(row_addr >> k_log),
                         beat_count.eq((last >> k_log) - (row_addr >> k_log) + 1)]

        to_boundary = Signal(range(maxb + 1))
        m.d.comb += to_boundary.eq(maxb - beat[:exact_log2(maxb)])
        length = Signal(range(maxb + 1))
        m.d.comb += length.eq(Mux(left < to_boundary, left, to_boundary))
        m.d.comb += [self.burst.p.addr.eq(beat << n_log), self.burst.p.len.eq(length - 1),
                     self.burst.p.last.eq((left == length) & (row + 1 == cmd.y_size))]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [cmd.eq(self.cmd.p), row.eq(0), row_addr.eq(self.cmd.p.base)]
                    m.next = "ROW"
            with m.State("ROW"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [beat.eq(first_beat), left.eq(beat_count)]
                m.next = "BURST"
            with m.State("BURST"):
                m.d.comb += [self.busy.eq(1), self.burst.valid.eq(1)]
                with m.If(self.burst.ready):
                    m.d.sync += [beat.eq(beat + length), left.eq(left - length)]
                    with m.If(left == length):
                        m.d.sync += [row.eq(row + 1), row_addr.eq(row_addr + cmd.x_stride)]
                        with m.If(row + 1 == cmd.y_size):
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "ROW"
        return m


class DmaWalk:
    """The data side's walk over a command, one group per step (logic added to ``m``).

    A step moves ``count`` = min(``lanes``, lanes left in the beat, entries left in
    the row) entries: the entries of one beat that belong to one row (one entry when
    entries are at least a beat wide). `dma_groups` is the same walk in Python.

    Attributes
    ----------
    count : Value
        Entries of the current step (1..lanes).
    row_end, last : Value
        The step ends a row / the command.
    lane : Signal
        Lane of the step's first entry within its beat.
    """

    def __init__(self, m, cmd, k_log, lanes=1):
        assert 1 <= lanes <= 1 << k_log and lanes & (lanes - 1) == 0
        self.row = Signal.like(cmd.y_size)
        self.left = Signal.like(cmd.x_size)         # entries left in this row
        self.row_addr = Signal.like(cmd.base)
        self.lane = Signal(max(1, k_log))
        self._m, self._cmd, self._k_log = m, cmd, k_log
        if lanes == 1:
            self.count = C(1, 1)
        else:
            k = 1 << k_log
            to_beat_end = Signal(k_log + 1)
            self.count = Signal(range(lanes + 1))
            m.d.comb += to_beat_end.eq(k - self.lane)
            limit = Mux(to_beat_end < lanes, to_beat_end, lanes)
            m.d.comb += self.count.eq(Mux(self.left < limit, self.left, limit))
        self.row_end = self.left == self.count
        self.last = self.row_end & (self.row + 1 == cmd.y_size)

    def start(self, cmd):
        """Statements for a new command (``cmd`` is the incoming payload, not yet latched)."""
        m = self._m
        m.d.sync += [self.row.eq(0), self.left.eq(cmd.x_size), self.row_addr.eq(cmd.base)]
        if self._k_log:
            m.d.sync += self.lane.eq(cmd.base[:self._k_log])

    def advance(self):
        """Statements for the current step's entries consumed."""
        m, cmd = self._m, self._cmd
        with m.If(self.row_end):
            next_addr = self.row_addr + cmd.x_stride
            m.d.sync += [self.row.eq(self.row + 1), self.left.eq(cmd.x_size),
                         self.row_addr.eq(next_addr)]
            if self._k_log:
                m.d.sync += self.lane.eq(next_addr[:self._k_log])
        with m.Else():
            m.d.sync += self.left.eq(self.left - self.count)
            if self._k_log:
                m.d.sync += self.lane.eq(self.lane + self.count)


def dma_groups(base, y_size, x_size, x_stride, entry_bytes, bus_bytes, lanes=None):
    """The group sizes `DmaWalk` steps through for one command (a reference model)."""
    k = max(1, bus_bytes // entry_bytes)
    lanes = k if lanes is None else lanes
    out = []
    for y in range(y_size):
        addr, left = base + y * x_stride, x_size
        while left:
            n = min(lanes, k - addr % k, left)
            out.append(n)
            addr, left = addr + n, left - n
    return out


def dma_lanes(entry_bytes, bus_bytes, lanes):
    """Check and default the group width of a reader/writer: a power of two up to a beat's entries."""
    _check_sizes(entry_bytes, bus_bytes)
    k = max(1, bus_bytes // entry_bytes)
    if lanes is None:
        return k
    if not isinstance(lanes, int) or lanes <= 0 or lanes & (lanes - 1) or lanes > k:
        raise TypeError(f"lanes must be a power of two from 1 to {k} (entries per beat), not {lanes!r}")
    return lanes


def refuse_unless_positive(component, value, what):
    """Refuse a non-positive-integer constructor argument; the refused component is
    marked so that Amaranth does not also warn that it was never used."""
    if not isinstance(value, int) or value < 1:
        component._MustUse__silence = True
        raise TypeError(f"{what} must be a positive integer, not {value!r}")


class _GroupDma(wiring.Component):
    """What the reader and the writer share: entry and beat sizes, and the stream of
    entry groups (up to ``lanes`` entries) they exchange with the buffer side.
    ``members(group)`` gives the component's signature members for that stream."""

    def __init__(self, entry_bytes, bus_bytes, lanes, members):
        self._lanes = dma_lanes(entry_bytes, bus_bytes, lanes)
        self._entry_bytes = entry_bytes
        self._bus_bytes = bus_bytes
        super().__init__(members(stream.Signature(group_layout(entry_bytes * 8, self._lanes))))

    @property
    def lanes(self):
        return self._lanes


class DmaReader(_GroupDma):
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

    def __init__(self, entry_bytes, bus_bytes, lanes=None, depth=4):
        refuse_unless_positive(self, depth, "Command depth")
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
        m.d.comb += in_flight.eq(active | pending.r_rdy | bursts.busy)
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
            self.out.p.count.eq(walk.count),
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
                self.out.valid.eq(full),
                self.out.p.entries[0].eq(entry),
                bus.rready.eq(active & (~full | self.out.ready)),
                take.eq(bus.rvalid & bus.rready),
            ]
            shifted = Cat(entry[width:], bus.rdata) if beats > 1 else bus.rdata
            with m.If(take):
                m.d.sync += entry.eq(shifted)
            with m.If(self.out.valid & self.out.ready):
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
            m.d.comb += self.out.valid.eq(active & bus.rvalid)
            for i in range(self._lanes):
                m.d.comb += self.out.p.entries[i].eq(bus.rdata.word_select((walk.lane + i)[:k_log], bits))
            with m.If(self.out.valid & self.out.ready):
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


class DmaWriter(_GroupDma):
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

    def __init__(self, entry_bytes, bus_bytes, lanes=None, responses=32):
        refuse_unless_positive(self, responses, "Outstanding responses")
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
            bus.wlast.eq(w_count == lengths.r_data),
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
