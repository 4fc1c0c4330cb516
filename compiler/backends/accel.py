"""The ``accel`` back end: loop IR → `Program` (instructions, micro-ops, DRAM layout).

Its stages, in order (`ACCEL_STAGES`):

1. ``layout_dram``: every DRAM tensor gets an aligned region of the arena.
2. ``emit_instructions``: the loops left in the IR are host loops; they are
   unrolled at compile time (the program is a static instruction stream) and
   every `DmaCopy` / `HwLoopTask` becomes a LOAD, STORE, GEMM or ALU with
   concrete fields, each with the on-chip ranges it reads and writes. A tile
   lying entirely in zero padding is loaded from a zero block in the arena.
3. ``deduplicate_uops``: identical micro-op kernels are stored once; if they
   all fit the micro-op buffer they are loaded by one LOAD at the start,
   otherwise a small cache reloads kernels on demand.
4. ``finish``: the FINISH instruction, a barrier on everything on chip.
5. ``insert_dependency_tokens``: exact dataflow over on-chip ranges decides
   every cross-engine dependency (load→compute read-after-write,
   compute→load write-after-read, compute→store, store→compute), and a
   minimal matched set of push/pop flags enforces them, within the token
   queues' capacity (see `insert_dependency_tokens`). Double-buffered virtual
   threads show up here as missing conflicts, which is what lets the engines
   overlap.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from gemforge.hw.program import Program, TensorRegion, arena_alignment
from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import (
    Alu, AluOp, Engine, Finish, Gemm, Instruction, IsaError, Load, MemType, Opcode, Store, Uop, engine_of,
    fields_of, uop_fields, validate, validate_uop,
)

from ..ir import (
    AttrStmt, Buffer, DmaCopy, Evaluate, Expr, For, ForKind, GemmIntrin, HwLoopTask, IfThenElse,
    Seq, Stmt, Var, compile_expr, evaluate, linear_coefficient,
)
from ..errors import CompileError

__all__ = ["build_program", "insert_dependency_tokens", "AccelCompileError", "ACCEL_STAGES", "Emitted"]

ACCEL_STAGES = ("layout_dram", "emit_instructions", "deduplicate_uops", "finish", "insert_dependency_tokens")

_ALU_OPS = {"min": AluOp.MIN, "max": AluOp.MAX, "add": AluOp.ADD, "shr": AluOp.SHR, "mul": AluOp.MUL}
_SCOPE_MEM = {"inp": MemType.INP, "wgt": MemType.WGT, "acc": MemType.ACC}
# On-chip resources for dependency analysis; out mirrors acc index for index.
_RESOURCE = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc", MemType.OUT: "acc",
             MemType.UOP: "uop"}
_ALL = (0, 1 << 62)


class AccelCompileError(CompileError):
    """The loop IR cannot be turned into an accelerator program."""


@dataclass
class Emitted:
    """One instruction with what it touches on chip and, for GEMM/ALU, its micro-op kernel."""

    insn: Instruction
    reads: list[tuple[str, int, int]] = field(default_factory=list)   # (resource, first, last)
    writes: list[tuple[str, int, int]] = field(default_factory=list)
    kernel: tuple[Uop, ...] | None = None


# ============================================================================ stage 1: DRAM layout

def layout_dram(config: AccelConfig, tensors: Sequence[Buffer]) -> tuple[dict[Buffer, TensorRegion], int]:
    """Aligned arena regions for the DRAM tensors; returns them and the end offset."""
    align = arena_alignment(config)
    regions: dict[Buffer, TensorRegion] = {}
    offset = 0
    for buf in tensors:
        region = TensorRegion(buf.name, offset, tuple(int(d) for d in buf.shape), np.dtype(buf.dtype).name)
        regions[buf] = region
        offset += -(-region.nbytes // align) * align
    return regions, offset


# ============================================================================ stage 2: emission

class _Emitter:
    def __init__(self, config: AccelConfig, regions: dict[Buffer, TensorRegion]) -> None:
        self.config = config
        self.regions = regions
        self.out: list[Emitted] = []
        self.env: dict[Var, int] = {}
        self._factors: dict[int, dict] = {}
        self.zero_loads: list[Emitted] = []
        # Expressions are evaluated once per host-loop iteration: compile them to Python.
        self._compiled: dict[int, tuple[Expr, Callable[[dict], int]]] = {}
        self._ranges = {op: [(f.name, f.lo, f.hi) for f in fields_of(config, op)
                             if f.name not in ("opcode", "use_imm")] for op in Opcode}
        self._uop_hi = tuple(f.hi for f in uop_fields(config))

    def ev(self, expr: Expr) -> int:
        entry = self._compiled.get(id(expr))
        if entry is None:
            try:
                fn = compile_expr(expr)
            except ValueError:
                fn = lambda env, e=expr: evaluate(e, env)  # noqa: E731
            entry = self._compiled[id(expr)] = (expr, fn)  # the expr is kept so its id stays unique
        return entry[1](self.env)

    def run(self, stmt: Stmt) -> list[Emitted]:
        self.visit(stmt)
        return self.out

    def visit(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                self.visit(c)
        elif isinstance(s, For):
            if s.kind in (ForKind.PARALLEL, ForKind.VECTORIZED, ForKind.THREAD_BINDING, ForKind.VTHREAD):
                raise AccelCompileError(
                    f"loop {s.var.name} is {s.kind.value}; the accelerator back end runs host loops "
                    "serially (use vthread for latency hiding, lowered by inject_virtual_threads)")
            for i in range(self.ev(s.extent)):
                self.env[s.var] = i
                self.visit(s.body)
            self.env.pop(s.var, None)
        elif isinstance(s, IfThenElse):
            if self.ev(s.cond):
                self.visit(s.then)
            elif s.other is not None:
                self.visit(s.other)
        elif isinstance(s, AttrStmt):
            self.visit(s.body)
        elif isinstance(s, DmaCopy):
            self.dma(s)
        elif isinstance(s, HwLoopTask):
            self.task(s)
        elif isinstance(s, Evaluate):
            pass
        else:
            raise AccelCompileError(
                f"statement {type(s).__name__} was not mapped to an accelerator instruction: every "
                "stage needs a dma_copy or alu pragma, or a tensorize mark")

    def _dram_base(self, buf: Buffer, mem: MemType, offset: int) -> int:
        region = self.regions.get(buf)
        if region is None:
            raise AccelCompileError(f"DRAM tensor {buf.name} is not one of the program's tensors")
        entry = self.config.entry_bytes(mem.buffer)
        elem = np.dtype(buf.dtype).itemsize * int(np.prod(buf.shape[len(buf.shape) - buf.entry_dims:]))
        if elem != entry:
            raise AccelCompileError(f"tensor {buf.name} has {elem}-byte entries but the {mem.buffer} buffer "
                                    f"moves {entry}-byte entries")
        return region.offset // entry + offset

    def dma(self, s: DmaCopy) -> None:
        ev = self.ev
        y, x = ev(s.y_size), ev(s.x_size)
        sram = ev(s.sram.offset)
        if s.direction == "load" and (y < 1 or x < 1):
            # The tile lies entirely in the zero padding (a border chunk of kernel
            # rows): copy zeros from a zero block the back end adds to the arena.
            mem = _SCOPE_MEM[s.sram.buffer.scope]
            total = (ev(s.y_pad0) + y + ev(s.y_pad1)) * (ev(s.x_pad0) + x + ev(s.x_pad1))
            insn = Load(mem=mem, sram_base=sram, dram_base=0, y_size=1, x_size=total, x_stride=total)
            self._check(insn)
            rec = Emitted(insn, writes=[(_RESOURCE[mem], sram, sram + total - 1)])
            self.zero_loads.append(rec)
            self.out.append(rec)
            return
        if y < 1 or x < 1:
            raise AccelCompileError(f"a DMA of {s.sram.buffer.name} has an empty tile ({y}×{x})")
        if s.direction == "load":
            mem = _SCOPE_MEM[s.sram.buffer.scope]
            pads = dict(y_pad0=ev(s.y_pad0), y_pad1=ev(s.y_pad1), x_pad0=ev(s.x_pad0), x_pad1=ev(s.x_pad1))
            insn: Instruction = Load(mem=mem, sram_base=sram, dram_base=self._dram_base(s.dram.buffer, mem, ev(s.dram.offset)),
                                     y_size=y, x_size=x, x_stride=s.x_stride, **pads)
            rows = pads["y_pad0"] + y + pads["y_pad1"]
            pitch = pads["x_pad0"] + x + pads["x_pad1"]
            rec = Emitted(insn, writes=[(_RESOURCE[mem], sram, sram + rows * pitch - 1)])
        else:
            bits = np.dtype(s.dram.buffer.dtype).itemsize * 8
            c = self.config
            if bits == c.out_width and c.out_width < c.acc_width:
                mem = MemType.OUT
            elif bits == c.acc_width:
                mem = MemType.ACC
            else:
                raise AccelCompileError(f"output {s.dram.buffer.name} is {s.dram.buffer.dtype}; the store "
                                        f"engine writes {c.out_width}-bit (out) or {c.acc_width}-bit (acc) values")
            insn = Store(mem=mem, sram_base=sram, dram_base=self._dram_base(s.dram.buffer, mem, ev(s.dram.offset)),
                         y_size=y, x_size=x, x_stride=s.x_stride)
            rec = Emitted(insn, reads=[("acc", sram, sram + y * x - 1)])
        self._check(insn)
        self.out.append(rec)

    def _task_factors(self, s: HwLoopTask) -> dict[str, tuple[int, int]]:
        cached = self._factors.get(id(s))
        if cached is None:
            b = s.body
            refs = {"dst": b.dst, "src": b.src, "wgt": getattr(b, "wgt", None)}
            cached = {}
            for name, ref in refs.items():
                if ref is None:
                    cached[name] = (0, 0)
                    continue
                cached[name] = tuple(linear_coefficient(ref.offset, v) for v, _ in s.hw_loops)
            self._factors[id(s)] = cached
        return cached

    def task(self, s: HwLoopTask) -> None:
        env = self.env
        ev = self.ev
        iters = [ev(e) for _, e in s.hw_loops]
        if min(iters) < 1:
            return
        for v, _ in s.hw_loops:
            env[v] = 0
        b = s.body
        uops: list[Uop] = []

        def walk(level: int) -> None:
            if level == len(s.uop_loops):
                dst = ev(b.dst.offset)
                if isinstance(b, GemmIntrin):
                    if b.reset:
                        uops.append(Uop(dst, 0, 0))
                    else:
                        uops.append(Uop(dst, ev(b.src.offset), ev(b.wgt.offset)))
                else:
                    src = dst if b.src is None else ev(b.src.offset)
                    uops.append(Uop(dst, src, 0))
                return
            var, ext = s.uop_loops[level]
            for i in range(ev(ext)):
                env[var] = i
                walk(level + 1)
            env.pop(var, None)
        walk(0)
        for v, _ in s.hw_loops:
            env.pop(v, None)
        if not uops:
            return
        f = self._task_factors(s)
        # A loop of one iteration never steps: its factor is 0 (a step as large as
        # the whole buffer would not even fit the factor field).
        f = {k: tuple(v if n > 1 else 0 for v, n in zip(fac, iters)) for k, fac in f.items()}
        loops = dict(iter_out=iters[0], iter_in=iters[1],
                     dst_factor_out=f["dst"][0], dst_factor_in=f["dst"][1],
                     src_factor_out=f["src"][0], src_factor_in=f["src"][1])

        def span(values: list[int], fo: int, fi: int) -> tuple[int, int]:
            return min(values), max(values) + (iters[0] - 1) * fo + (iters[1] - 1) * fi

        dst_lo, dst_hi = span([u.dst for u in uops], *f["dst"])
        if isinstance(b, GemmIntrin):
            insn: Instruction = Gemm(reset=b.reset, uop_bgn=0, uop_end=len(uops),
                                     wgt_factor_out=f["wgt"][0], wgt_factor_in=f["wgt"][1], **loops)
            rec = Emitted(insn, writes=[("acc", dst_lo, dst_hi)], kernel=tuple(uops))
            if not b.reset:
                rec.reads = [("inp", *span([u.src for u in uops], *f["src"])),
                             ("wgt", *span([u.wgt for u in uops], *f["wgt"]))]
        else:
            insn = Alu(op=_ALU_OPS[b.op], imm=b.imm, uop_bgn=0, uop_end=len(uops), **loops)
            rec = Emitted(insn, writes=[("acc", dst_lo, dst_hi)], kernel=tuple(uops))
            if b.src is not None:
                rec.reads = [("acc", *span([u.src for u in uops], *f["src"]))]
        self._check(dataclasses.replace(insn, uop_bgn=0, uop_end=1))
        hi = self._uop_hi
        for u in uops:
            if not (0 <= u.dst <= hi[0] and 0 <= u.src <= hi[1] and 0 <= u.wgt <= hi[2]):
                try:
                    validate_uop(u, self.config)
                except IsaError as exc:
                    raise AccelCompileError(f"micro-op {u} of a {s.kind} instruction: {exc}") from None
        self.out.append(rec)

    def _check(self, insn: Instruction) -> None:
        """Every field in range (the full ISA check, with its message, only on failure)."""
        for name, lo, hi in self._ranges[insn.opcode]:
            value = getattr(insn, name)
            if value is None:  # an ALU without immediate
                continue
            if not lo <= int(value) <= hi:
                try:
                    validate(insn, self.config)
                except IsaError as exc:
                    raise AccelCompileError(
                        f"the schedule produced an instruction the ISA cannot encode: {exc}") from None


# ============================================================================ stage 3: micro-ops

def deduplicate_uops(config: AccelConfig, emitted: list[Emitted]) -> tuple[list[Emitted], list[Uop], list[int]]:
    """Store each distinct kernel once and give every GEMM/ALU its micro-op range.

    Returns the instruction stream (with micro-op LOADs inserted), the micro-op
    table for DRAM and, per kernel, its offset in that table."""
    kernels: dict[tuple[Uop, ...], int] = {}
    table: list[Uop] = []
    offsets: list[int] = []
    for rec in emitted:
        if rec.kernel is not None and rec.kernel not in kernels:
            if len(rec.kernel) > config.uop_depth:
                raise AccelCompileError(f"a kernel of {len(rec.kernel)} micro-ops exceeds the "
                                        f"{config.uop_depth}-entry micro-op buffer")
            kernels[rec.kernel] = len(offsets)
            offsets.append(len(table))
            table.extend(rec.kernel)
    out: list[Emitted] = []
    max_x = (1 << 15)

    def uop_load(sram: int, dram: int, count: int) -> list[Emitted]:
        loads = []
        for start in range(0, count, max_x):
            n = min(max_x, count - start)
            loads.append(Emitted(Load(mem=MemType.UOP, sram_base=sram + start, dram_base=dram + start,
                                      y_size=1, x_size=n, x_stride=n),
                                 writes=[("uop", sram + start, sram + start + n - 1)]))
        return loads

    if len(table) <= config.uop_depth:
        # Everything resident: one load up front, kernels at their table offsets.
        if table:
            out.extend(uop_load(0, 0, len(table)))
        for rec in emitted:
            if rec.kernel is not None:
                base = offsets[kernels[rec.kernel]]
                rec.insn = dataclasses.replace(rec.insn, uop_bgn=base, uop_end=base + len(rec.kernel))
            out.append(rec)
        return out, table, offsets
    # Too many kernels for the buffer: a cache filled in order and flushed when full.
    resident: dict[int, int] = {}
    top = 0
    for rec in emitted:
        if rec.kernel is not None:
            k = kernels[rec.kernel]
            if k not in resident:
                n = len(rec.kernel)
                if top + n > config.uop_depth:
                    resident.clear()
                    top = 0
                out.extend(uop_load(top, offsets[k], n))
                resident[k] = top
                top += n
            base = resident[k]
            rec.insn = dataclasses.replace(rec.insn, uop_bgn=base, uop_end=base + len(rec.kernel))
        out.append(rec)
    return out, table, offsets


# ============================================================================ stage 4: dependency tokens

# queue (from, to) → (push flag on the producer, pop flag on the consumer)
_QUEUES = {
    (Engine.LOAD, Engine.COMPUTE): ("push_next", "pop_prev"),
    (Engine.COMPUTE, Engine.LOAD): ("push_prev", "pop_next"),
    (Engine.COMPUTE, Engine.STORE): ("push_next", "pop_prev"),
    (Engine.STORE, Engine.COMPUTE): ("push_prev", "pop_next"),
}


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
    history: dict[Engine, list[int]] = {e: [] for e in Engine}
    pairs: dict[tuple[Engine, Engine], list[tuple[int, int]]] = {q: [] for q in _QUEUES}
    flags: list[dict[str, bool]] = [dict() for _ in emitted]
    for i, rec in enumerate(emitted):
        b_engine = engine_of(rec.insn)
        for queue, (push, pop) in _QUEUES.items():
            a_engine, to = queue
            if to is not b_engine:
                continue
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
            flags[chosen][push] = True
            flags[i][pop] = True
            made.append((chosen, i))
        history[b_engine].append(i)
    return [dataclasses.replace(rec.insn, **f) if f else rec.insn for rec, f in zip(emitted, flags)]


# ============================================================================ the back end

def build_program(stmt: Stmt, config: AccelConfig, tensors: Sequence[Buffer]) -> Program:
    """Loop IR (after the accelerator passes) → a relocatable `Program`, stage by stage."""
    align = arena_alignment(config)
    regions, end = layout_dram(config, tensors)                                   # layout_dram
    emitter = _Emitter(config, regions)
    emitted = emitter.run(stmt)                                                   # emit_instructions
    constants, end = _zero_blocks(config, emitter.zero_loads, regions, end)
    emitted, table, _ = deduplicate_uops(config, emitted)                         # deduplicate_uops
    uop_offset = end  # the micro-op table follows the tensors
    for rec in emitted:
        if isinstance(rec.insn, Load) and rec.insn.mem == MemType.UOP:
            rec.insn = dataclasses.replace(rec.insn, dram_base=rec.insn.dram_base + uop_offset // config.uop_entry_bytes)
    # FINISH is a barrier on everything on chip, so it waits for the last store.
    everything = [(r, *_ALL) for r in ("inp", "wgt", "acc")]
    emitted.append(Emitted(Finish(), reads=everything, writes=everything))        # finish
    insns = insert_dependency_tokens(emitted, config.token_queue_depth)           # insert_dependency_tokens
    arena = -(-(uop_offset + len(table) * config.uop_entry_bytes) // align) * align
    return Program(config, insns, table, uop_offset=uop_offset, arena_bytes=max(align, arena),
                   tensors={r.name: r for r in regions.values()}, constants=constants)


def _zero_blocks(config: AccelConfig, zero_loads: list[Emitted], regions: dict,
                 end: int) -> tuple[dict[str, np.ndarray], int]:
    """Zero constants at ``end`` for loads of all-padding tiles, which are pointed at
    them; returns the constants and the new end of the arena."""
    constants: dict[str, np.ndarray] = {}
    align = arena_alignment(config)
    by_mem: dict[MemType, list[Emitted]] = {}
    for rec in zero_loads:
        by_mem.setdefault(rec.insn.mem, []).append(rec)
    for mem, recs in by_mem.items():
        need = max(r.insn.x_size for r in recs)
        shape = {MemType.INP: (config.batch, config.block_in), MemType.WGT: (config.block_out, config.block_in),
                 MemType.ACC: (config.batch, config.block_out)}[mem]
        width = {MemType.INP: config.inp_width, MemType.WGT: config.wgt_width, MemType.ACC: config.acc_width}[mem]
        name = f"zeros.{mem.buffer}"
        region = TensorRegion(name, end, (need, *shape), np.dtype(f"<i{width // 8}").name)
        regions[Buffer(name, region.shape, region.dtype)] = region
        constants[name] = np.zeros(region.shape, region.dtype)
        for rec in recs:
            rec.insn = dataclasses.replace(rec.insn, dram_base=end // config.entry_bytes(mem.buffer))
        end += -(-region.nbytes // align) * align
    return constants, end

