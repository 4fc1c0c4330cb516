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
from ..microarch import buffer_lanes
from .axi import AxiReadSignature
from .banked import GroupWriteSignature
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
        ``busy``: a command is in flight. ``mem_stall``: in the cycle before, a data position
        waited for DRAM or the bus request for its grant (a counter event: made from registers
        of its raw signals, each beside its source, since on the ECP5 the loaders, their readers
        and the arbiter's grants lie far apart and a path through their logic into one register
        of the stall took 12.9 ns, 11 of it routes).
    depth : int
        Commands in flight (accepted, not yet written).
    """

    @classmethod
    def check_arguments(cls, config, buffer, depth=4):
        refuse_unless_positive(depth, "Command depth")
        if buffer not in ("inp", "wgt", "acc", "uop"):
            raise ValueError(f"LOAD targets inp, wgt, acc or uop, not {buffer!r}")

    def __init__(self, config, buffer, depth=4):
        self._depth = depth
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
        # Sections and runs are counted down in registers, and what follows each is chosen
        # from registered fields, so no command field's arithmetic lies between a register and
        # the write (the tile walk was the design's longest path when it compared positions).
        cmd = Signal(layout)
        active = Signal()
        empty = Signal()        # the tile has no positions
        pitch = Signal(len(cmd.x_size) + 1)     # a size plus two pads
        addr = Signal(len(self.wr.addr))
        m.d.comb += self.wr.addr.eq(addr)

        section = Signal(_Section)
        rows_left = Signal(len(cmd.y_size))     # rows of `section` left, this one included
        final_row = Signal()                    # rows_left == 1 (a flip-flop, off the compare)
        run = Signal(_Run)
        left = Signal(len(pitch))               # positions of `run` left

        def first_run(fields, row_pitch, data_row):
            """(run, length) of a row's first run: a padding row's whole pitch, else the first
            non-empty run of a data row."""
            return (Mux(data_row, Mux(fields.x_pad0 != 0, _Run.LEFT, Mux(fields.x_size != 0, _Run.DATA, _Run.RIGHT)),
                        _Run.FULL),
                    Mux(data_row, Mux(fields.x_pad0 != 0, fields.x_pad0,
                                      Mux(fields.x_size != 0, fields.x_size, fields.x_pad1)), row_pitch))

        def first_section(fields, after):
            """(section, rows) of the first non-empty section after ``after`` (None: from the
            start); `_Section.DONE` when none is left."""
            order = [(_Section.TOP, fields.y_pad0), (_Section.MID, fields.y_size), (_Section.BOT, fields.y_pad1)]
            if after is not None:
                order = order[[s for s, _ in order].index(after) + 1:]
            section_value, rows_value = C(_Section.DONE.value, _Section), C(0, len(cmd.y_size))
            for name, rows in reversed(order):
                section_value = Mux(rows != 0, name, section_value)
                rows_value = Mux(rows != 0, rows, rows_value)
            return section_value, rows_value

        # Accept: the data part (if any) to the reader, the whole command to the writer's queue
        # together with where its walk starts. That start is computed here, as the command
        # enters the queue, so the writer takes a command by loading registers from the queue:
        # the pitch's adds and the section and run choices sat between the queue's read and the
        # walk's registers, on the path from the previous tile's last write.
        start_layout = data.StructLayout({
            "cmd": layout, "pitch": len(pitch), "section": _Section, "rows": len(rows_left), "final_row": 1,
            "run": _Run, "left": len(left), "empty": 1})
        m.submodules.queue = queue = fifo.SyncFIFO(width=start_layout.size, depth=self._depth)
        incoming = self.cmd.p
        incoming_data = (incoming.y_size != 0) & (incoming.x_size != 0)
        entering = data.View(start_layout, queue.w_data)
        incoming_pitch = incoming.x_pad0 + incoming.x_size + incoming.x_pad1
        start_section, start_rows = first_section(incoming, None)
        start_run, start_left = first_run(incoming, incoming_pitch, start_section == _Section.MID)
        m.d.comb += [
            *dma_command_from(reader.cmd.p, incoming),
            reader.cmd.valid.eq(self.cmd.valid & queue.w_rdy & incoming_data),
            self.cmd.ready.eq(queue.w_rdy & (~incoming_data | reader.cmd.ready)),
            entering.cmd.eq(incoming), entering.pitch.eq(incoming_pitch),
            entering.section.eq(start_section), entering.rows.eq(start_rows),
            entering.final_row.eq(start_rows == 1), entering.run.eq(start_run), entering.left.eq(start_left),
            entering.empty.eq((start_section == _Section.DONE) | (incoming_pitch == 0)),
            queue.w_en.eq(self.cmd.valid & self.cmd.ready),
        ]

        is_data = run == _Run.DATA
        pad_count = Mux(left < lanes, left, lanes)
        count = Signal(range(lanes + 1))
        m.d.comb += count.eq(Mux(is_data, reader.out.p.count, pad_count))
        run_end = Mux(is_data, left == reader.out.p.count, left <= lanes)

        writing = active & ~empty
        with m.If(writing):
            m.d.comb += [
                reader.out.ready.eq(is_data),
                self.wr.count.eq(count),
                self.wr.en.eq(~is_data | reader.out.valid),
            ]
            with m.If(is_data):
                m.d.comb += self.wr.data.eq(reader.out.p.entries)
        with m.If(active & empty):
            m.d.comb += self.done.eq(1)
        with m.If(self.wr.en):
            m.d.sync += [addr.eq(addr + count), left.eq(left - count)]
            with m.If(run_end):
                # The next run of this row, if any; else the next row.
                row_end = Signal()
                with m.Switch(run):
                    with m.Case(_Run.LEFT):
                        with m.If(cmd.x_size != 0):
                            m.d.sync += [run.eq(_Run.DATA), left.eq(cmd.x_size)]
                        with m.Elif(cmd.x_pad1 != 0):
                            m.d.sync += [run.eq(_Run.RIGHT), left.eq(cmd.x_pad1)]
                        with m.Else():
                            m.d.comb += row_end.eq(1)
                    with m.Case(_Run.DATA):
                        with m.If(cmd.x_pad1 != 0):
                            m.d.sync += [run.eq(_Run.RIGHT), left.eq(cmd.x_pad1)]
                        with m.Else():
                            m.d.comb += row_end.eq(1)
                    with m.Default():
                        m.d.comb += row_end.eq(1)
                with m.If(row_end):
                    with m.If(~final_row):
                        next_run, next_left = first_run(cmd, pitch, section == _Section.MID)
                        m.d.sync += [rows_left.eq(rows_left - 1), final_row.eq(rows_left == 2),
                                     run.eq(next_run), left.eq(next_left)]
                    with m.Else():
                        with m.Switch(section):
                            for current in (_Section.TOP, _Section.MID, _Section.BOT):
                                with m.Case(current):
                                    following_section, following_rows = first_section(cmd, current)
                                    next_run, next_left = first_run(cmd, pitch, following_section == _Section.MID)
                                    m.d.sync += [section.eq(following_section), rows_left.eq(following_rows),
                                                 final_row.eq(following_rows == 1),
                                                 run.eq(next_run), left.eq(next_left)]
                                    with m.If(following_section == _Section.DONE):
                                        m.d.comb += self.done.eq(1)
        with m.If(self.done):
            m.d.sync += active.eq(0)
        with m.If(queue.r_rdy & (~active | self.done)):
            following = data.View(start_layout, queue.r_data)
            m.d.comb += queue.r_en.eq(1)
            m.d.sync += [
                cmd.eq(following.cmd), active.eq(1), addr.eq(following.cmd.sram_base), pitch.eq(following.pitch),
                section.eq(following.section), rows_left.eq(following.rows), final_row.eq(following.final_row),
                run.eq(following.run), left.eq(following.left), empty.eq(following.empty),
            ]

        data_wait, data_valid, bus_req, bus_gnt = (Signal(name=name) for name in
                                                   ("data_wait", "data_valid", "bus_req", "bus_gnt"))
        m.d.sync += [data_wait.eq(writing & is_data), data_valid.eq(reader.out.valid),
                     bus_req.eq(self.bus.req), bus_gnt.eq(self.bus.gnt)]
        m.d.comb += [self.busy.eq(active | queue.r_rdy | reader.busy),
                     self.mem_stall.eq((data_wait & ~data_valid) | (bus_req & ~bus_gnt))]
        return m
