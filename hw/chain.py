"""Chaining programs into one instruction stream: one START, one FINISH, one IRQ.

A network's accelerator layers are separate programs, each balanced on its own (every
token it pushes, it pops) and ending with FINISH. Chained, every FINISH but the last
becomes a *link*: a one-entry micro-op LOAD on the compute engine that

- pops what that FINISH popped, so it starts once the program's last STORE is in DRAM
  (a store's token is pushed after its write responses) and its last LOAD is on chip;
- pushes a token to the load engine, which the next program's first load-engine
  instruction pops: that program reads nothing from DRAM (its input is the previous
  program's output) before the previous program has written all of it, and overwrites
  no input or weight entry the previous program still reads. Its compute-engine work
  follows the link in that engine's order, and its stores follow its own compute.

The ISA has no no-op, hence the micro-op load: it writes a zero micro-op into micro-op
entry 0, which no program reads before loading it itself (programs assume nothing about
the buffers they start with), and the compute engine drains its pipeline before it
starts a LOAD. The link's retirement also marks where one program ends and the next
begins: a profile reads its counters there (`Link.compute_ordinal`).

A program can take part when the token rules above hold for it (`chain_refusal`); the
compiler's programs do (`compiler.backends.accel.tokens`). The next program's compute
work may start as soon as the link retires, so a chain never overlaps two programs'
DMA: the weights of the next layer load after the last layer's stores.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gemforge.hw.isa import (
    TOKEN_POPS,
    TOKEN_PUSHES,
    Engine,
    Finish,
    Instruction,
    Load,
    MemType,
    engine_of,
)

__all__ = ["Link", "chain_refusal", "chain_streams"]


@dataclass(frozen=True)
class Link:
    """The instruction that ends a chained program: its index in the chained stream and how
    many compute-engine instructions retire up to and including it (the RTL's count)."""

    index: int
    compute_ordinal: int


def chain_refusal(insns: list[Instruction]) -> str | None:
    """Why this stream cannot be chained with others (None if it can): it must end with
    FINISH, push and pop equally on every token queue, end its store-engine work with a push
    to the compute engine and its load-engine work with a push to the compute engine (so that
    FINISH comes after both), and start its load-engine work without a pop from the compute
    engine (the link's token takes that place)."""
    if not insns or not isinstance(insns[-1], Finish):
        return "it does not end with FINISH"
    balance: dict[str, int] = {}
    last: dict[Engine, Instruction] = {}
    first: dict[Engine, Instruction] = {}
    for insn in insns:
        engine = engine_of(insn)
        first.setdefault(engine, insn)
        last[engine] = insn
        for flag, queue in TOKEN_PUSHES[engine].items():
            balance[queue] = balance.get(queue, 0) + getattr(insn, flag)
        for flag, queue in TOKEN_POPS[engine].items():
            balance[queue] = balance.get(queue, 0) - getattr(insn, flag)
    unbalanced = sorted(q for q, n in balance.items() if n)
    if unbalanced:
        return f"its token queue {unbalanced[0]} is pushed and popped unequally"
    if Engine.STORE in last and not last[Engine.STORE].push_prev:
        return "its last STORE does not signal the compute engine"
    if Engine.LOAD in last and not last[Engine.LOAD].push_next:
        return "its last input or weight LOAD does not signal the compute engine"
    if Engine.LOAD in first and first[Engine.LOAD].pop_next:
        return "its first input or weight LOAD already waits for the compute engine"
    return None


def chain_streams(streams: list[list[Instruction]], zero_uop_entry: int) -> tuple[list[Instruction], list[Link]]:
    """One stream running ``streams`` (relocated, each accepted by `chain_refusal`) in order,
    and the links between them (one fewer than the streams). ``zero_uop_entry`` is the DRAM
    address, in micro-op entries, of a zero micro-op the links load."""
    out: list[Instruction] = []
    links: list[Link] = []
    compute = 0
    for k, stream in enumerate(streams):
        body = list(stream)
        if links:
            # The first load-engine instruction waits for the link before it.
            for i, insn in enumerate(body):
                if engine_of(insn) is Engine.LOAD:
                    body[i] = dataclasses.replace(insn, pop_next=True)
                    break
        if k < len(streams) - 1:
            finish = body.pop()
            waits = any(engine_of(i) is Engine.LOAD for i in streams[k + 1])
            body.append(Load(mem=MemType.UOP, sram_base=0, dram_base=zero_uop_entry, y_size=1, x_size=1,
                             x_stride=1, pop_prev=finish.pop_prev, pop_next=finish.pop_next, push_prev=waits))
        for insn in body:
            if engine_of(insn) is Engine.COMPUTE:
                compute += 1
        out.extend(body)
        if k < len(streams) - 1:
            links.append(Link(len(out) - 1, compute))
    return out, links

