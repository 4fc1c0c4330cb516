"""Banked buffers: on-chip SRAM of entries, several consecutive entries per cycle.

A DMA beat holds ``bus_bytes / entry_bytes`` entries when entries are narrower
than the bus, so a buffer that takes (or gives) one entry per cycle wastes the
bus. `BankedMemory` splits a buffer of ``depth`` entries into ``banks`` SRAMs
(`amaranth.lib.memory.Memory`), entry ``e`` living in bank ``e mod banks`` at row
``e div banks``. Any ``n ≤ banks`` consecutive entries then sit in ``n``
different banks, so one cycle can write or read them all, from any start index.

Ports are created like `Memory`'s, before elaboration:

* `write_port` (``lanes`` entries): writes the *group* ``data[0 .. count-1]`` to
  entries ``addr .. addr+count-1`` (modulo the depth) when ``en`` is high;
* `read_port` (``lanes`` entries): ``data[i]`` is entry ``addr + i`` one cycle
  after ``addr`` (synchronous, like a `Memory` read port), optionally
  transparent to write ports of the same buffer.

A one-lane port behaves exactly like a `Memory` port of one entry; with one
bank the buffer *is* one `Memory`. Signatures are written from the side of the
client that drives the port (`GroupWriteSignature`, `GroupReadSignature`); the
memory's ports are their flips, so ``wiring.connect(m, client.wr, port)`` works.
"""

from amaranth import *
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from .checked import CheckedComponent

__all__ = ["group_layout", "GroupWriteSignature", "GroupReadSignature", "BankedMemory"]


def _is_pow2(value):
    return isinstance(value, int) and value > 0 and value & (value - 1) == 0


def group_layout(width, lanes):
    """Up to ``lanes`` consecutive entries of ``width`` bits: ``entries[0]`` first, ``count`` valid."""
    return data.StructLayout({"entries": data.ArrayLayout(width, lanes), "count": range(lanes + 1)})


def _check_port(width, lanes, addr_width):
    if not isinstance(width, int) or width < 1:
        raise TypeError(f"Entry width must be a positive integer, not {width!r}")
    if not _is_pow2(lanes):
        raise TypeError(f"Lane count must be a positive power of two, not {lanes!r}")
    if not isinstance(addr_width, int) or addr_width < 0:
        raise TypeError(f"Address width must be a non-negative integer, not {addr_width!r}")


class _GroupPortSignature(wiring.Signature):
    """What both group ports share: entry width, lanes and address width, compared by value."""

    def __init__(self, width, lanes, addr_width, members):
        _check_port(width, lanes, addr_width)
        self._width, self._lanes, self._addr_width = width, lanes, addr_width
        super().__init__(members)

    width = property(lambda self: self._width)
    lanes = property(lambda self: self._lanes)
    addr_width = property(lambda self: self._addr_width)

    def __eq__(self, other):
        return (type(self) is type(other) and (self.width, self.lanes, self.addr_width) ==
                (other.width, other.lanes, other.addr_width))

    def __repr__(self):
        return f"{type(self).__name__}({self.width}, {self.lanes}, {self.addr_width})"


class GroupWriteSignature(_GroupPortSignature):
    """A group write port, as the writer sees it.

    Members
    -------
    addr : Out(addr_width)
        Index of the first entry.
    count : Out(range(lanes + 1), init=1)
        Entries written (``data[0 .. count-1]``); unused lanes are ignored.
    data : Out(ArrayLayout(width, lanes))
    en : Out(1)
    """

    def __init__(self, width, lanes, addr_width):
        super().__init__(width, lanes, addr_width, {
            "addr": Out(addr_width),
            "count": Out(range(lanes + 1), init=1),
            "data": Out(data.ArrayLayout(width, lanes)),
            "en": Out(1),
        })


class GroupReadSignature(_GroupPortSignature):
    """A group read port, as the reader sees it.

    Members
    -------
    addr : Out(addr_width)
        Index of the first entry.
    data : In(ArrayLayout(width, lanes))
        ``data[i]`` = entry ``addr + i`` of the previous cycle's ``addr``.
    """

    def __init__(self, width, lanes, addr_width):
        super().__init__(width, lanes, addr_width, {
            "addr": Out(addr_width),
            "data": In(data.ArrayLayout(width, lanes)),
        })


class BankedMemory(CheckedComponent):
    """A buffer of ``depth`` entries of ``width`` bits in ``banks`` SRAM banks.

    Parameters
    ----------
    width : int
        Bits per entry.
    depth : int
        Entries (a power of two); indices wrap modulo the depth.
    banks : int
        A power of two, at most ``depth``: the most entries a port moves per cycle.

    Raises
    ------
    TypeError
        If a parameter is not of the form described.
    """

    @classmethod
    def check_arguments(cls, *, width, depth, banks):
        if not isinstance(width, int) or width < 1:
            raise TypeError(f"Entry width must be a positive integer, not {width!r}")
        if not _is_pow2(depth):
            raise TypeError(f"Depth must be a positive power of two, not {depth!r}")
        if not _is_pow2(banks) or banks > depth:
            raise TypeError(f"Bank count must be a power of two no larger than the depth ({depth}), "
                            f"not {banks!r}")

    def __init__(self, *, width, depth, banks):
        self._width, self._depth, self._banks = width, depth, banks
        self._addr_width = max(1, exact_log2(depth))
        self._write_ports = []
        self._read_ports = []       # (port, transparent_for)
        super().__init__({})

    width = property(lambda self: self._width)
    depth = property(lambda self: self._depth)
    banks = property(lambda self: self._banks)
    addr_width = property(lambda self: self._addr_width)

    def _lanes(self, lanes):
        if not _is_pow2(lanes) or lanes > self._banks:
            raise TypeError(f"Lane count must be a power of two no larger than the bank count "
                            f"({self._banks}), not {lanes!r}")
        return lanes

    def write_port(self, *, lanes=1):
        """A group write port of up to ``lanes`` entries (the flip of `GroupWriteSignature`)."""
        port = GroupWriteSignature(self._width, self._lanes(lanes), self._addr_width).flip().create()
        self._write_ports.append(port)
        return port

    def read_port(self, *, lanes=1, transparent_for=()):
        """A group read port of ``lanes`` entries (the flip of `GroupReadSignature`); a write in the
        same cycle through a port of ``transparent_for`` is seen by the read."""
        transparent_for = tuple(transparent_for)
        for wp in transparent_for:
            if not any(wp is p for p in self._write_ports):
                raise ValueError("Ports in the transparency set must be write ports of this memory")
        port = GroupReadSignature(self._width, self._lanes(lanes), self._addr_width).flip().create()
        self._read_ports.append((port, transparent_for))
        return port

    def elaborate(self, platform):
        m = Module()
        nb, lb = self._banks, exact_log2(self._banks)
        rows = self._depth // nb
        mems = []
        for b in range(nb):
            mems.append(memory.Memory(shape=self._width, depth=rows, init=[]))
            m.submodules[f"bank{b}"] = mems[-1]
        bank_wps = [[mem.write_port() for mem in mems] for _ in self._write_ports]

        def split(addr):
            """(low bits: the bank of entry addr, high bits: its row)."""
            return (addr[:lb], addr[lb:]) if lb else (C(0, 1), addr)

        def bank_row(addr, b):
            # The row of bank b within the ``banks`` entries from addr: bank b holds
            # entry addr + ((b - addr) mod banks), one row further on for b < addr mod banks.
            lo, hi = split(addr)
            return hi + (lo > b) if b < nb - 1 else hi

        def lane_of(addr, b):
            """Which lane of a group starting at addr lands in bank b: (b - addr) mod banks."""
            lo, _ = split(addr)
            return (b - lo)[:lb] if lb else C(0, 1)

        for port, wps in zip(self._write_ports, bank_wps):
            lw = exact_log2(len(port.data))
            for b, wp in enumerate(wps):
                lane = Signal(max(1, lb), name=f"wr_lane{b}")
                m.d.comb += [
                    lane.eq(lane_of(port.addr, b)),
                    wp.addr.eq(bank_row(port.addr, b)),
                    wp.en.eq(port.en & (lane < port.count)),
                    wp.data.eq(port.data[lane[:lw]] if lw else port.data[0]),
                ]

        for port, transparent_for in self._read_ports:
            tset = [[wps for p, wps in zip(self._write_ports, bank_wps) if p is wp][0] for wp in transparent_for]
            rps = [mem.read_port(transparent_for=[wps[b] for wps in tset]) for b, mem in enumerate(mems)]
            for b, rp in enumerate(rps):
                # A one-entry read needs only bank ``addr mod banks``, at row ``addr div banks``: every
                # bank reads that row, which keeps bank_row's incrementer off the address path (a
                # compute read's address is already a sum; the add after it limited Fmax on the ECP5).
                row = split(port.addr)[1] if len(port.data) == 1 else bank_row(port.addr, b)
                m.d.comb += rp.addr.eq(row)
            if lb:
                first = Signal(lb)      # bank of the entry read, for the data one cycle later
                m.d.sync += first.eq(port.addr[:lb])
                outputs = Array(rp.data for rp in rps)
                for i in range(len(port.data)):
                    m.d.comb += port.data[i].eq(outputs[(first + i)[:lb]])
            else:
                m.d.comb += port.data[0].eq(rps[0].data)
        return m
