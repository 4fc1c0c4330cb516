"""AXI4 and AXI4-Lite signatures.

Members are flat and named as in the AXI specification (``araddr``,
``rvalid``...), so the generated top's ports read ``m_axi__araddr`` and
``s_axil__wdata``. DMA clients inside the accelerator use `AxiReadSignature` /
`AxiWriteSignature`, the halves of a full AXI4 master with ``req``/``gnt``
added for the read arbiter.
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import BUS_ADDR_BITS

__all__ = [
    "ADDR_BITS", "BURST_INCR", "RESP_OKAY", "connect_when_selected",
    "Axi4Signature", "AxiLiteSignature", "AxiReadSignature", "AxiWriteSignature",
]

#: Byte-address width of the DRAM port (a 4 GiB window; `gemforge.hw.config.BUS_ADDR_BITS`).
ADDR_BITS = BUS_ADDR_BITS
#: AxBURST encoding of incrementing bursts, the only kind the accelerator issues.
BURST_INCR = 1
RESP_OKAY = 0


def _check(data_bits, id_bits):
    if data_bits not in (32, 64, 128, 256, 512, 1024):
        raise ValueError(f"AXI data width must be a power of two from 32 to 1024 bits, not {data_bits!r}")
    if not isinstance(id_bits, int) or id_bits < 1:
        raise ValueError(f"AXI ID width must be a positive integer, not {id_bits!r}")


def connect_when_selected(port, client):
    """Assignments joining a component's bus ``port`` to the same-signature bus ``client`` of
    one of its sub-units: the client drives the port's outputs and sees its inputs. Made
    under a condition (``with m.If(selected)``), several clients share one port, and the
    unselected ones see their inputs at zero (no ready, no response)."""
    assigns = []
    for path, member, value in port.signature.flatten(port):
        other = client
        for name in path:
            other = getattr(other, name)
        assigns.append(value.eq(other) if member.flow == Out else other.eq(value))
    return assigns


class AxiReadSignature(wiring.Signature):
    """The read half of an AXI4 master (AR and R channels), as a DMA client sees it.

    ``req`` asks the arbiter for the read channels; the client may only assert
    ``arvalid`` while ``gnt`` is high and must keep ``req`` high until its last
    R beat has been received. ``contended`` says another client is asking: a client
    that chains work under one grant (`DmaReader`) starts no new work then, so the
    channels change hands at least once per command.
    """

    def __init__(self, data_bits, id_bits=2):
        _check(data_bits, id_bits)
        super().__init__({
            "req": Out(1), "gnt": In(1), "contended": In(1),
            "araddr": Out(ADDR_BITS), "arlen": Out(8), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_bits), "rlast": In(1), "rvalid": In(1), "rready": Out(1),
        })


class AxiWriteSignature(wiring.Signature):
    """The write half of an AXI4 master (AW, W and B channels)."""

    def __init__(self, data_bits):
        _check(data_bits, 1)
        super().__init__({
            "awaddr": Out(ADDR_BITS), "awlen": Out(8), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_bits), "wstrb": Out(data_bits // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
        })


class Axi4Signature(wiring.Signature):
    """A full AXI4 master port (incrementing bursts, fixed beat size = data width)."""

    def __init__(self, data_bits, id_bits=2):
        _check(data_bits, id_bits)
        super().__init__({
            "araddr": Out(ADDR_BITS), "arlen": Out(8), "arsize": Out(3), "arburst": Out(2),
            "arid": Out(id_bits), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_bits), "rresp": In(2), "rlast": In(1), "rid": In(id_bits),
            "rvalid": In(1), "rready": Out(1),
            "awaddr": Out(ADDR_BITS), "awlen": Out(8), "awsize": Out(3), "awburst": Out(2),
            "awid": Out(id_bits), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_bits), "wstrb": Out(data_bits // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bid": In(id_bits), "bvalid": In(1), "bready": Out(1),
        })


class AxiLiteSignature(wiring.Signature):
    """An AXI4-Lite port, 32-bit data, seen from the master (a slave uses ``.flip()``)."""

    def __init__(self, addr_bits):
        if not isinstance(addr_bits, int) or addr_bits < 2:
            raise ValueError(f"AXI4-Lite address width must be an integer of at least 2, not {addr_bits!r}")
        super().__init__({
            "awaddr": Out(addr_bits), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(32), "wstrb": Out(4), "wvalid": Out(1), "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_bits), "arvalid": Out(1), "arready": In(1),
            "rdata": In(32), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })
