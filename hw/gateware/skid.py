"""`SkidBuffer`: a stream stage whose ``ready`` toward the producer is a register.

A consumer's ``ready`` is often the end of a long decision (a tile loader choosing between
padding and data, a FIFO's level); wired straight back into the producer it joins the
producer's own handshake logic in one combinational path. The skid buffer cuts that path
without adding latency: data passes through in the same cycle while the skid is empty, and
one payload offered while the consumer is not ready is caught in the skid (the producer sees
``ready`` low from the next cycle until the skid has been drained). The consumer's stream
therefore never loses a cycle; the producer is held back one cycle per stall, while the
skid drains.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """Parameters
    ----------
    payload_shape : shape-castable
        The streams' payload.

    Attributes
    ----------
    i : In(stream of payload_shape)
        From the producer; ``i.ready`` is a register (the skid is empty).
    o : Out(stream of payload_shape)
        To the consumer: the skid's payload while it holds one, else ``i`` passed through.
    holding : Out(1)
        The skid holds a payload (the stage is not empty even if the producer is idle).
    """

    def __init__(self, payload_shape):
        self._payload_shape = payload_shape
        super().__init__({"i": In(stream.Signature(payload_shape)), "o": Out(stream.Signature(payload_shape)),
                          "holding": Out(1)})

    def elaborate(self, platform):
        m = Module()
        full = self.holding
        caught = Signal(self._payload_shape)
        m.d.comb += [
            self.i.ready.eq(~full),
            self.o.valid.eq(full | self.i.valid),
            self.o.payload.eq(Mux(full, caught, self.i.payload)),
        ]
        # While empty the skid copies every payload offered, whether or not it is caught: its
        # enable is then the register ``full`` alone, and the consumer's ``ready`` (the end of
        # its decision) drives one flip-flop instead of every payload bit's enable.
        with m.If(full):
            with m.If(self.o.ready):
                m.d.sync += full.eq(0)
        with m.Else():
            m.d.sync += [full.eq(self.i.valid & ~self.o.ready), caught.eq(self.i.payload)]
        return m
