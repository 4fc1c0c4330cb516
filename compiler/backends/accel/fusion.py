"""Instruction-stream fusions that take work off the compute pipeline (issue 11).

Both run on the emitted instruction list (`AccelBuild.emitted`), before micro-op
placement and dependency tokens, and use exact per-entry dataflow over the
accumulator, so they apply only where the result is provably the same:

- `fuse_accumulator_init`: a reduction's zeroing GEMM (``reset``, one micro-op per
  accumulator entry) disappears; the first GEMM that accumulates into those entries
  is split into an *overwriting* GEMM holding each entry's first micro-op
  (``acc = product``) and the rest (``acc += product``).
- `fuse_requant_store`: the ALU epilogue ``+ bias``, ``>> shift``, ``max lo``, ``min hi``
  (up to four micro-ops per entry) and the output-buffer STOREs that follow become
  requantizing STOREs of the accumulator (``clamp((acc + bias) >> shift)`` on the way to
  DRAM, the bias read by the store engine once per STORE or per row).

Where a pattern does not match exactly (other readers of the entries, loop shapes
whose first micro-ops are not a loop nest, a clamp other than the output type's or
ReLU's) the stream is left as emitted, and a bias that varies along a STORE's rows
stays on the ALU while the shift and clamp still move to the STORE. `alu_epilogue`
turns both fusions off (the baseline the benchmark compares against).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import (
    Alu, AluOp, Engine, Finish, Gemm, IsaError, Load, MemType, Store, Uop, engine_of, validate_uop,
)

from .emission import AccelBuild, Emitted

__all__ = ["fuse_accumulator_init", "fuse_requant_store", "alu_epilogue"]

_DISABLED = contextvars.ContextVar("gemforge_alu_epilogue", default=False)


@contextlib.contextmanager
def alu_epilogue() -> Iterator[None]:
    """Programs built inside keep the emitted stream (reset GEMMs, the ALU epilogue): the
    baseline that benchmarks and tests compare the fused stream against."""
    token = _DISABLED.set(True)
    try:
        yield
    finally:
        _DISABLED.reset(token)


# ---------------------------------------------------------------------------- exact accumulator dataflow

def _loop_entries(rec: Emitted, column: str) -> np.ndarray:
    """The accumulator (``dst``) or operand (``src``) index of every micro-op a GEMM/ALU
    executes, in execution order (i, j, kernel)."""
    insn = rec.insn
    base = np.array([getattr(u, column) for u in rec.kernel], np.int64)
    f_out, f_in = getattr(insn, f"{column}_factor_out"), getattr(insn, f"{column}_factor_in")
    i = np.arange(insn.iter_out, dtype=np.int64)[:, None, None] * f_out
    j = np.arange(insn.iter_in, dtype=np.int64)[None, :, None] * f_in
    return (base[None, None, :] + i + j).reshape(-1)


def _acc_access(rec: Emitted) -> tuple[np.ndarray, np.ndarray]:
    """(accumulator entries read, accumulator entries written) by one instruction.

    The output buffer mirrors the accumulator index for index, so a STORE of either
    reads the accumulator entries it names. FINISH reads nothing that matters here:
    the accumulator is not observable after the program."""
    insn, none = rec.insn, np.empty(0, np.int64)
    if isinstance(insn, Gemm):
        dst = _loop_entries(rec, "dst")
        return (none if insn.reset or insn.overwrite else dst), dst
    if isinstance(insn, Alu):
        dst = _loop_entries(rec, "dst")
        return (dst if insn.imm is not None else np.concatenate([dst, _loop_entries(rec, "src")])), dst
    if isinstance(insn, Store):
        tile = np.arange(insn.sram_base, insn.sram_base + insn.y_size * insn.x_size, dtype=np.int64)
        return np.concatenate([tile, np.asarray(insn.bias_entries(), np.int64)]), none
    if isinstance(insn, Load) and insn.mem == MemType.ACC:
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        pitch = insn.x_pad0 + insn.x_size + insn.x_pad1
        return none, np.arange(insn.sram_base, insn.sram_base + rows * pitch, dtype=np.int64)
    return none, none


def _acc_span(rec: Emitted) -> tuple[int, int] | None:
    """The accumulator range an instruction may touch (from its recorded ranges), or None."""
    spans = [(lo, hi) for res, lo, hi in (*rec.reads, *rec.writes) if res == "acc"]
    if not spans:
        return None
    return min(lo for lo, _ in spans), max(hi for _, hi in spans)


def _overlaps(span: tuple[int, int] | None, lo: int, hi: int) -> bool:
    return span is not None and span[0] <= hi and lo <= span[1]


def _accesses(emitted: list[Emitted], start: int, entries: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(index, accumulator entries read, written) of each instruction from ``start`` on that
    touches any of ``entries`` (FINISH aside); the recorded ranges skip the others cheaply."""
    lo, hi = int(entries.min()), int(entries.max())
    for k in range(start, len(emitted)):
        rec = emitted[k]
        if isinstance(rec.insn, Finish) or not _overlaps(_acc_span(rec), lo, hi):
            continue
        reads, writes = _acc_access(rec)
        if np.isin(reads, entries).any() or np.isin(writes, entries).any():
            yield k, reads, writes


def _dead_after(emitted: list[Emitted], start: int, entries: np.ndarray) -> bool:
    """Whether no instruction from ``start`` on reads any of ``entries`` before writing it."""
    live = np.unique(entries)
    for _, reads, writes in _accesses(emitted, start, live):
        if np.isin(reads, live).any():
            return False
        live = np.setdiff1d(live, writes)
        if not live.size:
            return True
    return True


# ---------------------------------------------------------------------------- accumulator init

def fuse_accumulator_init(build: AccelBuild) -> AccelBuild:
    """Replace each reduction's reset GEMM by an overwriting first step (see the module docstring)."""
    if _DISABLED.get():
        return build
    emitted = build.emitted
    remove: set[int] = set()
    replace: dict[int, list[Emitted]] = {}
    for r, rec in enumerate(emitted):
        if not (isinstance(rec.insn, Gemm) and rec.insn.reset) or rec.kernel is None:
            continue
        zeroed = np.unique(_loop_entries(rec, "dst"))
        # The next instruction touching the zeroed entries must be the reduction's first GEMM.
        # (Conservatively, none with a GEMM already split before it.)
        g = next((g for g, _, _ in _accesses(emitted, r + 1, zeroed)), None)
        split = None if g is None or any(r < x <= g for x in replace) else \
            _split_first_step(emitted[g], zeroed, build.config)
        if split is not None:
            remove.add(r)
            replace[g] = split
    if remove:
        out = []
        for k, rec in enumerate(emitted):
            if k in remove:
                continue
            out.extend(replace.get(k, [rec]))
        build.emitted = out
    return build


def _split_first_step(rec: Emitted, zeroed: np.ndarray, config: AccelConfig) -> list[Emitted] | None:
    """An accumulating GEMM that writes exactly the ``zeroed`` entries, as an overwriting GEMM
    of each entry's first micro-op and an accumulating GEMM of the rest — or None when
    those first micro-ops are not one loop nest: the same kernel positions in every loop
    iteration, or the whole first inner (or outer) iteration when the reduction runs
    along that hardware loop."""
    insn = rec.insn
    if not isinstance(insn, Gemm) or insn.reset or insn.overwrite:
        return None
    dst = _loop_entries(rec, "dst")
    if not np.array_equal(np.unique(dst), zeroed):
        return None
    n = len(rec.kernel)
    first = np.zeros(dst.size, bool)
    first[np.unique(dst, return_index=True)[1]] = True
    first = first.reshape(insn.iter_out, insn.iter_in, n)
    kernel_first = first[0, 0]
    if (first == kernel_first[None, None, :]).all():
        head = tuple(u for u, f in zip(rec.kernel, kernel_first) if f)
        tail = tuple(u for u, f in zip(rec.kernel, kernel_first) if not f)
        parts = [_gemm_part(rec, insn, head, overwrite=True)]
        if tail:
            parts.append(_gemm_part(rec, insn, tail, overwrite=False))
        return parts
    for level in ("in", "out"):
        count = getattr(insn, f"iter_{level}")
        at_zero = np.zeros(first.shape, bool)
        if level == "in":
            at_zero[:, 0, :] = True
        else:
            at_zero[0, :, :] = True
        if not np.array_equal(first, at_zero):
            continue
        # The first iteration of this loop overwrites; the rest run from its second iteration.
        steps = {c: getattr(insn, f"{c}_factor_{level}") for c in ("dst", "src", "wgt")}
        rest = tuple(Uop(u.dst + steps["dst"], u.src + steps["src"], u.wgt + steps["wgt"]) for u in rec.kernel)
        try:
            for u in rest:
                validate_uop(u, config)
        except IsaError:
            return None                 # the shifted kernel does not fit the micro-op fields
        once = {f"iter_{level}": 1, **{f"{c}_factor_{level}": 0 for c in steps}}
        return [_gemm_part(rec, dataclasses.replace(insn, **once), rec.kernel, overwrite=True),
                _gemm_part(rec, dataclasses.replace(insn, **{f"iter_{level}": count - 1}), rest, overwrite=False)]
    return None


def _gemm_part(rec: Emitted, insn: Gemm, kernel: tuple[Uop, ...], overwrite: bool) -> Emitted:
    insn = dataclasses.replace(insn, overwrite=overwrite, uop_bgn=0, uop_end=len(kernel))
    part = Emitted(insn, kernel=kernel)

    def span(column: str, resource: str) -> tuple[str, int, int]:
        values = _loop_entries(part, column)
        return resource, int(values.min()), int(values.max())

    part.writes = [span("dst", "acc")]
    part.reads = [span("src", "inp"), span("wgt", "wgt")]
    return part


# ---------------------------------------------------------------------------- requantizing stores

def fuse_requant_store(build: AccelBuild) -> AccelBuild:
    """Fold ``+ bias``, ``>> shift``, ``max lo``, ``min hi`` ALU chains into the output STOREs
    that follow (see the module docstring)."""
    if _DISABLED.get():
        return build
    config = build.config
    emitted = build.emitted
    remove: set[int] = set()
    k = 0
    while k < len(emitted):
        chain = _requant_chain(emitted, k, config)
        if chain is None:
            k += 1
            continue
        stores = _fusable_stores(emitted, chain)
        if stores is None and chain.bias_of is not None:
            k = chain.indices[0] + 1    # the bias stays on the ALU; the rest may still fuse
            continue
        if stores is not None:
            for s, fields in stores.items():
                rec = emitted[s]
                rec.insn = dataclasses.replace(rec.insn, mem=MemType.ACC, **chain.fields, **fields)
                bias = rec.insn.bias_entries()
                if bias:
                    rec.reads = rec.reads + [("acc", bias.start, bias.stop - 1)]
            remove.update(chain.indices)
        k = chain.indices[-1] + 1
    if remove:
        build.emitted = [rec for i, rec in enumerate(emitted) if i not in remove]
    return build


#: The ALU steps a requantizing STORE replaces, in the order the epilogue emits them.
_CHAIN_ORDER = (AluOp.ADD, AluOp.SHR, AluOp.MAX, AluOp.MIN)


@dataclasses.dataclass
class _Chain:
    """An epilogue on the ALU: its instructions, the entries they write (each once, in
    execution order), each entry's bias entry (or None), and the STORE fields it amounts to."""

    indices: list[int]
    entries: np.ndarray
    bias_of: dict[int, int] | None
    fields: dict


def _requant_chain(emitted: list[Emitted], start: int, config: AccelConfig) -> _Chain | None:
    """The compute instructions from ``start`` that form ``+ acc[bias]`` (optional),
    ``>> s`` (optional), ``max lo``, ``min hi`` over the same entries, in that order, where
    ``lo`` is 0 or the output type's minimum and ``hi`` its maximum."""
    rec = emitted[start]
    if not _is_chain_step(rec):
        return None
    entries = _loop_entries(rec, "dst")
    if np.unique(entries).size != entries.size:
        return None                     # an entry updated twice
    lo, hi = int(entries.min()), int(entries.max())
    indices, steps = [start], {rec.insn.op: rec}
    k = start + 1
    while k < len(emitted) and len(indices) < len(_CHAIN_ORDER):
        other = emitted[k]
        if engine_of(other.insn) is not Engine.COMPUTE:
            if _overlaps(_acc_span(other), lo, hi):
                break                   # something sees the entries: the chain ends here
            k += 1
            continue
        previous = emitted[indices[-1]].insn.op
        if not _is_chain_step(other) or _CHAIN_ORDER.index(other.insn.op) <= _CHAIN_ORDER.index(previous) or \
                not np.array_equal(_loop_entries(other, "dst"), entries):
            break
        indices.append(k)
        steps[other.insn.op] = other
        k += 1
    low, high = -(1 << (config.out_width - 1)), (1 << (config.out_width - 1)) - 1
    if AluOp.MIN not in steps or AluOp.MAX not in steps or steps[AluOp.MIN].insn.imm != high or \
            steps[AluOp.MAX].insn.imm not in (0, low):
        return None                     # not a clamp to the output type (or to ReLU's range)
    shift = steps[AluOp.SHR].insn.imm if AluOp.SHR in steps else 0
    if not 0 <= shift < config.acc_width:
        return None                     # a left shift, or one the field cannot hold
    bias_of = None
    if AluOp.ADD in steps:
        sources = _loop_entries(steps[AluOp.ADD], "src")
        if np.isin(sources, entries).any():
            return None                 # the addend is one of the results
        bias_of = dict(zip(entries.tolist(), sources.tolist()))
    return _Chain(indices, entries, bias_of,
                  {"requant": True, "shift": shift, "relu": steps[AluOp.MAX].insn.imm == 0})


def _is_chain_step(rec: Emitted) -> bool:
    insn = rec.insn
    if not isinstance(insn, Alu) or rec.kernel is None or insn.op not in _CHAIN_ORDER:
        return False
    # The bias addition reads an accumulator operand; the other steps take immediates.
    return (insn.imm is None) == (insn.op == AluOp.ADD)


def _store_bias(store: Store, bias_of: dict[int, int]) -> dict | None:
    """The bias fields of ``store`` when every row adds one bias entry, the same for all
    rows or the next one per row; a one-row STORE whose bias steps every ``L`` entries is
    cut into rows of ``L`` (the same DRAM addresses). None otherwise."""
    if store.y_size == 1:
        sources = [bias_of[e] for e in range(store.sram_base, store.sram_base + store.x_size)]
        run = next((i for i, b in enumerate(sources) if b != sources[0]), len(sources))
        if run < len(sources) and len(sources) % run == 0:
            rows = len(sources) // run
            if sources == [sources[0] + y for y in range(rows) for _ in range(run)]:
                return {"bias": True, "bias_base": sources[0], "bias_per_row": True,
                        "y_size": rows, "x_size": run, "x_stride": run}
    per_row = []
    for y in range(store.y_size):
        row = store.sram_base + y * store.x_size
        sources = {bias_of[e] for e in range(row, row + store.x_size)}
        if len(sources) != 1:
            return None
        per_row.append(sources.pop())
    if all(b == per_row[0] for b in per_row):
        return {"bias": True, "bias_base": per_row[0]}
    if per_row == list(range(per_row[0], per_row[0] + len(per_row))):
        return {"bias": True, "bias_base": per_row[0], "bias_per_row": True}
    return None


def _fusable_stores(emitted: list[Emitted], chain: _Chain) -> dict[int, dict] | None:
    """The output STOREs (index → bias fields) that read exactly the chain's entries after
    it, when nothing else reads those entries' accumulator values (which stay unshifted)
    and nothing writes a bias entry before its STORE reads it — else None."""
    entries = np.unique(chain.entries)
    biases = np.unique(np.fromiter(chain.bias_of.values(), np.int64)) if chain.bias_of else np.empty(0, np.int64)
    covered = np.empty(0, np.int64)
    stores: dict[int, dict] = {}
    for k, reads, writes in _accesses(emitted, chain.indices[-1] + 1, np.concatenate([entries, biases])):
        if np.isin(writes, biases).any():
            return None                 # a bias entry rewritten before the STOREs read it
        if not (np.isin(reads, entries).any() or np.isin(writes, entries).any()):
            continue                    # reads a bias entry only
        rec = emitted[k]
        if not (isinstance(rec.insn, Store) and rec.insn.mem == MemType.OUT and np.isin(reads, entries).all()
                and not np.isin(reads, covered).any()):
            return None
        fields = _store_bias(rec.insn, chain.bias_of) if chain.bias_of else {}
        if fields is None:
            return None
        stores[k] = fields
        covered = np.union1d(covered, reads)
        if covered.size == entries.size:
            return stores if _dead_after(emitted, k + 1, entries) else None
    return None
