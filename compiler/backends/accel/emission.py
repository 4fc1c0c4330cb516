"""Program emission: the accelerator's loop IR becomes instructions with concrete fields.

The state of the emission stages is an `AccelBuild`: the function being
compiled, then the DRAM layout, the emitted instructions (each an `Emitted`
with the on-chip ranges it reads and writes), the micro-op table, and the
constants the program carries. Stages (see `stages`):

- `layout_dram`: every DRAM tensor (a parameter of the function) gets an
  aligned region of the arena;
- `emit_instructions`: the loops left in the IR are host loops; they are
  unrolled at compile time (the program is a static instruction stream) and
  every `DmaCopy` / `HwLoopTask` becomes a LOAD, STORE, GEMM or ALU. A tile
  lying entirely in zero padding is loaded from a zero block in the arena;
- `finish`: the FINISH instruction, a barrier on everything on chip.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from gemforge.hw.asm import format_instruction
from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import (
    Alu, AluOp, Finish, Gemm, Instruction, IsaError, Load, MemType, Opcode, Store, Uop, fields_of, uop_fields,
    validate, validate_uop,
)
from gemforge.hw.program import TensorRegion, arena_alignment

from ...errors import CompileError
from ...ir import (
    AttrStmt, Buffer, Evaluate, Expr, For, ForKind, IfThenElse, PrimFunc, Seq, Stmt, Var, compile_expr, evaluate,
    linear_coefficient,
)
from .nodes import DmaCopy, GemmIntrin, HwLoopTask

__all__ = ["AccelCompileError", "Emitted", "AccelBuild", "layout_dram", "emit_instructions", "finish",
           "split_transfer"]

_ALU_OPS = {"min": AluOp.MIN, "max": AluOp.MAX, "add": AluOp.ADD, "shr": AluOp.SHR, "mul": AluOp.MUL}
_SCOPE_MEM = {"inp": MemType.INP, "wgt": MemType.WGT, "acc": MemType.ACC}
# On-chip resources for dependency analysis; out mirrors acc index for index.
RESOURCE = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc", MemType.OUT: "acc",
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


@dataclass
class AccelBuild:
    """An accelerator program while the emission stages build it."""

    func: PrimFunc
    config: AccelConfig
    regions: dict[Buffer, TensorRegion] = field(default_factory=dict)
    arena_end: int = 0                  # bytes of the arena laid out so far
    emitted: list[Emitted] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    uop_table: list[Uop] = field(default_factory=list)
    uop_offset: int = 0                 # byte offset of the micro-op table in the arena

    def __str__(self) -> str:
        """The instruction stream so far, as assembly (what `trace` prints)."""
        lines = [f"// {len(self.emitted)} instructions, arena {self.arena_end} bytes"]
        for name, region in ((r.name, r) for r in self.regions.values()):
            lines.append(f"// tensor {name}: offset {region.offset}, {region.dtype}{list(region.shape)}")
        limit = 200
        lines += [format_instruction(e.insn, self.config) for e in self.emitted[:limit]]
        if len(self.emitted) > limit:
            lines.append(f"// ... {len(self.emitted) - limit} more")
        return "\n".join(lines)


# ============================================================================ DRAM layout

def layout_dram(func: PrimFunc, config: AccelConfig) -> AccelBuild:
    """Aligned arena regions for the function's DRAM tensors (its parameters, in order)."""
    align = arena_alignment(config)
    build = AccelBuild(func, config)
    offset = 0
    for buf in func.params:
        region = TensorRegion(buf.name, offset, tuple(int(d) for d in buf.shape), np.dtype(buf.dtype).name)
        build.regions[buf] = region
        offset += -(-region.nbytes // align) * align
    build.arena_end = offset
    return build


# ============================================================================ emission

def emit_instructions(build: AccelBuild) -> AccelBuild:
    """Unroll the host loops and emit every DMA and hardware-loop task as an instruction."""
    emitter = _Emitter(build.config, build.regions)
    build.emitted = emitter.run(build.func.body)
    _zero_blocks(build, emitter.zero_loads)
    return build


def finish(build: AccelBuild) -> AccelBuild:
    """Append FINISH, a barrier on everything on chip (so it waits for the last store)."""
    everything = [(r, *_ALL) for r in ("inp", "wgt", "acc")]
    build.emitted.append(Emitted(Finish(), reads=everything, writes=everything))
    return build


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
        self._dma_limits = {f.name: f.hi for f in fields_of(config, Opcode.LOAD)
                            if f.name in ("y_size", "x_size", "x_stride")}

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
        elem = np.dtype(buf.dtype).itemsize * int(np.prod(buf.shape[len(buf.shape) - buf.tile_dims:]))
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
            self._zeros(mem, sram, total)
            return
        if y < 1 or x < 1:
            raise AccelCompileError(f"a DMA of {s.sram.buffer.name} has an empty tile ({y}×{x})")
        if s.direction == "load":
            mem = _SCOPE_MEM[s.sram.buffer.scope]
            pads = dict(y_pad0=ev(s.y_pad0), y_pad1=ev(s.y_pad1), x_pad0=ev(s.x_pad0), x_pad1=ev(s.x_pad1))
            insn: Instruction = Load(mem=mem, sram_base=sram, dram_base=self._dram_base(s.dram.buffer, mem, ev(s.dram.offset)),
                                     y_size=y, x_size=x, x_stride=s.x_stride, **pads)
            self._transfer(insn)
            return
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
            self._transfer(insn)

    def _transfer(self, insn: Load | Store) -> None:
        """Emit a LOAD or STORE, as several when its rows, row length or row stride exceed
        their fields (`split_transfer`), each with the on-chip range it touches."""
        pieces, zeros = split_transfer(insn, self._dma_limits)
        for mem, sram, count in zeros:
            self._zeros(mem, sram, count)
        for piece in pieces:
            self._check(piece)
            if isinstance(piece, Load):
                rows = piece.y_pad0 + piece.y_size + piece.y_pad1
                pitch = piece.x_pad0 + piece.x_size + piece.x_pad1
                rec = Emitted(piece, writes=[(RESOURCE[piece.mem], piece.sram_base,
                                              piece.sram_base + rows * pitch - 1)])
            else:
                rec = Emitted(piece, reads=[("acc", piece.sram_base, piece.sram_base + piece.y_size * piece.x_size - 1)])
            self.out.append(rec)

    def _zeros(self, mem: MemType, sram: int, count: int) -> None:
        """LOADs of ``count`` zero entries at ``sram`` from the arena's zero block (`_zero_blocks`
        points them at it), in rows no longer than the x_size field holds."""
        longest = self._dma_limits["x_size"]
        for start in range(0, count, longest):
            n = min(longest, count - start)
            insn = Load(mem=mem, sram_base=sram + start, dram_base=0, y_size=1, x_size=n, x_stride=n)
            self._check(insn)
            rec = Emitted(insn, writes=[(RESOURCE[mem], sram + start, sram + start + n - 1)])
            self.zero_loads.append(rec)
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




def split_transfer(insn: Load | Store, limits: dict[str, int]) -> tuple[list[Load | Store], list[tuple]]:
    """``insn`` as transfers whose ``y_size``, ``x_size`` and ``x_stride`` are at most
    ``limits`` (the fields' largest values), moving the same entries to the same places:
    (the transfers, and the zero runs ``(mem, sram_base, count)`` a LOAD's padding rows
    become when its rows are cut into pieces).

    A feature map of 65,536 pixels or more per channel gives tiles whose rows (one per
    channel block) lie that far apart, or a row that long; the tile is cut into groups of
    rows (one row a transfer when the stride does not fit: the stride of one row is
    unused) and a row too long into runs. A LOAD's padding stays with its pieces: the
    rows above go with the first group and those below with the last; a row cut into
    runs has its padding rows written as zero runs, and a row with left or right
    padding is never cut (refused)."""
    max_y, max_x, max_stride = limits["y_size"], limits["x_size"], limits["x_stride"]
    y, x, stride = insn.y_size, insn.x_size, insn.x_stride
    if y == 1 and stride > max_stride:
        insn = dataclasses.replace(insn, x_stride=0)         # one row: its stride is never used
    if y <= max_y and x <= max_x and (y == 1 or stride <= max_stride):
        return [insn], []
    load = isinstance(insn, Load)
    pads = (insn.y_pad0, insn.y_pad1, insn.x_pad0, insn.x_pad1) if load else (0, 0, 0, 0)
    pitch = pads[2] + x + pads[3]                # on-chip entries per row
    if x <= max_x:
        step = max_y if stride <= max_stride else 1
        pieces = []
        for first in range(0, y, step):
            rows = min(step, y - first)
            fields = dict(sram_base=insn.sram_base + (first + pads[0] if first else 0) * pitch,
                          dram_base=insn.dram_base + first * stride, y_size=rows,
                          x_stride=stride if rows > 1 else 0)
            if load:
                fields.update(y_pad0=pads[0] if first == 0 else 0, y_pad1=pads[1] if first + rows == y else 0)
            pieces.append(dataclasses.replace(insn, **fields))
        return pieces, []
    if pads[2] or pads[3]:
        raise AccelCompileError(f"a {'LOAD' if load else 'STORE'} row of {x:,} entries is longer than the "
                                f"{max_x:,} one instruction moves, and its left or right zero padding cannot be "
                                "split with it; use a smaller tile")
    pieces, zeros = [], []
    if pads[0]:
        zeros.append((insn.mem, insn.sram_base, pads[0] * x))
    for row in range(y):
        for start in range(0, x, max_x):
            fields = dict(sram_base=insn.sram_base + (pads[0] + row) * x + start,
                          dram_base=insn.dram_base + row * stride + start, y_size=1,
                          x_size=min(max_x, x - start), x_stride=0)
            if load:
                fields.update(y_pad0=0, y_pad1=0)
            pieces.append(dataclasses.replace(insn, **fields))
    if pads[1]:
        zeros.append((insn.mem, insn.sram_base + (pads[0] + y) * x, pads[1] * x))
    return pieces, zeros


def _zero_blocks(build: AccelBuild, zero_loads: list[Emitted]) -> None:
    """Zero constants at the end of the arena for loads of all-padding tiles, which
    are pointed at them."""
    config = build.config
    align = arena_alignment(config)
    by_mem: dict[MemType, list[Emitted]] = {}
    for rec in zero_loads:
        by_mem.setdefault(rec.insn.mem, []).append(rec)
    end = build.arena_end
    for mem, recs in by_mem.items():
        need = max(r.insn.x_size for r in recs)
        shape = {MemType.INP: (config.batch, config.block_in), MemType.WGT: (config.block_out, config.block_in),
                 MemType.ACC: (config.batch, config.block_out)}[mem]
        width = {MemType.INP: config.inp_width, MemType.WGT: config.wgt_width, MemType.ACC: config.acc_width}[mem]
        name = f"zeros.{mem.buffer}"
        region = TensorRegion(name, end, (need, *shape), np.dtype(f"<i{width // 8}").name)
        build.regions[Buffer(name, region.shape, region.dtype)] = region
        build.constants[name] = np.zeros(region.shape, region.dtype)
        for rec in recs:
            rec.insn = dataclasses.replace(rec.insn, dram_base=end // config.entry_bytes(mem.buffer))
        end += -(-region.nbytes // align) * align
    build.arena_end = end
