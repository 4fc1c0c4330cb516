"""`SkidBuffer`: a stream stage whose ``ready`` toward the producer is a register.

A consumer's ``ready`` is often the end of a long decision (a tile loader choosing between
padding and data, a FIFO's level); wired straight back into the producer it joins the
producer's own handshake logic in one combinational path. The skid buffer cuts that path
without adding latency: data passes through in the same cycle while the skid is empty, and
one payload offered while the consumer is not ready is caught in the skid (the producer sees
``ready`` low from the next cycle until the skid has been drained). The consumer's stream
therefore never loses a cycle; the producer is held back one cycle per stall, while the
skid drains.

`RegisteredStage` cuts the forward path too, at a cycle of latency: the consumer's valid is
a register and its payload a choice between two, so its decision starts at flip-flops instead
of at the producer's logic (and, through it, at the bus).

`registered_w_rdy` gives a FIFO's ``w_rdy`` from a flip-flop.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer", "RegisteredStage", "registered_w_rdy"]


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


class RegisteredStage(wiring.Component):
    """A full-rate stream stage whose outputs are all registers: ``o.valid`` toward the
    consumer, ``i.ready`` toward the producer, and ``o.payload`` a 2:1 choice between two
    registers. A payload leaves the cycle after it was taken. It holds two payloads, written
    and read in turn, so the producer's ready can be a register and still no cycle is lost
    while the consumer takes one per cycle; and the consumer's ready reaches only the read
    side's few flip-flops, not an enable of every payload bit (as a pipeline register's would).

    Parameters
    ----------
    payload_shape : shape-castable
        The streams' payload.

    Attributes
    ----------
    i : In(stream of payload_shape)
        From the producer; ``i.ready`` is a register (fewer than two payloads held).
    o : Out(stream of payload_shape)
        To the consumer; ``o.valid`` is a register.
    holding : Out(1)
        The stage holds a payload (``o.valid``).
    """

    def __init__(self, payload_shape):
        self._payload_shape = payload_shape
        super().__init__({"i": In(stream.Signature(payload_shape)), "o": Out(stream.Signature(payload_shape)),
                          "holding": Out(1)})

    def elaborate(self, platform):
        m = Module()
        slots = [Signal(self._payload_shape, name=f"slot{k}") for k in range(2)]
        write_slot, read_slot = Signal(), Signal()
        count = Signal(range(3))
        not_full, not_empty = Signal(init=1), Signal()      # count != 2, count != 0
        written = self.i.valid & not_full
        read = not_empty & self.o.ready
        m.d.comb += [self.i.ready.eq(not_full), self.o.valid.eq(not_empty), self.holding.eq(not_empty),
                     self.o.payload.eq(Mux(read_slot, slots[1], slots[0]))]
        for k, slot in enumerate(slots):
            with m.If(written & (write_slot == k)):
                m.d.sync += slot.eq(self.i.payload)
        with m.If(written):
            m.d.sync += write_slot.eq(~write_slot)
        with m.If(read):
            m.d.sync += read_slot.eq(~read_slot)
        following = count + written - read
        m.d.sync += [count.eq(following), not_full.eq(following != 2), not_empty.eq(following != 0)]
        return m


def registered_w_rdy(m, queue, depth):
    """``queue.w_rdy`` (an `amaranth.lib.fifo.SyncFIFO` of ``depth`` entries) as a flip-flop,
    kept from the queue's next level: the same value, but a writer that decides on it starts at
    a register rather than at the level's compare (a command's acceptance is then a short AND
    of registers in front of its many enables). Logic is added to ``m``."""
    room = Signal(init=1, name="w_rdy_registered")
    read = queue.r_en & queue.r_rdy
    with m.If(queue.w_en & queue.w_rdy & ~read):
        m.d.sync += room.eq(queue.level != depth - 1)
    with m.Elif(read & ~(queue.w_en & queue.w_rdy)):
        m.d.sync += room.eq(1)
    return room
