"""The micro-op loop of a GEMM or ALU instruction (stage S0 of the compute pipeline).

For ``i`` in ``[0, iter_out)``, ``j`` in ``[0, iter_in)`` and ``u`` in ``[uop_bgn, uop_end)``,
innermost last, one micro-op issues per cycle (every second cycle at ``half_rate``) with the
offsets ``i·factor_out + j·factor_in`` of each index kind (``dst``, ``src``, ``wgt``): the
order and the offsets of the ISA's loop
(`gemforge.sim.fsim.Fsim`'s loop indices are the micro-op's fields plus these offsets).
The offsets are kept as running sums, so no multiplier is needed.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import LOOP_ITER_BITS

__all__ = ["UopLoop", "OFFSET_BITS"]

#: Width of the running offsets: wide enough that a sum beyond any buffer is seen as such
#: (the compute engine compares the whole index with the buffer's depth).
OFFSET_BITS = 32


class UopLoop(wiring.Component):
    """Parameters
    ----------
    uop_index_bits : int
        Width of a micro-op buffer index.
    kinds : tuple of str
        The index kinds with factors (``("dst", "src", "wgt")``).

    Attributes
    ----------
    start : In(1)
        Pulse: begin a loop with the parameters below (which must stay stable until ``running``
        falls). The first micro-op issues the next cycle. Loops are never empty (the
        instruction checker refuses zero counts and empty ranges).
    uop_bgn, uop_end : In(uop_index_bits + 1)
    iter_out, iter_in : In(LOOP_ITER_BITS)
    <kind>_factor_out, <kind>_factor_in : In(OFFSET_BITS)
    half_rate : In(1)
        Issue a micro-op every second cycle (held like the parameters above).
    running : Out(1)
        A micro-op issues this cycle.
    uop : Out(uop_index_bits + 1)
        The micro-op issuing.
    uop_next : Out(uop_index_bits + 1)
        What ``uop`` will be next cycle (the micro-op issuing then, if any): its address
        for a synchronous read whose data then arrives in the micro-op's issue cycle.
    <kind>_offset : Out(OFFSET_BITS)
        Its offsets.
    """

    def __init__(self, uop_index_bits, kinds=("dst", "src", "wgt")):
        self._kinds = tuple(kinds)
        index = uop_index_bits + 1
        members = {"start": In(1), "uop_bgn": In(index), "uop_end": In(index),
                   "iter_out": In(LOOP_ITER_BITS), "iter_in": In(LOOP_ITER_BITS), "half_rate": In(1),
                   "running": Out(1), "uop": Out(index), "uop_next": Out(index)}
        for k in self._kinds:
            members.update({f"{k}_factor_out": In(OFFSET_BITS), f"{k}_factor_in": In(OFFSET_BITS),
                            f"{k}_offset": Out(OFFSET_BITS)})
        super().__init__(members)

    @property
    def kinds(self):
        return self._kinds

    def elaborate(self, platform):
        m = Module()
        # The loop counters count down the iterations left after the current one, and whether
        # it is the last is a flip-flop beside each: the offsets' 32-bit registers load on those
        # flags (a compare of ``j + 1`` with ``iter_in`` in front of their enables was another
        # of tiny's longest paths).
        i_left = Signal(LOOP_ITER_BITS)
        j_left = Signal(LOOP_ITER_BITS)
        i_last = Signal()       # i_left == 0
        j_last = Signal()       # j_left == 0
        u = self.uop
        run = Signal()          # micro-ops remain
        gap = Signal()          # half rate: the cycle after an issue issues nothing
        m.d.comb += self.running.eq(run & ~gap)
        base = {k: Signal(OFFSET_BITS, name=f"{k}_base") for k in self._kinds}    # i · factor_out
        off = {k: getattr(self, f"{k}_offset") for k in self._kinds}              # + j · factor_in
        factor = {k: (getattr(self, f"{k}_factor_out"), getattr(self, f"{k}_factor_in")) for k in self._kinds}

        # ``u`` follows ``uop_next``, so the next micro-op's index is known a cycle ahead. That
        # index addresses the micro-op buffer's block RAM, so it is chosen from registers only:
        # ``u + 1`` and whether ``u`` ends the range are kept beside ``u`` (the increment and
        # the compare with ``uop_end`` in front of the RAM's address were one of tiny's longest
        # paths on the ECP5).
        u_next = self.uop_next
        u_inc = Signal.like(u)          # u + 1
        u_last = Signal()               # u + 1 == uop_end: the loop wraps to uop_bgn after u
        single = Signal()               # uop_bgn + 1 == uop_end: u_last after every wrap
        m.d.comb += u_next.eq(u)
        m.d.sync += u.eq(u_next)
        bgn_inc = self.uop_bgn + 1
        restart_j = [j_left.eq(self.iter_in - 1), j_last.eq(self.iter_in == 1)]
        with m.If(self.start):
            m.d.comb += u_next.eq(self.uop_bgn)
            m.d.sync += [run.eq(1), gap.eq(0), *restart_j,
                         i_left.eq(self.iter_out - 1), i_last.eq(self.iter_out == 1),
                         u_inc.eq(bgn_inc), u_last.eq(bgn_inc == self.uop_end), single.eq(bgn_inc == self.uop_end)]
            for k in self._kinds:
                m.d.sync += [base[k].eq(0), off[k].eq(0)]
        with m.Elif(gap):
            m.d.sync += gap.eq(0)
        with m.Elif(run):
            m.d.sync += gap.eq(self.half_rate)
            with m.If(u_last):
                m.d.comb += u_next.eq(self.uop_bgn)
                m.d.sync += [u_inc.eq(bgn_inc), u_last.eq(single)]
                with m.If(j_last):
                    m.d.sync += [*restart_j, i_left.eq(i_left - 1), i_last.eq(i_left == 1)]
                    for k, (fo, _fi) in factor.items():
                        m.d.sync += [base[k].eq(base[k] + fo), off[k].eq(base[k] + fo)]
                    with m.If(i_last):
                        m.d.sync += run.eq(0)
                with m.Else():
                    m.d.sync += [j_left.eq(j_left - 1), j_last.eq(j_left == 1)]
                    for k, (_fo, fi) in factor.items():
                        m.d.sync += off[k].eq(off[k] + fi)
            with m.Else():
                m.d.comb += u_next.eq(u_inc)
                m.d.sync += [u_inc.eq(u_inc + 1), u_last.eq(u_inc + 1 == self.uop_end)]
        return m
