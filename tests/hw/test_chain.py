"""Chaining programs (`gemforge.hw.chain`): which streams may take part, and what a chain is.

Whether a chain computes what its programs compute one after another is checked on fsim and
the RTL with random programs (tests/sim/test_cosim_random.py) and whole networks
(tests/graph/test_graph_int8.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gemforge.hw.chain import chain_refusal, chain_streams
from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Engine, Finish, Load, MemType, engine_of
from gemforge.sim.cosim.random_program import random_program


def _program(seed: int, config=PRESETS["tiny"], **options):
    return random_program(config, np.random.default_rng(seed), 4096 * (1 + seed), **options).instructions


def _replace_where(insns, predicate, **flags):
    """``insns`` with the last instruction matching ``predicate`` given ``flags``."""
    out = list(insns)
    index = max(i for i, insn in enumerate(out) if predicate(insn))
    out[index] = dataclasses.replace(out[index], **flags)
    return out


def _on(engine):
    return lambda insn: engine_of(insn) is engine


@pytest.mark.parametrize("seed", range(4))
def test_random_programs_can_be_chained(seed):
    assert chain_refusal(_program(seed, groups=1 + seed % 3)) is None


@pytest.mark.parametrize("edit, reason", [
    (lambda p: p[:-1], "does not end with FINISH"),
    (lambda p: _replace_where(p, _on(Engine.STORE), push_prev=False), "is pushed and popped unequally"),
    (lambda p: _replace_where(_replace_where(p, _on(Engine.STORE), push_prev=False), lambda i: isinstance(i, Finish),
                              pop_next=False), "its last STORE does not signal the compute engine"),
    (lambda p: _replace_where(_replace_where(p, _on(Engine.LOAD), push_next=False),
                              lambda i: engine_of(i) is Engine.COMPUTE and i.pop_prev, pop_prev=False),
     "its last input or weight LOAD does not signal the compute engine"),
])
def test_a_stream_that_cannot_be_chained_is_named(edit, reason):
    assert reason in chain_refusal(edit(_program(1, groups=2)))


def test_a_stream_whose_first_load_waits_for_compute_cannot_be_chained():
    # Balanced: a micro-op load on the compute engine signals the first load before it.
    program = _program(2, groups=2)
    first = next(i for i, insn in enumerate(program) if engine_of(insn) is Engine.LOAD)
    program[first] = dataclasses.replace(program[first], pop_next=True)
    program.insert(0, Load(mem=MemType.UOP, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1, push_prev=True))
    assert "already waits for the compute engine" in chain_refusal(program)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_a_chain_links_its_programs_in_order(parts):
    programs = [_program(seed, groups=1 + seed % 2) for seed in range(parts)]
    insns, links = chain_streams(programs, zero_uop_entry=77)
    assert len(insns) == sum(map(len, programs)) and len(links) == parts - 1
    assert sum(isinstance(i, Finish) for i in insns) == 1 and isinstance(insns[-1], Finish)
    start = 0
    for k, program in enumerate(programs):
        part = insns[start:start + len(program)]
        for got, want in zip(part[:-1], program[:-1]):
            # Each instruction as written, but the first load of every part after the first,
            # which waits for the link before it.
            assert got == want or (k and got == dataclasses.replace(want, pop_next=True))
        if k < parts - 1:
            link = part[-1]
            assert links[k].index == start + len(program) - 1
            assert links[k].compute_ordinal == sum(engine_of(i) is Engine.COMPUTE for i in insns[:links[k].index + 1])
            finish = program[-1]
            assert link == Load(mem=MemType.UOP, sram_base=0, dram_base=77, y_size=1, x_size=1, x_stride=1,
                                pop_prev=finish.pop_prev, pop_next=finish.pop_next, push_prev=True)
        start += len(program)
    # Every queue still balances: a chain is a program that can be chained again.
    assert chain_refusal(insns) is None
