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
beat that belong to one row, at most ``lanes`` of them (`DmaWalk`, `microarch.dma_groups`).
With ``lanes = k`` a long row streams at one beat per cycle whatever the entry
size; a group is one entry when entries are a beat or wider (or ``lanes = 1``).

Bursts never cross a `max_burst`-beat boundary, so they never cross 4 KiB.
Address generation (`BurstGenerator`) runs ahead of the data, so consecutive
bursts overlap and the data channel can stream one beat per cycle.

This module holds what both directions share (the command, bursts, the walk over a
command's groups); `dma_read.DmaReader` gathers read beats into groups, `dma_write.DmaWriter`
packs groups into write beats.
"""

from amaranth import *
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..isa import DMA_TRANSFER_FIELDS
from ..microarch import max_burst_beats
from .axi import ADDR_BITS
from .banked import group_layout
from .checked import CheckedComponent

__all__ = ["DmaCommand", "dma_command_from", "BurstGenerator", "DmaWalk", "GroupDma", "dma_lanes", "refuse_unless_positive"]

#: A DMA command: DRAM entry index of row 0 (``base``), rows, entries per row, entries between
#: row starts: the LOAD/STORE instruction's DRAM-side fields (`isa.DMA_TRANSFER_FIELDS`).
DmaCommand = data.StructLayout({("base" if f.name == "dram_base" else f.name): f.width for f in DMA_TRANSFER_FIELDS})



def dma_command_from(cmd, insn):
    """Assignments of a `DmaCommand` view ``cmd`` from a LOAD or STORE view ``insn`` (its
    DRAM-side fields)."""
    return [cmd["base" if f.name == "dram_base" else f.name].eq(insn[f.name]) for f in DMA_TRANSFER_FIELDS]


#: A burst: byte address, AxLEN (beats − 1), and whether it is its command's last.
BurstLayout = data.StructLayout({"addr": ADDR_BITS, "len": 8, "last": 1})


def _check_sizes(entry_bytes, bus_bytes):
    for name, value in (("entry_bytes", entry_bytes), ("bus_bytes", bus_bytes)):
        if not isinstance(value, int) or value <= 0 or value & (value - 1):
            raise TypeError(f"{name} must be a positive power of two, not {value!r}")


class BurstGenerator(CheckedComponent):
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

    @classmethod
    def check_arguments(cls, entry_bytes, bus_bytes):
        _check_sizes(entry_bytes, bus_bytes)

    def __init__(self, entry_bytes, bus_bytes):
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
        rows_left = Signal.like(cmd.y_size)     # rows to split, this one included
        row_addr = Signal.like(cmd.base)
        beat = Signal(beat_bits)
        x_max = (1 << len(cmd.x_size)) - 1

        # A row's beats. With k entries per beat, a row of x entries from entry q·k + r spans
        # beats q .. q + (r + x - 1) // k: only r (the low bits) enters the sum, so the
        # count is a narrow add, not an address-wide one.
        if e_log >= n_log:
            beat_count = Signal(range((x_max << (e_log - n_log)) + 1))

            def row_beats(addr, x_size):
                return addr << (e_log - n_log), x_size << (e_log - n_log)
        else:
            k_log = n_log - e_log
            beat_count = Signal(range(((1 << k_log) - 1 + x_max - 1 >> k_log) + 2))

            def row_beats(addr, x_size):
                return addr >> k_log, ((addr[:k_log] + x_size - 1) >> k_log) + 1
        # The row's first beat, its beat count and the beats to its first boundary are registered
        # with the row's address (computed from the address being loaded), so the ROW state's
        # compare starts at flip-flops rather than behind two carry chains.
        first_beat = Signal(beat_bits)
        to_boundary = Signal(range(maxb + 1))   # beats from a row's first beat to the next boundary
        left = Signal.like(beat_count)          # beats of the row left to burst

        def load_row(addr, x_size):
            """Statements that make the row at entry ``addr``, ``x_size`` entries long, the one to split."""
            first, count = row_beats(addr, x_size)
            m.d.sync += [row_addr.eq(addr), first_beat.eq(first), beat_count.eq(count),
                         to_boundary.eq(maxb - first[:exact_log2(maxb)])]

        # The burst on offer is registered (`length`, `row_end`), so that a handshake only loads
        # registers and never waits on the length arithmetic (a subtract, a compare and a mux
        # that otherwise sat between the AXI ready and every register's enable). Only a row's
        # first burst can start off a boundary: once a burst stops at one (it is shorter than
        # what is left), the next starts on it and is simply min(left, maxb) long.
        length = Signal(range(maxb + 1))        # beats of the burst on offer
        row_end = Signal()                      # the burst on offer ends its row
        rest = Signal.like(left)                # what the row has left after the burst on offer
        m.d.comb += rest.eq(left - length)
        m.d.comb += [self.burst.p.addr.eq(beat << n_log), self.burst.p.len.eq(length - 1),
                     self.burst.p.last.eq(row_end & (rows_left == 1))]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                # Loaded in every idle cycle, offered or not (nothing reads them while idle):
                # so the command's valid, a decision of the client's, drives only the state, not
                # the enables of these registers (a path of 11.8 ns on tiny's ECP5 build).
                m.d.sync += [cmd.eq(self.cmd.p), rows_left.eq(self.cmd.p.y_size)]
                load_row(self.cmd.p.base, self.cmd.p.x_size)
                with m.If(self.cmd.valid):
                    m.next = "ROW"
            with m.State("ROW"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [beat.eq(first_beat), left.eq(beat_count),
                             length.eq(Mux(beat_count < to_boundary, beat_count, to_boundary)),
                             row_end.eq(beat_count <= to_boundary)]
                m.next = "BURST"
            with m.State("BURST"):
                m.d.comb += [self.busy.eq(1), self.burst.valid.eq(1)]
                with m.If(self.burst.ready):
                    m.d.sync += [beat.eq(beat + length), left.eq(rest),
                                 length.eq(Mux(rest < maxb, rest, maxb)), row_end.eq(rest <= maxb)]
                    with m.If(row_end):
                        m.d.sync += rows_left.eq(rows_left - 1)
                        load_row((row_addr + cmd.x_stride)[:len(row_addr)], cmd.x_size)
                        with m.If(rows_left == 1):
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "ROW"
        return m


class DmaWalk:
    """The data side's walk over a command, one group per step (logic added to ``m``).

    A step moves ``count`` = min(``lanes``, lanes left in the beat, entries left in
    the row) entries: the entries of one beat that belong to one row (one entry when
    entries are at least a beat wide). `microarch.dma_groups` is the same walk in Python.

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
        self.rows_left = Signal.like(cmd.y_size)    # rows left, this one included
        self.left = Signal.like(cmd.x_size)         # entries left in this row
        self.row_addr = Signal.like(cmd.base)
        self.lane = Signal(max(1, k_log))
        # A step's count and the row's end need only min(left, k + 1): k + 1 exceeds every
        # count, so the clamp changes neither. Kept in a narrow register of its own, it takes
        # the row's wide compares (and the carry chains of left) off the path from the lane
        # to the counters' enables, which was tiny's slowest on the ECP5.
        self._cap = (1 << k_log) + 1
        self._lanes = lanes
        self.near = Signal(range(self._cap + 1))    # min(left, cap)
        # rows_left == 1, kept in a flip-flop: the command's end is then the row's end and a
        # register, not a compare of the row counter behind it (on the handshake's path into
        # every counter's enable).
        self.final_row = Signal()
        self._m, self._cmd, self._k_log = m, cmd, k_log
        if lanes == 1:
            self.count = C(1, 1)
            self.row_end = self.near == 1
        else:
            k = 1 << k_log
            to_beat_end = Signal(k_log + 1)
            self.count = Signal(range(lanes + 1))
            m.d.comb += to_beat_end.eq(k - self.lane)
            limit = Mux(to_beat_end < lanes, to_beat_end, lanes)
            m.d.comb += self.count.eq(Mux(self.near < limit, self.near, limit))
            # The step takes the rest of the row exactly when it fits the limit: near ≤ limit
            # is near == count without the count's mux before it.
            self.row_end = self.near <= limit
        self.last = self.row_end & self.final_row

    def _clamped(self, size):
        return Mux(size >= self._cap, self._cap, size)

    def start(self, cmd):
        """Statements for a new command (``cmd`` is the incoming payload, not yet latched)."""
        m = self._m
        m.d.sync += [self.rows_left.eq(cmd.y_size), self.left.eq(cmd.x_size), self.row_addr.eq(cmd.base),
                     self.near.eq(self._clamped(cmd.x_size)), self.final_row.eq(cmd.y_size == 1)]
        if self._k_log:
            m.d.sync += self.lane.eq(cmd.base[:self._k_log])

    def advance(self):
        """Statements for the current step's entries consumed."""
        m, cmd = self._m, self._cmd
        with m.If(self.row_end):
            next_addr = self.row_addr + cmd.x_stride
            m.d.sync += [self.rows_left.eq(self.rows_left - 1), self.left.eq(cmd.x_size),
                         self.row_addr.eq(next_addr), self.near.eq(self._clamped(cmd.x_size)),
                         self.final_row.eq(self.rows_left == 2)]
            if self._k_log:
                m.d.sync += self.lane.eq(next_addr[:self._k_log])
        with m.Else():
            # min(left - count, cap) without waiting on a wide subtract: whether left - count
            # stays at or above cap is a compare of left with a constant per possible count,
            # and below cap the difference fits the narrow width (left < cap + lanes ≤ 2·cap).
            width = len(self.near)
            stays = Array(self.left >= self._cap + n for n in range(self._lanes + 1))[self.count]
            m.d.sync += [self.left.eq(self.left - self.count),
                         self.near.eq(Mux(stays, self._cap, (self.left[:width] - self.count)[:width]))]
            if self._k_log:
                m.d.sync += self.lane.eq(self.lane + self.count)


def dma_lanes(entry_bytes, bus_bytes, lanes):
    """Check and default the group width of a reader/writer: a power of two up to a beat's entries."""
    _check_sizes(entry_bytes, bus_bytes)
    k = max(1, bus_bytes // entry_bytes)
    if lanes is None:
        return k
    if not isinstance(lanes, int) or lanes <= 0 or lanes & (lanes - 1) or lanes > k:
        raise TypeError(f"lanes must be a power of two from 1 to {k} (entries per beat), not {lanes!r}")
    return lanes


def refuse_unless_positive(value, what):
    """Refuse a non-positive-integer constructor argument (from a `check_arguments`)."""
    if not isinstance(value, int) or value < 1:
        raise TypeError(f"{what} must be a positive integer, not {value!r}")


class GroupDma(CheckedComponent):
    """What the reader and the writer share: entry and beat sizes, and the stream of
    entry groups (up to ``lanes`` entries) they exchange with the buffer side.
    ``members(group)`` gives the component's signature members for that stream."""

    @classmethod
    def check_arguments(cls, entry_bytes, bus_bytes, lanes, *args, **kwargs):
        dma_lanes(entry_bytes, bus_bytes, lanes)

    def __init__(self, entry_bytes, bus_bytes, lanes, members):
        self._lanes = dma_lanes(entry_bytes, bus_bytes, lanes)
        self._entry_bytes = entry_bytes
        self._bus_bytes = bus_bytes
        super().__init__(members(stream.Signature(group_layout(entry_bytes * 8, self._lanes))))

    @property
    def lanes(self):
        return self._lanes
