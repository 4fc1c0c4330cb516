"""LOAD of one buffer: a 2-D DMA read framed by zero padding, written to SRAM.

The padded tile is ``(y_pad0 + y_size + y_pad1)`` rows of
``pitch = x_pad0 + x_size + x_pad1`` entries, stored row-major from
``sram_base``, so its positions are consecutive SRAM entries. The writer walks
them a group of up to ``lanes`` entries per cycle (`buffer_lanes`: the entries
of one bus beat) through the buffer's group write port: a run of padding writes
zeros at once; a data run takes the next group from the DMA reader, which runs
ahead. A tile row's data run is exactly one DMA row, so the reader's groups
never straddle padding or a row end, and padding groups stop at the run's end.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import DMA_PAD_BITS, DMA_SIZE_BITS
from .axi import AxiReadSignature
from .banked import GroupWriteSignature, buffer_lanes
from .dma import DmaReader

__all__ = ["TileLoader", "load_command_layout"]


def load_command_layout(config):
    """The fields of a LOAD the tile loader needs (SRAM base as wide as any buffer index)."""
    return data.StructLayout({
        "sram_base": config.sram_addr_bits,
        "dram_base": 32,
        "y_size": DMA_SIZE_BITS, "x_size": DMA_SIZE_BITS, "x_stride": DMA_SIZE_BITS,
        "y_pad0": DMA_PAD_BITS, "y_pad1": DMA_PAD_BITS, "x_pad0": DMA_PAD_BITS, "x_pad1": DMA_PAD_BITS,
    })


class TileLoader(wiring.Component):
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
    busy, mem_stall : Out(1)
        ``mem_stall``: a data position waits for DRAM.
    """

    def __init__(self, config, buffer):
        if buffer not in ("inp", "wgt", "acc", "uop"):
            raise ValueError(f"LOAD targets inp, wgt, acc or uop, not {buffer!r}")
        self._config = config
        self._buffer = buffer
        self._entry_bytes = config.entry_bytes(buffer)
        self._lanes = buffer_lanes(config, buffer)
        super().__init__({
            "cmd": In(stream.Signature(load_command_layout(config))),
            "bus": Out(AxiReadSignature(config.bus_width)),
            "wr": Out(GroupWriteSignature(self._entry_bytes * 8, self._lanes,
                                          max(1, (config.depth(buffer) - 1).bit_length()))),
            "busy": Out(1),
            "mem_stall": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        m.submodules.reader = reader = DmaReader(self._entry_bytes, self._config.bus_bytes, lanes)
        wiring.connect(m, wiring.flipped(self.bus), reader.bus)

        cmd = Signal(load_command_layout(self._config))
        rows = Signal(DMA_SIZE_BITS + 1)
        pitch = Signal(DMA_SIZE_BITS + 1)
        m.d.comb += [rows.eq(cmd.y_pad0 + cmd.y_size + cmd.y_pad1),
                     pitch.eq(cmd.x_pad0 + cmd.x_size + cmd.x_pad1)]
        r = Signal(DMA_SIZE_BITS + 1)
        c = Signal(DMA_SIZE_BITS + 1)
        addr = Signal(len(self.wr.addr))
        has_data = (cmd.y_size != 0) & (cmd.x_size != 0)

        m.d.comb += [
            reader.cmd.p.base.eq(cmd.dram_base),
            reader.cmd.p.y_size.eq(cmd.y_size),
            reader.cmd.p.x_size.eq(cmd.x_size),
            reader.cmd.p.x_stride.eq(cmd.x_stride),
            self.wr.addr.eq(addr),
        ]
        data_row = (r >= cmd.y_pad0) & (r < cmd.y_pad0 + cmd.y_size)
        data_end = cmd.x_pad0 + cmd.x_size
        is_data = data_row & (c >= cmd.x_pad0) & (c < data_end)
        # A padding run ends at the data (left padding of a data row) or at the row's end.
        run_end = Mux(data_row & (c < cmd.x_pad0), cmd.x_pad0, pitch)
        pad_left = Signal(DMA_SIZE_BITS + 1)
        count = Signal(range(lanes + 1))
        m.d.comb += [
            pad_left.eq(run_end - c),
            count.eq(Mux(is_data, reader.out.p.count, Mux(pad_left < lanes, pad_left, lanes))),
        ]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    m.d.sync += [cmd.eq(self.cmd.p), r.eq(0), c.eq(0), addr.eq(self.cmd.p.sram_base)]
                    m.next = "START"
            with m.State("START"):
                m.d.comb += [self.busy.eq(1), reader.cmd.valid.eq(has_data)]
                with m.If((rows == 0) | (pitch == 0)):
                    m.next = "IDLE"
                with m.Elif(~has_data | reader.cmd.ready):
                    m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += [
                    self.busy.eq(1),
                    reader.out.ready.eq(is_data),
                    self.wr.count.eq(count),
                    self.wr.en.eq(~is_data | reader.out.valid),
                    self.mem_stall.eq(is_data & ~reader.out.valid),
                ]
                with m.If(is_data):
                    m.d.comb += self.wr.data.eq(reader.out.p.entries)
                with m.If(self.wr.en):
                    m.d.sync += addr.eq(addr + count)
                    with m.If(c + count == pitch):
                        m.d.sync += [c.eq(0), r.eq(r + 1)]
                        with m.If(r + 1 == rows):
                            m.next = "IDLE"
                    with m.Else():
                        m.d.sync += c.eq(c + count)
        return m
