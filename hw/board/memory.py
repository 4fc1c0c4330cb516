"""The board memory: block RAM standing in for DRAM, an AXI4 slave plus a byte port.

`AxiMemory` serves the accelerator's AXI4 master (`Axi4Signature`): incrementing
bursts of full-width beats, one read and one write burst at a time (reads and
writes proceed independently), IDs echoed, one beat per cycle. Beats at or
beyond ``size_bytes`` are answered SLVERR (their writes are dropped, their
reads return garbage), so a program that strays outside the board memory ends
with the accelerator's BUS_ERROR fault instead of aliasing.

The byte port (`BytePortSignature`, for the UART bridge) reads and writes one
byte per cycle through the same RAM: a separate read port, and the write port
shared with the AXI write channel, where the byte port wins (``wready`` drops
for that cycle). The byte port does not check its address: its user does.
"""

from amaranth import *
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..gateware.axi import Axi4Signature
from ..gateware.checked import CheckedComponent

__all__ = ["AxiMemory", "BytePortSignature", "RESP_SLVERR"]

#: AXI response code of an access beyond the memory.
RESP_SLVERR = 2


class BytePortSignature(wiring.Signature):
    """A byte-wide memory port, seen from its user: ``r_data`` holds the byte at ``addr``
    the cycle after ``r_en``; ``w_en`` writes ``w_data`` at ``addr``."""

    def __init__(self, addr_bits):
        if not isinstance(addr_bits, int) or addr_bits < 1:
            raise ValueError(f"Address width must be a positive integer, not {addr_bits!r}")
        super().__init__({"addr": Out(addr_bits), "r_en": Out(1), "r_data": In(8),
                          "w_en": Out(1), "w_data": Out(8)})


class AxiMemory(CheckedComponent):
    """Parameters
    ----------
    data_bits : int
        The AXI data width (32 to 1024).
    size_bytes : int
        Memory size: a power of two, at least one beat.
    id_bits : int
        The AXI ID width of the master.

    Attributes
    ----------
    axi : In(Axi4Signature(data_bits, id_bits))
    bytes : In(BytePortSignature(log2(size_bytes)))
    """

    @classmethod
    def check_arguments(cls, data_bits, size_bytes, id_bits):
        beat = data_bits // 8 if isinstance(data_bits, int) else 0
        if not isinstance(size_bytes, int) or size_bytes < max(beat, 1) or size_bytes & (size_bytes - 1):
            raise ValueError(f"Memory size must be a power of two of at least one bus beat, not {size_bytes!r}")

    def __init__(self, data_bits, size_bytes, id_bits):
        self._data_bits = data_bits
        self._size_bytes = size_bytes
        super().__init__({"axi": In(Axi4Signature(data_bits, id_bits)),
                          "bytes": In(BytePortSignature(exact_log2(size_bytes)))})

    @property
    def size_bytes(self):
        return self._size_bytes

    @property
    def data_bits(self):
        return self._data_bits

    def elaborate(self, platform):
        m = Module()
        beat = self._data_bits // 8
        lane_bits = exact_log2(beat)
        depth = self._size_bytes // beat
        axi, byte = self.axi, self.bytes
        m.submodules.mem = mem = memory.Memory(shape=unsigned(self._data_bits), depth=depth, init=[])
        wr = mem.write_port(granularity=8)
        rd = mem.read_port()
        brd = mem.read_port()

        def word(address):
            return address[lane_bits:lane_bits + exact_log2(depth)] if depth > 1 else C(0, 1)

        def in_range(address):
            return address < self._size_bytes

        # ------------------------------------------------------------ byte port
        lane = Signal(max(lane_bits, 1))
        m.d.comb += [brd.addr.eq(word(byte.addr)), brd.en.eq(byte.r_en)]
        with m.If(byte.r_en):
            m.d.sync += lane.eq(byte.addr[:lane_bits] if lane_bits else 0)
        m.d.comb += byte.r_data.eq(brd.data.word_select(lane, 8) if lane_bits else brd.data)

        # ------------------------------------------------------------ reads
        raddr = Signal.like(axi.araddr)
        rleft = Signal(8)
        rid = Signal.like(axi.arid)
        next_raddr = raddr + beat
        with m.FSM(name="read"):
            with m.State("IDLE"):
                m.d.comb += axi.arready.eq(1)
                with m.If(axi.arvalid):
                    m.d.sync += [raddr.eq(axi.araddr), rleft.eq(axi.arlen), rid.eq(axi.arid)]
                    m.next = "FETCH"
            with m.State("FETCH"):
                m.d.comb += [rd.addr.eq(word(raddr)), rd.en.eq(1)]
                m.next = "BEAT"
            with m.State("BEAT"):
                # The beat at raddr is on rd.data; while it is taken, read the next one.
                m.d.comb += [axi.rvalid.eq(1), axi.rdata.eq(rd.data), axi.rid.eq(rid),
                             axi.rlast.eq(rleft == 0), axi.rresp.eq(Mux(in_range(raddr), 0, RESP_SLVERR)),
                             rd.addr.eq(word(next_raddr)), rd.en.eq(axi.rready)]
                with m.If(axi.rready):
                    with m.If(rleft == 0):
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [raddr.eq(next_raddr), rleft.eq(rleft - 1)]

        # ------------------------------------------------------------ writes
        waddr = Signal.like(axi.awaddr)
        wid = Signal.like(axi.awid)
        werr = Signal()
        with m.FSM(name="write"):
            with m.State("IDLE"):
                m.d.comb += axi.awready.eq(1)
                with m.If(axi.awvalid):
                    m.d.sync += [waddr.eq(axi.awaddr), wid.eq(axi.awid), werr.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += axi.wready.eq(~byte.w_en)
                with m.If(axi.wvalid & ~byte.w_en):
                    m.d.comb += [wr.addr.eq(word(waddr)), wr.data.eq(axi.wdata),
                                 wr.en.eq(Mux(in_range(waddr), axi.wstrb, 0))]
                    m.d.sync += [waddr.eq(waddr + beat), werr.eq(werr | ~in_range(waddr))]
                    with m.If(axi.wlast):
                        m.next = "RESP"
            with m.State("RESP"):
                m.d.comb += [axi.bvalid.eq(1), axi.bid.eq(wid), axi.bresp.eq(Mux(werr, RESP_SLVERR, 0))]
                with m.If(axi.bready):
                    m.next = "IDLE"
        with m.If(byte.w_en):
            m.d.comb += [wr.addr.eq(word(byte.addr)), wr.data.eq(byte.w_data.replicate(beat)),
                         wr.en.eq((C(1, beat) << byte.addr[:lane_bits])[:beat] if lane_bits else 1)]
        return m
