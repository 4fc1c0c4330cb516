"""Dependency-token queue between two engines.

Tokens carry no data, so a queue of them is a saturating counter: ``push``
adds one (only while ``can_push``), ``pop`` removes one (only while
``can_pop``). Pushing and popping in the same cycle leaves the count unchanged.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .checked import CheckedComponent

__all__ = ["TokenQueue", "TokenPopSignature", "TokenPushSignature"]


class TokenPopSignature(wiring.Signature):
    """An engine's pop side of a token queue: ``pop`` takes a token (only while ``can_pop``)."""

    def __init__(self):
        super().__init__({"pop": Out(1), "can_pop": In(1)})


class TokenPushSignature(wiring.Signature):
    """An engine's push side of a token queue: ``push`` adds a token (only while ``can_push``)."""

    def __init__(self):
        super().__init__({"push": Out(1), "can_push": In(1)})


class TokenQueue(CheckedComponent):
    """A queue of up to ``capacity`` dependency tokens.

    Parameters
    ----------
    capacity : int
        Tokens the queue holds (``config.token_queue_depth``).

    Attributes
    ----------
    pusher : In(TokenPushSignature)
        The pushing engine's side; a push while full is ignored (engines never do it).
    popper : In(TokenPopSignature)
        The popping engine's side; a pop while empty is ignored.
    count : Out(range(capacity + 1))
    """

    @classmethod
    def check_arguments(cls, capacity):
        if not isinstance(capacity, int) or capacity < 1:
            raise TypeError(f"Token queue capacity must be a positive integer, not {capacity!r}")

    def __init__(self, capacity):
        self._capacity = capacity
        super().__init__({
            "pusher": In(TokenPushSignature()), "popper": In(TokenPopSignature()),
            "count": Out(range(capacity + 1)),
        })

    @property
    def capacity(self):
        return self._capacity

    def elaborate(self, platform):
        m = Module()
        pusher, popper = self.pusher, self.popper
        m.d.comb += [pusher.can_push.eq(self.count != self._capacity), popper.can_pop.eq(self.count != 0)]
        do_push = pusher.push & pusher.can_push
        do_pop = popper.pop & popper.can_pop
        with m.If(do_push & ~do_pop):
            m.d.sync += self.count.eq(self.count + 1)
        with m.Elif(do_pop & ~do_push):
            m.d.sync += self.count.eq(self.count - 1)
        return m
