"""The cycle model: a program's run time and per-engine breakdown without RTL, in milliseconds.

`run_cycle_model` replays a program's instructions through a model of the microarchitecture
whose latencies are `gemforge.hw.timing.Timing` (one definition, shared with the compiler's
tiling planner): fetch reads the stream in chunks over the shared read channel and dispatches
one instruction per cycle in program order into command queues of ``cmd_queue_depth``; the
load and store engines pipeline their DMAs (up to `Timing.pending_pushes` in flight, pushes in
program order); the compute engine runs one GEMM/ALU instruction at a time at one micro-op per
cycle plus its fixed cost; dependency tokens block pops on empty queues and pushes on full
ones (``token_queue_depth``), exactly as fsim orders them; the read channel is held by one
client from its grant to its last beat (the arbiter's rule), and a client's next command
chains under its grant while no other client has asked.

It is an *event* model, not a cycle-by-cycle one: each instruction is one step whose start is
the latest of the events it waits for (its dispatch, its tokens, its engine, the bus), taken
in time order. Its error against Verilator is measured on every benchmark program
(`gemforge bench --sections cycle_model`, and `tests/sim/test_cycle_model.py` fails beyond the
bound); it does not compute data, so it needs only the instructions (not the DRAM image).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from gemforge.hw.isa import (TOKEN_POPS, TOKEN_PUSHES, Alu, Engine, Finish, Gemm, Instruction, Load, MemType, Store,
                             engine_of)
from gemforge.hw.microarch import READ_CLIENTS, buffer_lanes, dma_groups
from gemforge.hw.timing import FETCH_CHUNK, Timing, compute_cycles, timing_of


__all__ = ["CycleModelError", "CycleReport", "run_cycle_model", "dma_beats"]

# The dependency-token topology is the ISA's (flag → queue, per engine).
_POPS = {e: tuple(flags.items()) for e, flags in TOKEN_POPS.items()}
_PUSHES = {e: tuple(flags.items()) for e, flags in TOKEN_PUSHES.items()}
#: The read client a LOAD's data arrives through (`gemforge.hw.gateware.top.READ_CLIENTS`).
_READ_CLIENT = {MemType.INP: "load_inp", MemType.WGT: "load_wgt", MemType.ACC: "compute_acc",
                MemType.UOP: "compute_uop"}


class CycleModelError(RuntimeError):
    """The program cannot run (a fault fsim and the hardware would report, a deadlock of its
    tokens, or no FINISH)."""


@dataclass
class CycleReport:
    """What the model predicts for one program.

    ``cycles`` is START to DONE; ``counters`` uses the RTL's counter names
    (`gemforge.hw.regmap.COUNTERS`) where the model has them: per-engine busy, token-stall
    and memory-stall cycles, and the GEMM/ALU micro-op cycles."""

    cycles: int
    counters: dict[str, int]
    instructions: int
    #: the cycle each instruction retired (its pushes done), by program index
    retire: list[int] = field(default_factory=list, repr=False)

    @property
    def gemm_utilization(self) -> float:
        """Multiplying GEMM micro-op cycles (reset micro-ops excluded) per cycle."""
        c = self.counters
        return (c["gemm_active"] - c["gemm_reset"]) / max(1, self.cycles)

    def to_json(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "instructions": self.instructions, "counters": dict(self.counters),
                "gemm_utilization": round(self.gemm_utilization, 4)}


def dma_beats(insn: Load | Store, config, timing: Timing) -> tuple[int, int]:
    """(bus beats, cycles on the data channel) of a LOAD or STORE: rows of entries at their
    DRAM addresses, a row of entries narrower than a beat moving whole beats, bursts split at
    `Timing.max_burst`-beat boundaries (as `gemforge.hw.gateware.dma.BurstGenerator` does),
    a burst taking at least `Timing.burst_issue` cycles (its address's turn)."""
    eb, bus, maxb = config.entry_bytes(insn.dram_buffer), timing.bus_bytes, timing.max_burst
    starts = insn.dram_base + np.arange(insn.y_size, dtype=np.int64) * insn.x_stride
    if eb >= bus:
        per_entry = eb // bus
        first = starts * per_entry
        last = first + insn.x_size * per_entry - 1
    else:
        k = bus // eb
        first, last = starts // k, (starts + insn.x_size - 1) // k
    beats = last - first + 1
    bursts = last // maxb - first // maxb + 1
    cycles = np.maximum(beats, timing.burst_issue * bursts)
    if isinstance(insn, Store) and insn.requant:
        # The requantizing path reads a group of accumulator entries per cycle (`buffer_lanes`
        # of them: fewer than a beat of output entries when those are narrow) and its bias
        # (once, or once per row) through the same port.
        k, lanes = max(1, bus // eb), buffer_lanes(config, insn.mem.buffer)
        if k == 1:
            groups = insn.y_size * insn.x_size
        elif lanes >= k:
            groups = int(beats.sum())
        else:
            groups = len(dma_groups(insn.dram_base, insn.y_size, insn.x_size, insn.x_stride, eb, bus, lanes))
        groups += len(insn.bias_entries())
        return int(beats.sum()), max(int(cycles.sum()), groups)
    return int(beats.sum()), int(cycles.sum())


def _store_writer(insn: Store) -> tuple[MemType, bool]:
    """The store engine's DMA writer a STORE uses: one per buffer, and the requantizing one."""
    return insn.mem, insn.requant


def _pad_cycles(insn: Load, config) -> tuple[int, int]:
    """Cycles the tile loader spends writing padding (leading, trailing): a run of
    padding per cycle group of `buffer_lanes` entries."""
    if not (insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1):
        return 0, 0
    lanes = buffer_lanes(config, insn.mem.buffer)
    pitch = insn.x_pad0 + insn.x_size + insn.x_pad1
    row = -(-pitch // lanes)
    side = -(-insn.x_pad0 // lanes) + -(-insn.x_pad1 // lanes)
    return insn.y_pad0 * row, insn.y_pad1 * row + insn.y_size * side


#: The arbiter's read clients in ARID order (round-robin order).
_CLIENTS = READ_CLIENTS
assert set(_READ_CLIENT.values()) | {"fetch"} == set(_CLIENTS)


@dataclass
class _Read:
    """A DMA read waiting for the read channel."""

    client: str
    request: int
    cycles: int                       # on the data channel
    record: "_Record | None"          # the instruction it belongs to (None: a fetch chunk)
    first_insn: int = 0               # a fetch chunk's first instruction, and how many
    count: int = 0


@dataclass
class _Record:
    """One instruction an engine has started: its work's end, then its push."""

    index: int                        # in the program
    insn: Instruction
    take: int
    finish: int | None = None         # its work is done (data in SRAM/DRAM, pipeline drained)
    pushed: int | None = None
    trail: int = 0                    # LOAD: cycles of padding written after the last beat
    earliest: int = 0                 # LOAD: the writer's own time for the whole tile


@dataclass
class _EngineState:
    insns: list[int] = field(default_factory=list)      # program indices, in order
    head: int = 0                                        # next position to start
    free: int = 0                                        # when it can take its next word
    taken: list[int] = field(default_factory=list)      # take time per position (queue room)
    records: list[_Record] = field(default_factory=list)
    next_push: int = 0                                   # first record not yet pushed
    busy: int = 0
    busy_end: int = 0
    token_stall: int = 0
    mem_stall: int = 0


class _Model:
    """The state of one replay; `run` steps it in time order until FINISH."""

    def __init__(self, insns: list[Instruction], config, timing: Timing):
        self.insns, self.config, self.t = insns, config, timing
        self.n = n = len(insns)
        self.engines = {e: _EngineState() for e in Engine}
        self.kind = [engine_of(i) for i in insns]
        self.position = [0] * n
        for i, e in enumerate(self.kind):
            self.position[i] = len(self.engines[e].insns)
            self.engines[e].insns.append(i)
        self.pushes: dict[str, list[int]] = {q: [] for flags in TOKEN_PUSHES.values() for q in flags.values()}
        self.pops: dict[str, list[int]] = {q: [] for q in self.pushes}
        self.counters = dict.fromkeys(("gemm_active", "gemm_reset", "alu_active"), 0)
        # fetch
        self.beat_cycles = max(1, timing.insn_bytes // timing.bus_bytes)
        self.dispatch = [0] * n
        self.arrive: list[int | None] = [None] * n
        self.dispatched = 0
        self.chunks = 0
        self.last_chunk = 0
        # the read channel
        self.reads: list[_Read] = []
        self.read_free = 0
        self.read_owner = 0          # index in _CLIENTS (round robin starts after it)
        self.read_granted = False    # a read has been granted (the first one waits for its request)
        # the load and store engines' units
        self.loader_free = {MemType.INP: 0, MemType.WGT: 0}
        self.store_sram_free = 0
        self.store_owner: tuple[tuple[MemType, bool] | None, _Record | None] = (None, None)
        self.finish_time: int | None = None
        self.retire = [0] * n

    # ------------------------------------------------------------------ steps and their ready times

    def steps(self) -> list[tuple[int, int, str, Any]]:
        """Every step that can be taken now: (ready cycle, tie order, kind, argument)."""
        t, out = self.t, []
        c = self.chunks
        if c * FETCH_CHUNK < self.n and self.dispatched >= (c - 1) * FETCH_CHUNK:
            after = self.dispatch[(c - 1) * FETCH_CHUNK - 1] + 1 if c > 1 else 0
            out.append((max(self.last_chunk + 1 if c else 0, after), 0, "chunk", None))
        i = self.dispatched
        if i < self.n and self.arrive[i] is not None:
            e = self.engines[self.kind[i]]
            k = self.position[i] - t.cmd_queue_depth
            if k < len(e.taken):
                room = e.taken[k] + 1 if k >= 0 else 0
                out.append((max(self.arrive[i], self.dispatch[i - 1] + 1 if i else 0, room), 0, "dispatch", i))
        for order, e in enumerate(Engine):
            ready = self._engine_ready(e)
            if ready is not None:
                out.append((ready, 1 + order, "engine", e))
        if self.reads:
            first = min(r.request for r in self.reads)
            # Granted after every step that could still ask earlier (tie order last).
            out.append((max(first + t.request_latency, self.read_free), 9, "grant", None))
        return out

    def _token(self, queue: str, index: int) -> int | None:
        times = self.pushes[queue]
        return times[index] + 1 if index < len(times) else None

    def _engine_ready(self, e: Engine) -> int | None:
        st, t = self.engines[e], self.t
        if st.head >= len(st.insns):
            return None
        i = st.insns[st.head]
        if i >= self.dispatched:
            return None
        if e is Engine.COMPUTE and st.records and st.records[-1].pushed is None:
            return None                   # one instruction at a time
        insn = self.insns[i]
        if e is not Engine.COMPUTE:
            k = st.head - t.pending_pushes
            if k >= 0 and st.records[k].pushed is None:
                return None               # launched ones fill the pending pushes
        if e is Engine.STORE:
            buf, owner = self.store_owner
            if buf is not None and buf != _store_writer(insn) and owner.finish is None:
                return None               # the other writer's writes still owe responses
        ready = max(self.dispatch[i] + t.queue_latency, st.free) + t.take_to_pop
        for flag, q in _POPS[e]:
            if getattr(insn, flag):
                when = self._token(q, len(self.pops[q]))
                if when is None:
                    return None
                ready = max(ready, when)
        return ready

    # ------------------------------------------------------------------ taking a step

    def take(self, ready: int, kind: str, arg: Any) -> None:
        if kind == "chunk":
            first = self.chunks * FETCH_CHUNK
            count = min(FETCH_CHUNK, self.n - first)
            self.reads.append(_Read("fetch", ready, count * self.beat_cycles, None, first_insn=first, count=count))
            self.chunks += 1
            self.last_chunk = ready
        elif kind == "dispatch":
            self.dispatch[arg] = ready
            self.dispatched += 1
        elif kind == "grant":
            self._grant(ready)
        else:
            self._start(arg, ready)
        self._resolve_pushes()

    def _grant(self, when: int) -> None:
        t = self.t
        waiting = [r for r in self.reads if r.request + t.request_latency <= when]
        owner = _CLIENTS[self.read_owner]
        chained = [r for r in waiting if r.client == owner and r.request <= self.read_free]
        others = [r for r in waiting if r.client != owner and r.request <= (chained[0].request if chained else 0)]
        if chained and not others:
            read = chained[0]
            # The program's first read (fetch's) is the owner's too, but nobody holds the
            # channels yet: its request is registered before its grant.
            seen = read.request + (t.request_latency if not self.read_granted else 0)
            end = max(self.read_free, seen + t.chain_gap) + read.cycles
            wait = 0
        else:
            # Round robin: the first requester after the last owner.
            order = {c: (k - self.read_owner - 1) % len(_CLIENTS) for k, c in enumerate(_CLIENTS)}
            read = min(waiting, key=lambda r: (order[r.client], r.request))
            grant = when + t.read_grant
            end = grant + t.read_latency + read.cycles
            wait = grant - read.request
        self.reads.remove(read)
        self.read_free, self.read_owner, self.read_granted = end, _CLIENTS.index(read.client), True
        if read.record is None:           # a fetch chunk: its words, a beat group each
            for j in range(read.count):
                self.arrive[read.first_insn + j] = end - (read.count - 1 - j) * self.beat_cycles + t.fetch_check
            return
        rec = read.record
        engine = self.kind[rec.index]
        self.engines[engine].mem_stall += wait
        if engine is Engine.LOAD:
            # The tile is written when its last beat and its trailing padding are, and not
            # before the writer has walked every position.
            rec.finish = max(end + rec.trail + t.load_write, rec.earliest)
        else:
            rec.finish = end + t.compute_load_write

    def _start(self, e: Engine, ready: int) -> None:
        t, st = self.t, self.engines[e]
        i = st.insns[st.head]
        insn = self.insns[i]
        take = max(self.dispatch[i] + t.queue_latency, st.free)
        st.taken.append(take)
        st.head += 1
        st.token_stall += ready - (take + t.take_to_pop)
        for flag, q in _POPS[e]:
            if getattr(insn, flag):
                self.pops[q].append(ready)
        start = ready + t.pop_to_exec
        rec = _Record(i, insn, take)
        st.records.append(rec)
        if e is Engine.COMPUTE:
            if isinstance(insn, (Gemm, Alu)):
                uops = insn.uop_count
                if isinstance(insn, Gemm):
                    self.counters["gemm_active"] += uops
                    self.counters["gemm_reset"] += uops if insn.reset else 0
                else:
                    self.counters["alu_active"] += uops
                rec.finish = start + compute_cycles(insn, t) + t.compute_fixed - t.take_to_pop - t.pop_to_exec \
                    - t.push_after
            elif isinstance(insn, Load):
                _, cycles = dma_beats(insn, self.config, t)
                # Like the load engine's, its tile loader takes the command a cycle after EXEC.
                self.reads.append(_Read(_READ_CLIENT[insn.mem], start + 1, cycles, rec))
            else:                                     # FINISH
                rec.finish = start
        elif e is Engine.LOAD:
            launch = max(start, self.loader_free[insn.mem])
            beats, cycles = dma_beats(insn, self.config, t)
            lead, rec.trail = _pad_cycles(insn, self.config)
            # The writer walks the padding too; the leading rows go out while the data is on its way.
            rec.earliest = launch + 1 + lead + beats + rec.trail + t.load_write
            self.reads.append(_Read(_READ_CLIENT[insn.mem], launch + 1, cycles, rec))
            self.loader_free[insn.mem] = launch + 1
            st.free = launch + 1
        else:                                         # STORE
            launch = max(start, self.store_sram_free)
            _, cycles = dma_beats(insn, self.config, t)
            first = launch + t.store_issue
            last_beat = first + cycles
            self.store_sram_free = last_beat - t.store_issue
            rec.finish = last_beat + t.write_response
            self.store_owner = (_store_writer(insn), rec)
            st.free = launch + 1

    def _resolve_pushes(self) -> None:
        """Perform, in program order, the pushes of instructions whose work is done and whose
        queues have room."""
        t = self.t
        for e, st in self.engines.items():
            while st.next_push < len(st.records):
                rec = st.records[st.next_push]
                finish = rec.finish
                if finish is None:
                    break
                when = finish + t.push_after
                if st.next_push:
                    when = max(when, st.records[st.next_push - 1].pushed + 1)
                blocked = False
                for flag, q in _PUSHES[e]:
                    if getattr(rec.insn, flag):
                        k = len(self.pushes[q]) - t.token_queue_depth
                        if k >= 0:
                            if k >= len(self.pops[q]):
                                blocked = True
                                break
                            when = max(when, self.pops[q][k] + 1)
                if blocked:
                    break
                st.token_stall += when - (finish + t.push_after) if e is Engine.COMPUTE else 0
                for flag, q in _PUSHES[e]:
                    if getattr(rec.insn, flag):
                        self.pushes[q].append(when)
                rec.pushed = self.retire[rec.index] = when
                st.next_push += 1
                st.busy += max(0, when - max(rec.take, st.busy_end))
                st.busy_end = max(st.busy_end, when)
                if e is Engine.COMPUTE:
                    st.free = when + 1
                    if isinstance(rec.insn, Finish):
                        self.finish_time = when + t.finish

    def run(self) -> CycleReport:
        while self.finish_time is None:
            steps = self.steps()
            if not steps:
                raise CycleModelError(_deadlock_report(self.insns, self.engines, self.dispatched))
            ready, _, kind, arg = min(steps, key=lambda s: (s[0], s[1]))
            self.take(ready, kind, arg)
        counters = dict(self.counters)
        for e, st in self.engines.items():
            counters[f"{e.value}_busy"] = st.busy
            counters[f"{e.value}_token_stall"] = st.token_stall
            counters[f"{e.value}_mem_stall"] = st.mem_stall
        return CycleReport(cycles=int(self.finish_time), counters=counters, instructions=self.n,
                           retire=self.retire)


def run_cycle_model(instructions: Iterable[Instruction], config, timing: Timing | None = None, *,
                    arena: np.ndarray | None = None) -> CycleReport:
    """Predict the cycles of ``instructions`` (a whole program ending in FINISH) on ``config``.

    ``arena`` is the DRAM image the instructions address (`Program.arena_image`); with it, a
    GEMM/ALU loop whose micro-ops index outside a buffer is refused as fsim refuses it
    (`check_micro_op_loops`), since the micro-ops are data the instructions alone do not hold."""
    insns = list(instructions)
    if not insns or not isinstance(insns[-1], Finish):
        raise CycleModelError("a program must end with FINISH")
    from .fsim import FsimError, check_dispatch, check_micro_op_loops, check_token_balance
    try:
        # What fsim and the hardware refuse is not timed: their dispatch checks first, then the
        # micro-op loops' ranges; a token deadlock then gets the model's own report; tokens left
        # over once it ran, this one.
        check_dispatch(insns, config)
        if arena is not None:
            check_micro_op_loops(insns, config, arena)
        report = _Model(insns, config, timing or timing_of(config)).run()
        check_token_balance(insns)
    except FsimError as exc:
        raise CycleModelError(str(exc)) from None
    return report


def _deadlock_report(insns, engines, dispatched) -> str:
    heads = []
    for e, st in engines.items():
        if st.head < len(st.insns):
            i = st.insns[st.head]
            heads.append(f"{e.value} waits at instruction {i} ({type(insns[i]).__name__})")
    return ("the program's dependency tokens deadlock: " + "; ".join(heads) +
            f" ({dispatched} of {len(insns)} instructions dispatched)")
