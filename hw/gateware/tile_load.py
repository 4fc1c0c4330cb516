"""LOAD of one buffer: a 2-D DMA read framed by zero padding, written to SRAM.

The padded tile is ``(y_pad0 + y_size + y_pad1)`` rows of
``pitch = x_pad0 + x_size + x_pad1`` entries, stored row-major from
``sram_base``, so its positions are consecutive SRAM entries. The writer walks
them a group of up to ``lanes`` entries per cycle (`buffer_lanes`: the entries
of one bus beat) through the buffer's group write port: a run of padding writes
zeros at once; a data run takes the next group from the DMA reader, which runs
ahead. A tile row's data run is exactly one DMA row, so the reader's groups
never straddle padding or a row end, and padding groups stop at the run's end.

Commands pipeline: a command goes to the DMA reader as soon as it is accepted
and waits in a small queue for the writer, which takes it in the cycle the
previous tile's last position is written. So a LOAD's bursts go out while the
previous LOAD's data still arrives, and ``done`` marks each tile's end in order.
"""

from amaranth import *
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import Opcode, fields_of
from .axi import AxiReadSignature
from .banked import GroupWriteSignature, buffer_lanes
from .checked import CheckedComponent
from .dma import dma_command_from, refuse_unless_positive
from .dma_read import DmaReader

__all__ = ["TileLoader", "load_command_layout"]


class _Section(enum.Enum, shape=2):
    """The tile writer's section of rows: padding above, data rows, padding below, done."""
    TOP = 0
    MID = 1
    BOT = 2
    DONE = 3


class _Run(enum.Enum, shape=2):
    """The tile writer's run within a row: a data row's left padding, data, right padding,
    or a whole padding row."""
    LEFT = 0
    DATA = 1
    RIGHT = 2
    FULL = 3


def load_command_layout(config):
    """The fields of a LOAD the tile loader needs: the ISA's LOAD fields from ``sram_base`` on
    (SRAM base, the DRAM transfer, the padding), with the ISA's widths."""
    fields = fields_of(config, Opcode.LOAD)
    first = [f.name for f in fields].index("sram_base")
    return data.StructLayout({f.name: f.width for f in fields[first:]})


def _facts_layout():
    """What the tile walk decides on, worked out from a command's fields as it is accepted
    (`_facts_of`): which sizes are non-zero, which padding runs fit one group (``_fits``:
    at most ``lanes`` positions) and which section sizes are 1."""
    return data.StructLayout({
        "x_pad0_nonzero": 1, "x_size_nonzero": 1, "x_pad1_nonzero": 1, "pitch_nonzero": 1,
        "y_size_nonzero": 1, "y_pad1_nonzero": 1,
        "x_pad0_fits": 1, "x_pad1_fits": 1, "pitch_fits": 1, "y_size_one": 1, "y_pad1_one": 1})


def _facts_of(fields, pitch, lanes):
    """The `_facts_layout` view of a command's ``fields`` and ``pitch`` (``lanes``: entries
    per group write)."""
    members = _facts_layout().members
    values = {
        "x_pad0_nonzero": fields.x_pad0 != 0, "x_size_nonzero": fields.x_size != 0,
        "x_pad1_nonzero": fields.x_pad1 != 0, "pitch_nonzero": pitch != 0,
        "y_size_nonzero": fields.y_size != 0, "y_pad1_nonzero": fields.y_pad1 != 0,
        "x_pad0_fits": fields.x_pad0 <= lanes, "x_pad1_fits": fields.x_pad1 <= lanes, "pitch_fits": pitch <= lanes,
        "y_size_one": fields.y_size == 1, "y_pad1_one": fields.y_pad1 == 1,
    }
    return data.View(_facts_layout(), Cat(*(values[name] for name in members)))


def _first_run(fields, facts, row_pitch, data_row):
    """(run, length, the length fits one group) of a row's first run: a padding row's whole
    pitch, else the first non-empty run of a data row (the right padding when there is no
    other). ``facts`` are the fields' `_facts_layout`."""
    run = Mux(data_row, Mux(facts.x_pad0_nonzero, _Run.LEFT, Mux(facts.x_size_nonzero, _Run.DATA, _Run.RIGHT)),
              _Run.FULL)
    length = Mux(data_row, Mux(facts.x_pad0_nonzero, fields.x_pad0,
                               Mux(facts.x_size_nonzero, fields.x_size, fields.x_pad1)), row_pitch)
    fits = Mux(data_row, Mux(facts.x_pad0_nonzero, facts.x_pad0_fits,
                             Mux(facts.x_size_nonzero, 0, facts.x_pad1_fits)), facts.pitch_fits)
    return run, length, fits


def _first_section(fields, facts, after):
    """(section, rows, rows == 1) of the first non-empty section after ``after`` (None: from
    the start, where ``y_pad0`` is compared here: a walk never returns to the top section);
    `_Section.DONE` when none is left."""
    order = [(_Section.TOP, fields.y_pad0, fields.y_pad0 != 0, fields.y_pad0 == 1),
             (_Section.MID, fields.y_size, facts.y_size_nonzero, facts.y_size_one),
             (_Section.BOT, fields.y_pad1, facts.y_pad1_nonzero, facts.y_pad1_one)]
    if after is not None:
        order = order[[s for s, *_ in order].index(after) + 1:]
    section, rows, one = C(_Section.DONE.value, _Section), C(0, len(fields.y_size)), C(0, 1)
    for name, size, nonzero, size_one in reversed(order):
        section, rows, one = Mux(nonzero, name, section), Mux(nonzero, size, rows), Mux(nonzero, size_one, one)
    return section, rows, one


class TileLoader(CheckedComponent):
    """Executes LOADs into one buffer.

    Parameters
    ----------
    config : AccelConfig
    buffer : str
        'inp', 'wgt', 'acc' or 'uop'.

    Attributes
    ----------
    cmd : In(stream of load_command_layout)
    bus : Out(AxiReadSignature)
    wr : Out(GroupWriteSignature)
        The buffer's group write port (entry index modulo the buffer depth;
        ``lanes`` = `buffer_lanes`).
    done : Out(1)
        Pulses once per command, in order, in the cycle its last position is
        written (a tile without positions: a cycle after the writer takes it).
    busy, mem_stall : Out(1)
        ``busy``: a command is in flight. ``mem_stall``: a data position waits for DRAM.
    depth : int
        Commands in flight (accepted, not yet written).
    cmd_has_data : In(1), only with ``cmd_has_data=True``
        ``cmd.p``'s ``y_size != 0 and x_size != 0``, which the caller then gives from a
        register, where it is otherwise worked out here: the zero tests then lie off the path
        from the command to ``cmd.ready`` (the load engine's launch, and from it its
        pending-push queue's write, was one of tiny's longest paths on the ECP5).
    """

    @classmethod
    def check_arguments(cls, config, buffer, depth=4, cmd_has_data=False):
        refuse_unless_positive(depth, "Command depth")
        if buffer not in ("inp", "wgt", "acc", "uop"):
            raise ValueError(f"LOAD targets inp, wgt, acc or uop, not {buffer!r}")

    def __init__(self, config, buffer, depth=4, cmd_has_data=False):
        self._depth = depth
        self._has_data_given = cmd_has_data
        self._config = config
        self._buffer = buffer
        self._entry_bytes = config.entry_bytes(buffer)
        self._lanes = buffer_lanes(config, buffer)
        super().__init__({
            "cmd": In(stream.Signature(load_command_layout(config))),
            "bus": Out(AxiReadSignature(config.bus_width)),
            "wr": Out(GroupWriteSignature(self._entry_bytes * 8, self._lanes,
                                          max(1, (config.depth(buffer) - 1).bit_length()))),
            "done": Out(1),
            "busy": Out(1),
            "mem_stall": Out(1),
            **({"cmd_has_data": In(1)} if cmd_has_data else {}),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        layout = load_command_layout(self._config)
        m.submodules.reader = reader = DmaReader(self._entry_bytes, self._config.bus_bytes, lanes,
                                                 depth=self._depth)
        wiring.connect(m, wiring.flipped(self.bus), reader.bus)

        # Writer: walks the padded tile of `cmd` while ``active``, run by run. A tile is up to
        # three sections of rows (y_pad0 padding rows, y_size data rows, y_pad1 padding rows); a
        # padding row is one run of `pitch` zeros, a data row up to three runs (x_pad0 zeros,
        # x_size entries from the reader, x_pad1 zeros); empty sections and runs are skipped.
        # Sections and runs are counted down in registers, and every choice of what follows is
        # made from flags worked out as the command entered the queue (`_Facts`: which fields
        # are zero, which padding runs fit one group, which counts are 1), so no command field's
        # compare lies between a register and the write: the tile walk's compares of its
        # counters and fields were among the design's longest paths on the ECP5. A data run
        # ends on the reader's ``row_end`` (a tile row's data run is one DMA row), a padding run
        # on `pad_last`, kept for the run's current `left`.
        cmd = Signal(layout)
        facts = Signal(_facts_layout())
        active = Signal()
        empty = Signal()        # the tile has no positions
        pitch = Signal(len(cmd.x_size) + 1)     # a size plus two pads
        addr = Signal(len(self.wr.addr))
        m.d.comb += self.wr.addr.eq(addr)

        section = Signal(_Section)
        rows_left = Signal(len(cmd.y_size))     # rows of `section` left, this one included
        final_row = Signal()                    # rows_left == 1 (a flip-flop, off the compare)
        run = Signal(_Run)
        left = Signal(len(pitch))               # positions of a padding `run` left
        pad_last = Signal()                     # left <= lanes: this group ends the padding run

        # Accept: the data part (if any) to the reader, the whole command to the writer's queue
        # together with its facts and where its walk starts. That start is computed here, as
        # the command enters the queue, so the writer takes a command by loading registers
        # from the queue: the pitch's adds and the section and run choices sat between the
        # queue's read and the walk's registers, on the path from the previous tile's last write.
        start_layout = data.StructLayout({
            "cmd": layout, "facts": _facts_layout(), "pitch": len(pitch), "section": _Section,
            "rows": len(rows_left), "final_row": 1, "run": _Run, "left": len(left), "pad_last": 1, "empty": 1})
        m.submodules.queue = queue = fifo.SyncFIFO(width=start_layout.size, depth=self._depth)
        incoming = self.cmd.p
        incoming_data = (self.cmd_has_data if self._has_data_given
                         else (incoming.y_size != 0) & (incoming.x_size != 0))
        entering = data.View(start_layout, queue.w_data)
        incoming_pitch = incoming.x_pad0 + incoming.x_size + incoming.x_pad1
        incoming_facts = _facts_of(incoming, incoming_pitch, lanes)
        start_section, start_rows, start_final = _first_section(incoming, incoming_facts, None)
        start_run, start_left, start_pad_last = _first_run(incoming, incoming_facts, incoming_pitch,
                                                           start_section == _Section.MID)
        m.d.comb += [
            *dma_command_from(reader.cmd.p, incoming),
            reader.cmd.valid.eq(self.cmd.valid & queue.w_rdy & incoming_data),
            self.cmd.ready.eq(queue.w_rdy & (~incoming_data | reader.cmd.ready)),
            entering.cmd.eq(incoming), entering.facts.eq(incoming_facts), entering.pitch.eq(incoming_pitch),
            entering.section.eq(start_section), entering.rows.eq(start_rows), entering.final_row.eq(start_final),
            entering.run.eq(start_run), entering.left.eq(start_left), entering.pad_last.eq(start_pad_last),
            entering.empty.eq((start_section == _Section.DONE) | ~incoming_facts.pitch_nonzero),
            queue.w_en.eq(self.cmd.valid & self.cmd.ready),
        ]

        is_data = run == _Run.DATA
        count = Signal(range(lanes + 1))
        m.d.comb += count.eq(Mux(is_data, reader.out.p.count, Mux(pad_last, left, lanes)))
        run_end = Mux(is_data, reader.out.p.row_end, pad_last)

        writing = active & ~empty
        with m.If(writing):
            m.d.comb += [
                reader.out.ready.eq(is_data),
                self.wr.count.eq(count),
                self.wr.en.eq(~is_data | reader.out.valid),
                self.mem_stall.eq(is_data & ~reader.out.valid),
            ]
            with m.If(is_data):
                m.d.comb += self.wr.data.eq(reader.out.p.entries)
        with m.If(active & empty):
            m.d.comb += self.done.eq(1)

        def begin_run(value, length, length_pad_last):
            m.d.sync += [run.eq(value), left.eq(length), pad_last.eq(length_pad_last)]

        with m.If(self.wr.en):
            m.d.sync += addr.eq(addr + count)
            with m.If(~run_end):
                # Only a padding run counts down here (a data run ends on the reader's row_end).
                m.d.sync += [left.eq(left - lanes), pad_last.eq(left <= 2 * lanes)]
            with m.Else():
                # The next run of this row, if any; else the next row.
                row_end = Signal()
                with m.Switch(run):
                    with m.Case(_Run.LEFT):
                        with m.If(facts.x_size_nonzero):
                            begin_run(_Run.DATA, cmd.x_size, 0)
                        with m.Elif(facts.x_pad1_nonzero):
                            begin_run(_Run.RIGHT, cmd.x_pad1, facts.x_pad1_fits)
                        with m.Else():
                            m.d.comb += row_end.eq(1)
                    with m.Case(_Run.DATA):
                        with m.If(facts.x_pad1_nonzero):
                            begin_run(_Run.RIGHT, cmd.x_pad1, facts.x_pad1_fits)
                        with m.Else():
                            m.d.comb += row_end.eq(1)
                    with m.Default():
                        m.d.comb += row_end.eq(1)
                with m.If(row_end):
                    with m.If(~final_row):
                        m.d.sync += [rows_left.eq(rows_left - 1), final_row.eq(rows_left == 2)]
                        begin_run(*_first_run(cmd, facts, pitch, section == _Section.MID))
                    with m.Else():
                        with m.Switch(section):
                            for current in (_Section.TOP, _Section.MID, _Section.BOT):
                                with m.Case(current):
                                    following, rows, final = _first_section(cmd, facts, current)
                                    m.d.sync += [section.eq(following), rows_left.eq(rows), final_row.eq(final)]
                                    begin_run(*_first_run(cmd, facts, pitch, following == _Section.MID))
                                    with m.If(following == _Section.DONE):
                                        m.d.comb += self.done.eq(1)
        with m.If(self.done):
            m.d.sync += active.eq(0)
        with m.If(queue.r_rdy & (~active | self.done)):
            following = data.View(start_layout, queue.r_data)
            m.d.comb += queue.r_en.eq(1)
            m.d.sync += [
                cmd.eq(following.cmd), facts.eq(following.facts), active.eq(1),
                addr.eq(following.cmd.sram_base), pitch.eq(following.pitch),
                section.eq(following.section), rows_left.eq(following.rows), final_row.eq(following.final_row),
                run.eq(following.run), left.eq(following.left), pad_last.eq(following.pad_last),
                empty.eq(following.empty),
            ]

        m.d.comb += self.busy.eq(active | queue.r_rdy | reader.busy)
        return m
