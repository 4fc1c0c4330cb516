"""Dependency tokens: the push/pop flags that make the decoupled engines see program order.

Exact dataflow over on-chip ranges decides every cross-engine dependency
(load→compute read-after-write, compute→load write-after-read,
compute→store, store→compute), and a minimal matched set of push/pop flags
enforces them, within the token queues' capacity. Double-buffered virtual
threads show up here as missing conflicts, which is what lets the engines
overlap. The last stage, `make_program`, returns the finished `Program`.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools

from gemforge.hw.isa import PIPELINE, TOKEN_QUEUES, Engine, Instruction, TokenQueue, engine_of
from gemforge.hw.program import Program, arena_alignment

from .emission import AccelBuild, Emitted

__all__ = ["insert_dependency_tokens", "make_program"]


def _conflict(a: Emitted, b: Emitted) -> bool:
    for ra, wa in ((a.reads, False), (a.writes, True)):
        for rb, wb in ((b.reads, False), (b.writes, True)):
            if not (wa or wb):
                continue
            for res_a, lo_a, hi_a in ra:
                for res_b, lo_b, hi_b in rb:
                    if res_a == res_b and lo_a <= hi_b and lo_b <= hi_a:
                        return True
    return False


def _open_pairs(made: list[tuple[int, int]], j: int) -> int:
    """Tokens pushed at or before ``j`` and popped after it (pairs are sorted by pop)."""
    count = 0
    for a, b in reversed(made):
        if b <= j:
            break
        if a <= j:
            count += 1
    return count


def insert_dependency_tokens(emitted: list[Emitted], depth: int) -> list[Instruction]:
    """Set the dependency flags so that every engine sees program-order data.

    For each instruction ``b`` and each neighbouring engine ``A``, let ``a`` be
    the latest earlier instruction on ``A`` that conflicts with ``b`` (one of
    them writes an on-chip range the other touches). Tokens on a queue pair up
    in order, and each engine runs in order, so ``b`` is safe if some earlier
    pop on ``b``'s engine took a token pushed at or after ``a``. Otherwise an
    instruction of ``A`` at or after ``a`` pushes and ``b`` pops a new token.
    Pairs are created with increasing producers and consumers, so every push
    has exactly one pop, every queue ends empty, and each dependency points
    backwards in program order (no dispatch deadlock).

    The push is normally ``a`` itself (the earliest release, the most overlap),
    but is moved later when more than ``depth`` tokens (the queue capacity)
    would be outstanding at that point of the program: a producer blocked on
    a full queue could otherwise wait for a consumer that fetch has not
    dispatched yet. Same-engine order needs no tokens.
    """
    history: dict[Engine, list[int]] = {e: [] for e in PIPELINE}
    # The ISA's queues (`isa.TOKEN_QUEUES`): each pairs its pusher's `push_flag` with its
    # popper's `pop_flag`.
    pairs: dict[TokenQueue, list[tuple[int, int]]] = {q: [] for q in TOKEN_QUEUES}
    flags: list[dict[str, bool]] = [dict() for _ in emitted]
    for i, rec in enumerate(emitted):
        b_engine = engine_of(rec.insn)
        for queue in TOKEN_QUEUES:
            if queue.popper is not b_engine:
                continue
            a_engine = queue.pusher
            made = pairs[queue]
            floor = made[-1][0] if made else -1
            found = None
            for j in reversed(history[a_engine]):
                if j <= floor:
                    break
                if _conflict(emitted[j], rec):
                    found = j
                    break
            if found is None:
                continue
            line = history[a_engine]
            start = bisect.bisect_left(line, found)
            chosen = line[-1]
            for j in itertools.islice(line, start, None):
                if _open_pairs(made, j) < depth:
                    chosen = j
                    break
            flags[chosen][queue.push_flag] = True
            flags[i][queue.pop_flag] = True
            made.append((chosen, i))
        history[b_engine].append(i)
    return [dataclasses.replace(rec.insn, **f) if f else rec.insn for rec, f in zip(emitted, flags)]




def make_program(build: AccelBuild) -> Program:
    """The `insert_dependency_tokens` stage: set the flags and assemble the relocatable program."""
    config = build.config
    insns = insert_dependency_tokens(build.emitted, config.token_queue_depth)
    align = arena_alignment(config)
    arena = -(-build.arena_end // align) * align
    return Program(config, insns, build.uop_table, uop_offset=build.uop_offset, arena_bytes=max(align, arena),
                   tensors={r.name: r for r in build.regions.values()}, constants=build.constants)
