"""A test oracle for latency hiding: an idealized timeline of an instruction stream.

fsim executes engines functionally and does not model time, so overlap is
checked on a deliberately simple model: three in-order engines (load,
compute, store), each instruction taking a time proportional to the data it
moves (DMA, ``bus_bytes`` per cycle) or the micro-ops it executes (one per
cycle), starting when its engine is free and the tokens it pops were pushed.
Tokens pair up in FIFO order exactly as on the hardware. The model is not a
cycle estimate; it only says which instructions *can* run concurrently under
the program's dependency tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import Alu, Engine, Finish, Gemm, Load, Store, engine_of

__all__ = ["Timeline", "simulate"]

_POP = {Engine.LOAD: {"pop_next": "compute->load"},
        Engine.COMPUTE: {"pop_prev": "load->compute", "pop_next": "store->compute"},
        Engine.STORE: {"pop_prev": "compute->store"}}
_PUSH = {Engine.LOAD: {"push_next": "load->compute"},
         Engine.COMPUTE: {"push_prev": "compute->load", "push_next": "compute->store"},
         Engine.STORE: {"push_prev": "store->compute"}}


@dataclass
class Timeline:
    start: list[int]
    end: list[int]
    engines: list[Engine]

    @property
    def makespan(self) -> int:
        return max(self.end)

    def busy(self, engine: Engine) -> list[tuple[int, int]]:
        return [(s, e) for s, e, g in zip(self.start, self.end, self.engines) if g is engine and e > s]

    def overlap(self, a: Engine, b: Engine) -> int:
        """Time during which both engines are busy."""
        total = 0
        for s1, e1 in self.busy(a):
            for s2, e2 in self.busy(b):
                total += max(0, min(e1, e2) - max(s1, s2))
        return total


def _duration(insn, config: AccelConfig) -> int:
    if isinstance(insn, (Load, Store)):
        entries = insn.y_size * insn.x_size
        return 4 + -(-entries * config.entry_bytes(insn.dram_buffer) // config.bus_bytes)
    if isinstance(insn, (Gemm, Alu)):
        return 2 + insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
    return 1


def simulate(instructions, config: AccelConfig) -> Timeline:
    free = {e: 0 for e in Engine}
    queues: dict[str, list[int]] = {q: [] for q in ("load->compute", "compute->load", "compute->store",
                                                    "store->compute")}
    taken = {q: 0 for q in queues}
    starts, ends, engines = [], [], []
    for insn in instructions:
        engine = engine_of(insn)
        ready = free[engine]
        for flag, q in _POP[engine].items():
            if getattr(insn, flag):
                assert taken[q] < len(queues[q]), f"pop from empty {q}: the program would deadlock"
                ready = max(ready, queues[q][taken[q]])
                taken[q] += 1
        if isinstance(insn, Finish):
            ready = max([ready, *free.values()])
        end = ready + _duration(insn, config)
        free[engine] = end
        for flag, q in _PUSH[engine].items():
            if getattr(insn, flag):
                queues[q].append(end)
        starts.append(ready)
        ends.append(end)
        engines.append(engine)
    return Timeline(starts, ends, engines)
