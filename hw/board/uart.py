"""UART receiver and transmitter: 8 data bits, no parity, one stop bit (8N1).

Both take ``cycles_per_bit`` (the clock frequency over the baud rate, at least
4) and move bytes on `amaranth.lib.stream` interfaces. The receiver
synchronizes its line with two flip-flops, confirms a start bit at its middle
and samples every bit at its middle; a byte whose stop bit is low is dropped
and flagged on ``framing_error``.
"""

from amaranth import *
from amaranth.lib import stream
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from ..gateware.checked import CheckedComponent

__all__ = ["UartRx", "UartTx"]


class _UartComponent(CheckedComponent):
    """What the receiver and transmitter share: the check of ``cycles_per_bit``."""

    @classmethod
    def check_arguments(cls, cycles_per_bit):
        if not isinstance(cycles_per_bit, int) or cycles_per_bit < 4:
            raise ValueError(f"Cycles per bit must be an integer of at least 4, not {cycles_per_bit!r}")


class UartRx(_UartComponent):
    """The receiver.

    Parameters
    ----------
    cycles_per_bit : int

    Attributes
    ----------
    rx : In(1)
        The serial line (idle high), asynchronous to the clock.
    source : Out(stream.Signature(8))
        Received bytes. A byte not taken before the next one is complete is overwritten
        (and ``overrun`` pulses).
    framing_error : Out(1)
        Pulses when a stop bit is low.
    overrun : Out(1)
    """

    def __init__(self, cycles_per_bit):
        self._cycles_per_bit = cycles_per_bit
        super().__init__({"rx": In(1, init=1), "source": Out(stream.Signature(8)),
                          "framing_error": Out(1), "overrun": Out(1)})

    @property
    def cycles_per_bit(self):
        return self._cycles_per_bit

    def elaborate(self, platform):
        m = Module()
        cpb = self._cycles_per_bit
        line = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, line, init=1)

        timer = Signal(range(cpb))
        bit = Signal(range(9))
        shift = Signal(8)
        with m.If(self.source.ready):
            m.d.sync += self.source.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(cpb // 2 - 1)
                    m.next = "START"
            with m.State("START"):           # wait to the middle of the start bit
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):           # a glitch, not a start bit
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [timer.eq(cpb - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):            # 8 data bits, then the stop bit, each at its middle
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(bit != 8):
                    m.d.sync += [shift.eq(Cat(shift[1:], line)), bit.eq(bit + 1), timer.eq(cpb - 1)]
                with m.Elif(line):
                    m.d.sync += [self.source.payload.eq(shift), self.source.valid.eq(1)]
                    m.d.comb += self.overrun.eq(self.source.valid & ~self.source.ready)
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += self.framing_error.eq(1)
                    m.next = "BREAK"
            with m.State("BREAK"):           # wait for the line to go idle again
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(_UartComponent):
    """The transmitter.

    Parameters
    ----------
    cycles_per_bit : int

    Attributes
    ----------
    sink : In(stream.Signature(8))
        Bytes to send; ``ready`` while the line is idle.
    tx : Out(1)
        The serial line (idle high).
    """

    def __init__(self, cycles_per_bit):
        self._cycles_per_bit = cycles_per_bit
        super().__init__({"sink": In(stream.Signature(8)), "tx": Out(1, init=1)})

    @property
    def cycles_per_bit(self):
        return self._cycles_per_bit

    def elaborate(self, platform):
        m = Module()
        cpb = self._cycles_per_bit
        timer = Signal(range(cpb))
        bits = Signal(range(11))
        frame = Signal(10, init=0x3FF)      # stop bit, 8 data bits, start bit; sent from bit 0
        m.d.comb += [self.tx.eq(frame[0]), self.sink.ready.eq(bits == 0)]
        with m.If(self.sink.valid & self.sink.ready):
            m.d.sync += [frame.eq(Cat(C(0, 1), self.sink.payload, C(1, 1))), bits.eq(10), timer.eq(cpb - 1)]
        with m.Elif(bits != 0):
            with m.If(timer != 0):
                m.d.sync += timer.eq(timer - 1)
            with m.Else():
                m.d.sync += [frame.eq(Cat(frame[1:], C(1, 1))), bits.eq(bits - 1), timer.eq(cpb - 1)]
        return m
