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
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import Opcode, fields_of
from .axi import AxiReadSignature
from .banked import GroupWriteSignature, buffer_lanes
from .checked import CheckedComponent
from .dma import dma_command_from, refuse_unless_positive
from .dma_read import DmaReader

__all__ = ["TileLoader", "load_command_layout"]


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
        ``busy``: a command is in flight. ``mem_stall``: a data position waits for DRAM.
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
        m.submodules.queue = queue = fifo.SyncFIFO(width=layout.size, depth=self._depth)

        # Accept: the data part (if any) to the reader, the whole command to the writer's queue.
        incoming = self.cmd.p
        incoming_data = (incoming.y_size != 0) & (incoming.x_size != 0)
        m.d.comb += [
            *dma_command_from(reader.cmd.p, incoming),
            reader.cmd.valid.eq(self.cmd.valid & queue.w_rdy & incoming_data),
            self.cmd.ready.eq(queue.w_rdy & (~incoming_data | reader.cmd.ready)),
            queue.w_data.eq(incoming),
            queue.w_en.eq(self.cmd.valid & self.cmd.ready),
        ]

        # Writer: walks the padded tile of `cmd` while ``active``.
        cmd = Signal(layout)
        active = Signal()
        empty = Signal()        # the tile has no positions
        rows = Signal(len(cmd.y_size) + 1)      # a size plus two pads
        pitch = Signal(len(cmd.x_size) + 1)
        m.d.comb += [rows.eq(cmd.y_pad0 + cmd.y_size + cmd.y_pad1),
                     pitch.eq(cmd.x_pad0 + cmd.x_size + cmd.x_pad1)]
        r = Signal.like(rows)
        c = Signal.like(pitch)
        addr = Signal(len(self.wr.addr))
        m.d.comb += self.wr.addr.eq(addr)

        data_row = (r >= cmd.y_pad0) & (r < cmd.y_pad0 + cmd.y_size)
        data_end = cmd.x_pad0 + cmd.x_size
        is_data = data_row & (c >= cmd.x_pad0) & (c < data_end)
        # A padding run ends at the data (left padding of a data row) or at the row's end.
        run_end = Mux(data_row & (c < cmd.x_pad0), cmd.x_pad0, pitch)
        pad_left = Signal.like(pitch)
        count = Signal(range(lanes + 1))
        m.d.comb += [
            pad_left.eq(run_end - c),
            count.eq(Mux(is_data, reader.out.p.count, Mux(pad_left < lanes, pad_left, lanes))),
        ]

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
        with m.If(self.wr.en):
            m.d.sync += addr.eq(addr + count)
            with m.If(c + count == pitch):
                m.d.sync += [c.eq(0), r.eq(r + 1)]
                with m.If(r + 1 == rows):
                    m.d.comb += self.done.eq(1)
            with m.Else():
                m.d.sync += c.eq(c + count)
        with m.If(self.done):
            m.d.sync += active.eq(0)
        with m.If(queue.r_rdy & (~active | self.done)):
            following = data.View(layout, queue.r_data)
            m.d.comb += queue.r_en.eq(1)
            m.d.sync += [
                cmd.eq(following), active.eq(1), r.eq(0), c.eq(0), addr.eq(following.sram_base),
                empty.eq((following.y_pad0 + following.y_size + following.y_pad1 == 0) |
                         (following.x_pad0 + following.x_size + following.x_pad1 == 0)),
            ]

        m.d.comb += self.busy.eq(active | queue.r_rdy | reader.busy)
        return m
