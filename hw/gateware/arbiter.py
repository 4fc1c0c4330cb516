"""Read-channel arbiter: several DMA clients share the AXI4 master's AR/R channels.

A client asks with ``req``; the arbiter grants one client at a time and keeps
the grant until that client drops ``req`` (after its last R beat), so R data
always belongs to the granted client and no IDs need tracking. Clients hold
the bus only for work they can finish without waiting on anything else (DMA
commands already accepted), so holding cannot deadlock. A client may chain
further commands under its grant while ``contended`` is low, i.e. while no
other client asks. ``contended`` is registered (the other clients' requests of
the cycle before): a request passed on the same cycle ran from one client's
in-flight state through every other client's command acceptance into its
burst generator. So a client may accept one more command in the cycle another
starts asking; the next cycle it sees the request. Priority is round-robin.

Grants start from the requests registered here, too: a client's request is an
OR of its in-flight state, and the route from the farthest client to this
arbiter's grant logic was the design's critical path on the ECP5 (fetch's
request took 4.7 ns of routing alone). A request falls only while its client
holds the grant (a client's work needs the bus), and the release sees that
the same cycle, so a registered request is never stale when a grant starts
from it; a request raised while the channels are free waits a cycle more
(`gemforge.hw.timing.Timing.request_latency`).
"""

from amaranth import *
from amaranth.lib.wiring import In, Out

from .axi import AxiReadSignature
from .checked import CheckedComponent

__all__ = ["ReadArbiter"]


class ReadArbiter(CheckedComponent):
    """Round-robin arbiter of ``count`` read clients onto one read port.

    Attributes
    ----------
    clients : list of In(AxiReadSignature)
        ``clients[i]`` connects to client ``i``; the client's ID on the bus is ``i``.
    bus : Out(AxiReadSignature)
        The shared read channels (``req``/``gnt`` unused).
    grant_id : Out(range(count))
        The client holding the channels (the AXI ARID).
    """

    @classmethod
    def check_arguments(cls, data_bits, count):
        if not isinstance(count, int) or count < 1:
            raise TypeError(f"Client count must be a positive integer, not {count!r}")

    def __init__(self, data_bits, count):
        self._count = count
        members = {f"client{i}": In(AxiReadSignature(data_bits)) for i in range(count)}
        members["bus"] = Out(AxiReadSignature(data_bits))
        members["grant_id"] = Out(range(max(2, count)))
        super().__init__(members)

    @property
    def clients(self):
        return [getattr(self, f"client{i}") for i in range(self._count)]

    def elaborate(self, platform):
        m = Module()
        clients = self.clients
        owner = Signal(range(max(2, self._count)))
        # The owner again, one-hot: each client's R handshake gates on a register of its own
        # instead of a compare of ``owner`` (a path into every client's beat counter).
        holder = Signal(self._count)
        m.d.comb += self.grant_id.eq(owner)
        asking = Cat(*(client.req for client in clients))
        requests = Signal(self._count)          # ``asking`` of the cycle before
        m.d.sync += requests.eq(asking)

        # Round robin: the first requester after the last owner, else the first requester. The
        # clients after the owner are a mask kept in a register beside it, so the choice is a
        # priority pick of `requests & after_owner` or of `requests`, each bit of it a few
        # inputs wide, instead of a compare of `owner` with every index in front of each pick.
        after_owner = Signal(self._count, init=((1 << self._count) - 1) & ~1)  # clients above 0
        with m.If(~holder.any()):
            later = requests & after_owner
            pick = Mux(later.any(), later, requests)
            for i in range(self._count):
                with m.If(pick[i] & ~pick[:i].any() if i else pick[0]):
                    m.d.sync += [owner.eq(i), holder.eq(1 << i),
                                 after_owner.eq(((1 << self._count) - 1) & ~((2 << i) - 1))]
        with m.Else():
            # The holder keeps the grant while it asks (``holder`` is one-hot, so each bit
            # needs only its own client's request).
            m.d.sync += holder.eq(holder & asking)

        for i, client in enumerate(clients):
            mine = holder[i]
            contended = Signal(name=f"contended{i}")
            m.d.comb += contended.eq(Cat(*(requests[j] for j in range(self._count) if j != i)).any())
            m.d.comb += [
                client.gnt.eq(mine),
                client.contended.eq(contended),
                client.arready.eq(mine & self.bus.arready),
                client.rdata.eq(self.bus.rdata),
                client.rlast.eq(self.bus.rlast),
                client.rvalid.eq(mine & self.bus.rvalid),
            ]
            with m.If(mine):
                m.d.comb += [
                    self.bus.araddr.eq(client.araddr),
                    self.bus.arlen.eq(client.arlen),
                    self.bus.arvalid.eq(client.arvalid),
                    self.bus.rready.eq(client.rready),
                ]
        return m
