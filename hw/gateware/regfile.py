"""The AXI4-Lite register file, built from the register map (`gemforge.hw.regmap`).

For each register of the map the component has one port:

* ``ro`` registers: an input ``<name>`` the rest of the design drives;
* ``rw`` registers: an output ``<name>`` holding the last value written;
* ``wo`` registers: an output ``<name>`` with the written value, valid in the
  cycle ``<name>_stb`` pulses.

Writes need the address and data together (AW and W in the same handshake);
responses are always OKAY, reads of unmapped offsets return 0.
"""

from amaranth import *
from amaranth.lib.wiring import In, Out

from ..regmap import REG_BYTES, Register, address_bits
from .axi import AxiLiteSignature
from .checked import CheckedComponent

__all__ = ["RegisterFile"]


class RegisterFile(CheckedComponent):
    """Parameters
    ----------
    registers : list or tuple of Register
    """

    @classmethod
    def check_arguments(cls, registers):
        if not isinstance(registers, (list, tuple)):
            raise TypeError(f"Registers must be a list or tuple of gemforge.hw.regmap.Register, "
                            f"not {registers!r}")
        for reg in registers:
            if not isinstance(reg, Register):
                raise TypeError(f"Registers must be gemforge.hw.regmap.Register, not {reg!r}")

    def __init__(self, registers):
        self._registers = list(registers)
        self._addr_bits = address_bits(registers)
        members = {"bus": In(AxiLiteSignature(self._addr_bits))}
        for reg in registers:
            key = reg.name.lower()
            shape = reg.layout if reg.fields else 32       # a register with bitfields is a view of them
            if reg.access == "ro":
                members[key] = In(shape)
            else:
                members[key] = Out(shape)
                if reg.access == "wo":
                    members[f"{key}_stb"] = Out(1)
        super().__init__(members)

    @property
    def addr_bits(self):
        return self._addr_bits

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        word = lambda addr: addr[2:]   # noqa: E731 - register index

        # Writes.
        write = bus.awvalid & bus.wvalid & ~bus.bvalid
        m.d.comb += [bus.awready.eq(write), bus.wready.eq(write)]
        with m.If(write):
            m.d.sync += bus.bvalid.eq(1)
        with m.Elif(bus.bready):
            m.d.sync += bus.bvalid.eq(0)
        for reg in self._registers:
            if reg.access == "ro":
                continue
            port = getattr(self, reg.name.lower())
            hit = write & (word(bus.awaddr) == reg.offset // REG_BYTES)
            if reg.access == "wo":
                m.d.comb += [port.eq(bus.wdata), getattr(self, f"{reg.name.lower()}_stb").eq(hit)]
            else:
                with m.If(hit):
                    m.d.sync += port.eq(bus.wdata)

        # Reads.
        m.d.comb += bus.arready.eq(~bus.rvalid)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += bus.rvalid.eq(1)
            with m.Switch(word(bus.araddr)):
                for reg in self._registers:
                    if reg.access == "wo":
                        continue
                    with m.Case(reg.offset // REG_BYTES):
                        m.d.sync += bus.rdata.eq(getattr(self, reg.name.lower()))
                with m.Default():
                    m.d.sync += bus.rdata.eq(0)
        with m.Elif(bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        return m
