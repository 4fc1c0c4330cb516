"""Dependency-token queue between two engines.

Tokens carry no data, so a queue of them is a saturating counter: ``push``
adds one (only while ``can_push``), ``pop`` removes one (only while
``can_pop``). Pushing and popping in the same cycle leaves the count unchanged.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["TokenQueue"]


class TokenQueue(wiring.Component):
    """A queue of up to ``capacity`` dependency tokens.

    Parameters
    ----------
    capacity : int
        Tokens the queue holds (``config.token_queue_depth``).

    Attributes
    ----------
    push, pop : In(1)
        Requests; a push while full or a pop while empty is ignored (engines never do it).
    can_push, can_pop : Out(1)
    count : Out(range(capacity + 1))
    """

    def __init__(self, capacity):
        if not isinstance(capacity, int) or capacity < 1:
            self._MustUse__silence = True   # a refused component is not an unused one
            raise TypeError(f"Token queue capacity must be a positive integer, not {capacity!r}")
        self._capacity = capacity
        super().__init__({
            "push": In(1), "pop": In(1),
            "can_push": Out(1), "can_pop": Out(1),
            "count": Out(range(capacity + 1)),
        })

    @property
    def capacity(self):
        return self._capacity

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.can_push.eq(self.count != self._capacity), self.can_pop.eq(self.count != 0)]
        do_push = self.push & self.can_push
        do_pop = self.pop & self.can_pop
        with m.If(do_push & ~do_pop):
            m.d.sync += self.count.eq(self.count + 1)
        with m.Elif(do_pop & ~do_push):
            m.d.sync += self.count.eq(self.count - 1)
        return m
