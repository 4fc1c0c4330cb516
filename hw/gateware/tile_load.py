"""LOAD of one buffer: a 2-D DMA read framed by zero padding, written to SRAM.

The padded tile is ``(y_pad0 + y_size + y_pad1)`` rows of
``pitch = x_pad0 + x_size + x_pad1`` entries, stored row-major from
``sram_base``, so its positions are consecutive SRAM entries. The writer walks
them one per cycle: a padding position writes zero at once; a data position
waits for the next entry from the DMA reader, which runs ahead.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import DMA_PAD_BITS, DMA_SIZE_BITS
from .axi import AxiReadSignature
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
    wr_addr, wr_data, wr_en : Out
        SRAM write port (entry index modulo the buffer depth).
    busy, mem_stall : Out(1)
        ``mem_stall``: a data position waits for DRAM.
    """

    def __init__(self, config, buffer):
        if buffer not in ("inp", "wgt", "acc", "uop"):
            raise ValueError(f"LOAD targets inp, wgt, acc or uop, not {buffer!r}")
        self._config = config
        self._buffer = buffer
        self._entry_bytes = config.entry_bytes(buffer)
        depth = config.depth(buffer)
        super().__init__({
            "cmd": In(stream.Signature(load_command_layout(config))),
            "bus": Out(AxiReadSignature(config.bus_width)),
            "wr_addr": Out(max(1, (depth - 1).bit_length())),
            "wr_data": Out(self._entry_bytes * 8),
            "wr_en": Out(1),
            "busy": Out(1),
            "mem_stall": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.reader = reader = DmaReader(self._entry_bytes, self._config.bus_bytes)
        wiring.connect(m, wiring.flipped(self.bus), reader.bus)

        cmd = Signal(load_command_layout(self._config))
        rows = Signal(DMA_SIZE_BITS + 1)
        pitch = Signal(DMA_SIZE_BITS + 1)
        m.d.comb += [rows.eq(cmd.y_pad0 + cmd.y_size + cmd.y_pad1),
                     pitch.eq(cmd.x_pad0 + cmd.x_size + cmd.x_pad1)]
        r = Signal(DMA_SIZE_BITS + 1)
        c = Signal(DMA_SIZE_BITS + 1)
        addr = Signal(len(self.wr_addr))
        has_data = (cmd.y_size != 0) & (cmd.x_size != 0)

        m.d.comb += [
            reader.cmd.p.base.eq(cmd.dram_base),
            reader.cmd.p.y_size.eq(cmd.y_size),
            reader.cmd.p.x_size.eq(cmd.x_size),
            reader.cmd.p.x_stride.eq(cmd.x_stride),
            self.wr_addr.eq(addr),
        ]
        is_data = ((r >= cmd.y_pad0) & (r < cmd.y_pad0 + cmd.y_size) &
                   (c >= cmd.x_pad0) & (c < cmd.x_pad0 + cmd.x_size))

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
                    self.wr_data.eq(Mux(is_data, reader.out.p, 0)),
                    self.wr_en.eq(~is_data | reader.out.valid),
                    self.mem_stall.eq(is_data & ~reader.out.valid),
                ]
                with m.If(self.wr_en):
                    m.d.sync += addr.eq(addr + 1)
                    with m.If(c + 1 == pitch):
                        m.d.sync += [c.eq(0), r.eq(r + 1)]
                        with m.If(r + 1 == rows):
                            m.next = "IDLE"
                    with m.Else():
                        m.d.sync += c.eq(c + 1)
        return m
