"""The gemforge instruction set: instruction and micro-op types, the binary
encoding (field widths derived from an `AccelConfig`), and the semantics every
backend implements.

The encoding is one fixed-width little-endian word per instruction (128 bits,
or 256 when a config's fields need more). Fields are packed from bit 0 upwards
in the order of the tables below; bits past the last field are zero. The
encoder refuses any value that does not fit its field; the decoder refuses
words with unknown opcodes or non-zero unused bits, so ``encode(decode(w)) ==
w`` for every word it accepts.

Execution rules every backend follows (fsim checks them and reports a
violation as an error naming the instruction; the hardware ends the program
with the same `gemforge.hw.regmap.Fault` code in its ERROR register):

* Integers are two's complement; accumulator arithmetic wraps at
  ``acc_width`` bits, never saturates.
* Every write to ``acc[i]`` also writes ``out[i]`` = the low ``out_width``
  bits of the new value (the mirror rule).
* ``y_size``, ``x_size``, ``iter_out`` and ``iter_in`` are at least 1 and a
  micro-op range is non-empty; zero is an error, not a no-op.
* Every SRAM and DRAM entry an instruction touches lies inside its buffer or
  the DRAM: outside a buffer is a BUFFER_RANGE fault; a LOAD or STORE tile that
  runs past the 4 GiB top of the 32-bit address space is a DRAM_RANGE fault
  (and a program that does, PROGRAM_RANGE), found before any of it is accessed,
  so no address wraps to 0; below that top but outside the DRAM, a bus error
  response from the memory system (BUS_ERROR).
* Fetch dispatches instructions in program order into per-engine command
  queues of ``cmd_queue_depth`` entries and stalls while the next
  instruction's queue is full.
* Bits of a micro-op word above its three fields are ignored.
* A requantizing STORE (``requant``) reads the accumulator and writes
  ``out_width``-bit values, ``clamp((acc + bias) >> shift)``; its DRAM
  addresses count output-buffer entries (`Store.dram_buffer`).

This module is the one definition of opcodes, field order and widths; the ISA
reference (`gemforge info --isa`), the assembler, the simulator and the
gateware all read it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass
from typing import ClassVar, Iterable, Union

import numpy as np
from amaranth.lib import enum as amaranth_enum
from amaranth.utils import ceil_log2

from .config import (
    ALU_IMM_BITS,
    DMA_PAD_BITS,
    DMA_SIZE_BITS,
    DRAM_ADDR_BITS,
    LOOP_ITER_BITS,
    AccelConfig,
)

__all__ = [
    "Opcode", "MemType", "AluOp", "Engine", "PIPELINE", "OPCODE_ENGINE", "LOAD_ENGINE", "STORE_MEMS",
    "TokenQueue", "TOKEN_QUEUES", "TOKEN_POPS", "TOKEN_PUSHES",
    "Load", "Store", "Gemm", "Alu", "Finish", "Instruction", "Uop",
    "Field", "IsaError", "EncodingError",
    "fields_of", "required_insn_bits", "insn_bits", "insn_bytes", "derived", "engine_of",
    "encode", "decode", "encode_program", "decode_program",
    "encode_uops", "decode_uops", "validate",
    "OPCODE_BITS", "MEM_TYPE_BITS", "ALU_OP_BITS", "DMA_TRANSFER_FIELDS",
]


class IsaError(ValueError):
    """An instruction is not valid for this config (bad field, kind or dependency flag)."""


class EncodingError(IsaError):
    """A binary word does not decode to a valid instruction."""


# The enumerations are Amaranth enums with their field widths as shapes, so the gateware's
# instruction views (`gateware.engine.insn_layout`) hold typed fields; on the host they are
# plain `enum.IntEnum`s.
OPCODE_BITS = 3
MEM_TYPE_BITS = 3
ALU_OP_BITS = 3


class Opcode(amaranth_enum.IntEnum, shape=OPCODE_BITS):
    LOAD = 0    #: DRAM → on-chip buffer, 2-D strided, zero padding
    STORE = 1   #: output or accumulator buffer → DRAM, 2-D strided
    GEMM = 2    #: matrix multiply-accumulate over a micro-op range, two loop levels
    ALU = 3     #: element-wise tensor ALU over the accumulator, two loop levels
    FINISH = 4  #: end of program


class MemType(amaranth_enum.IntEnum, shape=MEM_TYPE_BITS):
    INP = 0  #: input buffer (load engine)
    WGT = 1  #: weight buffer (load engine)
    ACC = 2  #: accumulator buffer (compute engine loads; store engine stores)
    UOP = 3  #: micro-op buffer (compute engine)
    OUT = 4  #: output buffer (store engine)

    @property
    def buffer(self) -> str:
        """The config's short name of this buffer ('inp', 'wgt', ...)."""
        return self.name.lower()


class AluOp(amaranth_enum.IntEnum, shape=ALU_OP_BITS):
    MIN = 0  #: signed minimum
    MAX = 1  #: signed maximum
    ADD = 2  #: wrap-around addition
    SHR = 3  #: arithmetic shift right; a negative amount shifts left
    MUL = 4  #: wrap-around multiplication (low acc_width bits of the product)


class Engine(enum.Enum):
    """The engines instructions run on, in pipeline order: an engine's *previous* stage is the
    one before it in this order, its *next* stage the one after."""

    LOAD = "load"
    COMPUTE = "compute"
    STORE = "store"


DEP_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")

#: The engines in pipeline order (load → compute → store).
PIPELINE = tuple(Engine)
#: Which engine runs each instruction kind (its command queue); a LOAD is routed by its buffer
#: instead (`LOAD_ENGINE`).
OPCODE_ENGINE = {Opcode.STORE: Engine.STORE, Opcode.GEMM: Engine.COMPUTE, Opcode.ALU: Engine.COMPUTE,
                 Opcode.FINISH: Engine.COMPUTE}
#: Which engine a LOAD into each buffer runs on (the buffers it writes sit beside that engine).
LOAD_ENGINE = {MemType.INP: Engine.LOAD, MemType.WGT: Engine.LOAD,
               MemType.ACC: Engine.COMPUTE, MemType.UOP: Engine.COMPUTE}
#: The buffers a STORE reads.
STORE_MEMS = (MemType.OUT, MemType.ACC)


@dataclass(frozen=True)
class TokenQueue:
    """A dependency-token queue between two neighbouring engines: ``pusher`` sends a token
    after an instruction with `push_flag` completes; ``popper`` takes one before an
    instruction with `pop_flag` starts."""

    pusher: Engine
    popper: Engine

    @property
    def name(self) -> str:
        """``"load->compute"``: the name fsim, the documentation and the debug view use."""
        return f"{self.pusher.value}->{self.popper.value}"

    @property
    def short(self) -> str:
        """``"l2c"``: the name of the queue in the gateware (``tokens_l2c``)."""
        return f"{self.pusher.value[0]}2{self.popper.value[0]}"

    @property
    def forward(self) -> bool:
        """Whether the tokens flow down the pipeline (the popper is the pusher's next stage)."""
        return PIPELINE.index(self.popper) > PIPELINE.index(self.pusher)

    @property
    def push_side(self) -> str:
        """Which neighbour the pusher sends to: ``"next"`` or ``"prev"``."""
        return "next" if self.forward else "prev"

    @property
    def pop_side(self) -> str:
        """Which neighbour the popper takes from: ``"prev"`` or ``"next"``."""
        return "prev" if self.forward else "next"

    @property
    def push_flag(self) -> str:
        return f"push_{self.push_side}"

    @property
    def pop_flag(self) -> str:
        return f"pop_{self.pop_side}"


#: Every token queue: one each way between neighbouring engines, in the order the debug
#: registers report them (load->compute, compute->load, compute->store, store->compute).
TOKEN_QUEUES = tuple(q for a, b in zip(PIPELINE, PIPELINE[1:]) for q in (TokenQueue(a, b), TokenQueue(b, a)))
#: Per engine, the token queue each dependency flag pops or pushes: ``{flag: queue name}``.
TOKEN_POPS = {e: {q.pop_flag: q.name for q in TOKEN_QUEUES if q.popper is e} for e in PIPELINE}
TOKEN_PUSHES = {e: {q.push_flag: q.name for q in TOKEN_QUEUES if q.pusher is e} for e in PIPELINE}


@dataclass(frozen=True)
class Field:
    """One instruction field: its name, width in bits, and whether it is signed."""

    name: str
    width: int
    signed: bool = False
    doc: str = ""

    @property
    def lo(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1


# ---------------------------------------------------------------------------- instructions

@dataclass(frozen=True, kw_only=True)
class _Deps:
    """The four dependency flags every instruction carries.

    ``pop_*`` wait for (and consume) a token from the previous/next stage before
    the instruction starts; ``push_*`` send one after it completes. Stages are
    ordered load → compute → store, so the load engine has only a *next* stage
    and the store engine only a *previous* one.
    """

    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False


class _DramTile:
    """The DRAM side LOAD and STORE share: ``y_size`` rows of ``x_size`` entries, row ``y`` at
    entry ``dram_base + y·x_stride``."""

    dram_base: int
    y_size: int
    x_size: int
    x_stride: int

    @property
    def dram_end(self) -> int:
        """One past the last DRAM entry the tile touches (the last row starts furthest on: the
        stride is unsigned)."""
        return self.dram_base + (self.y_size - 1) * self.x_stride + self.x_size


@dataclass(frozen=True, kw_only=True)
class Load(_Deps, _DramTile):
    """LOAD: copy a 2-D tile of entries from DRAM into an on-chip buffer.

    Reads ``y_size`` rows of ``x_size`` consecutive entries; row ``y`` starts at
    entry ``dram_base + y·x_stride`` (DRAM addresses count entries of the target
    buffer, so byte address = entry index × entry bytes). On chip the tile is
    written row-major at ``sram_base``, framed by ``y_pad0``/``y_pad1`` rows above
    and below and ``x_pad0``/``x_pad1`` entries left and right, all zero; the
    on-chip row pitch is ``x_pad0 + x_size + x_pad1``. Input and weight loads run
    on the load engine; accumulator and micro-op loads on the compute engine.
    An accumulator load also writes the low ``out_width`` bits of each element
    to the output buffer (the mirror rule, see GEMM). Micro-op loads take no
    padding.
    """

    opcode: ClassVar[Opcode] = Opcode.LOAD
    mem: MemType
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    y_pad0: int = 0
    y_pad1: int = 0
    x_pad0: int = 0
    x_pad1: int = 0

    @property
    def dram_buffer(self) -> str:
        """The buffer whose entries the DRAM side moves (``dram_base`` counts them)."""
        return self.mem.buffer


@dataclass(frozen=True, kw_only=True)
class Store(_Deps, _DramTile):
    """STORE: copy ``y_size × x_size`` entries from the output buffer (``mem=out``)
    or the accumulator buffer (``mem=acc``), read contiguously from
    ``sram_base``, to DRAM rows starting at entry ``dram_base + y·x_stride``.
    Runs on the store engine.

    With ``requant`` (``mem=acc`` only) entry ``(y, x)`` is requantized on the
    way out, element by element::

        v   = acc[sram_base + y·x_size + x]
        v   = v + acc[bias_base + (y if bias_per_row else 0)]   if bias (wrapping)
        out = clamp(v >> shift, 0 if relu else −2^(out_width−1), 2^(out_width−1) − 1)

    (arithmetic shift), so DRAM receives output-buffer entries and ``dram_base``
    counts them: a quantized layer's bias, requantization and ReLU happen on
    the way out, not on the compute pipeline. The bias entries must lie inside
    the accumulator. Without ``requant`` the requantization fields are zero.
    """

    opcode: ClassVar[Opcode] = Opcode.STORE
    mem: MemType
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    requant: bool = False
    shift: int = 0
    relu: bool = False
    bias: bool = False
    bias_per_row: bool = False
    bias_base: int = 0

    @property
    def dram_buffer(self) -> str:
        """The buffer whose entries the DRAM side moves (``dram_base`` counts them): the
        output buffer's for a requantizing STORE, else the buffer read."""
        return MemType.OUT.buffer if self.requant else self.mem.buffer

    def bias_entries(self) -> range:
        """The accumulator entries a requantizing STORE with bias reads its bias from."""
        if not self.bias:
            return range(0)
        return range(self.bias_base, self.bias_base + (self.y_size if self.bias_per_row else 1))


class _MicroOpLoop:
    """The loop GEMM and ALU share: ``iter_out × iter_in × (uop_end − uop_bgn)`` micro-ops."""

    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int

    @property
    def uop_count(self) -> int:
        """Micro-ops the instruction issues."""
        return (self.uop_end - self.uop_bgn) * self.iter_out * self.iter_in


@dataclass(frozen=True, kw_only=True)
class Gemm(_Deps, _MicroOpLoop):
    """GEMM: for ``i`` in ``iter_out``, ``j`` in ``iter_in``, micro-op ``u`` in
    ``[uop_bgn, uop_end)``, in that order::

        a = u.dst + i·dst_factor_out + j·dst_factor_in     (accumulator index)
        x = u.src + i·src_factor_out + j·src_factor_in     (input index)
        w = u.wgt + i·wgt_factor_out + j·wgt_factor_in     (weight index)
        acc[a] = 0                          if reset
        acc[a] = inp[x] · wgt[w]ᵀ           if overwrite (and not reset)
        acc[a] = acc[a] + inp[x] · wgt[w]ᵀ  otherwise, wrapping at acc_width bits

    Products and sums are exact signed integers reduced modulo 2^acc_width
    (two's complement wrap-around, never saturation). Every write to ``acc[a]``
    also writes ``out[a]`` = the low ``out_width`` bits of the new value, read
    as signed (the mirror rule). Micro-ops execute in order: a later micro-op
    sees the result of an earlier one to the same accumulator entry.

    ``overwrite`` starts a reduction without a separate reset: the compiler gives
    the first reduction step of each accumulator entry its own overwriting GEMM,
    so no reset micro-op occupies the pipeline.
    """

    opcode: ClassVar[Opcode] = Opcode.GEMM
    reset: bool = False
    overwrite: bool = False
    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0


@dataclass(frozen=True, kw_only=True)
class Alu(_Deps, _MicroOpLoop):
    """ALU: the loop of GEMM over ``[uop_bgn, uop_end)``, where for each micro-op
    ``d = u.dst + i·dst_factor_out + j·dst_factor_in`` and
    ``s = u.src + i·src_factor_out + j·src_factor_in`` both index the
    accumulator, and element-wise::

        acc[d] = op(acc[d], imm)      if imm is given (use_imm = 1)
        acc[d] = op(acc[d], acc[s])   otherwise

    ``MIN``/``MAX`` compare signed; ``ADD`` and ``MUL`` wrap at acc_width bits;
    ``SHR`` shifts ``acc[d]`` arithmetically right by the operand, or left by
    its negation when the operand is negative; a shift amount of acc_width or
    more gives the sign fill (right) or zero (left). ``imm`` is a signed 16-bit
    immediate, sign-extended. The result is written with the mirror rule.
    Micro-ops execute in order (later ones see earlier results).
    """

    opcode: ClassVar[Opcode] = Opcode.ALU
    op: AluOp
    imm: int | None = None
    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0


@dataclass(frozen=True, kw_only=True)
class Finish(_Deps):
    """FINISH: ends the program on the compute engine. It must be the last
    instruction. It does not wait for the other engines: the program ends with
    DONE once FINISH has retired, every engine has finished its work (a STORE
    still writing, say) and every token queue is empty; a token still queued
    then ends it with TOKEN_IMBALANCE instead."""

    opcode: ClassVar[Opcode] = Opcode.FINISH


Instruction = Union[Load, Store, Gemm, Alu, Finish]
INSTRUCTION_TYPES: dict[Opcode, type] = {
    Opcode.LOAD: Load, Opcode.STORE: Store, Opcode.GEMM: Gemm, Opcode.ALU: Alu, Opcode.FINISH: Finish,
}


@dataclass(frozen=True)
class Uop:
    """A micro-op: base indices that GEMM and ALU loops offset.

    ``dst`` indexes the accumulator; ``src`` the input buffer (GEMM) or the
    accumulator (ALU); ``wgt`` the weight buffer (ignored by ALU)."""

    dst: int
    src: int
    wgt: int = 0


# ---------------------------------------------------------------------------- field tables

#: The LOAD/STORE fields that describe the DRAM side of a transfer (their widths do not
#: depend on the config): the DMA engines' command layout is made of them.
DMA_TRANSFER_FIELDS = (
    Field("dram_base", DRAM_ADDR_BITS, doc="first DRAM entry (in entries of the buffer)"),
    Field("y_size", DMA_SIZE_BITS, doc="rows"),
    Field("x_size", DMA_SIZE_BITS, doc="entries per row"),
    Field("x_stride", DMA_SIZE_BITS, doc="DRAM entries between row starts"),
)


def fields_of(config: AccelConfig, opcode: Opcode) -> list[Field]:
    """The fields of an instruction kind, in encoding order (bit 0 upwards)."""
    return list(_fields_of(config, Opcode(opcode)))


@functools.lru_cache(maxsize=256)
def _fields_of(config: AccelConfig, opcode: Opcode) -> tuple[Field, ...]:
    # Cached: encode, decode and validate ask for every instruction, and configs are frozen.
    header = [Field("opcode", OPCODE_BITS, doc="instruction kind")] + [
        Field(flag, 1, doc=_DEP_DOCS[flag]) for flag in DEP_FLAGS]
    uop_range = [
        Field("uop_bgn", config.uop_index_bits, doc="first micro-op"),
        Field("uop_end", config.uop_index_bits + 1, doc="one past the last micro-op"),
        Field("iter_out", LOOP_ITER_BITS, doc="outer loop count"),
        Field("iter_in", LOOP_ITER_BITS, doc="inner loop count"),
        Field("dst_factor_out", config.acc_index_bits, doc="accumulator index step per outer iteration"),
        Field("dst_factor_in", config.acc_index_bits, doc="accumulator index step per inner iteration"),
    ]
    if opcode in (Opcode.LOAD, Opcode.STORE):
        body = [
            Field("mem", MEM_TYPE_BITS, doc="buffer: " + ", ".join(f"{m.value}={m.name.lower()}" for m in MemType)),
            Field("sram_base", config.sram_addr_bits, doc="first on-chip entry"),
            *DMA_TRANSFER_FIELDS,
        ]
        if opcode == Opcode.LOAD:
            body += [Field(p, DMA_PAD_BITS, doc=_PAD_DOCS[p]) for p in ("y_pad0", "y_pad1", "x_pad0", "x_pad1")]
        else:
            body += [
                Field("requant", 1, doc="acc → out values: clamp((acc + bias) >> shift) (mem=acc)"),
                Field("shift", requant_shift_bits(config), doc="requant: arithmetic right shift"),
                Field("relu", 1, doc="requant: clamp at 0 instead of the output type's minimum"),
                Field("bias", 1, doc="requant: add acc[bias_base (+ row)] first"),
                Field("bias_per_row", 1, doc="requant: row y adds acc[bias_base + y]"),
                Field("bias_base", config.acc_index_bits, doc="requant: accumulator entry of the bias"),
            ]
    elif opcode == Opcode.GEMM:
        body = [Field("reset", 1, doc="write zero instead of accumulating"),
                Field("overwrite", 1, doc="write the product instead of accumulating")] + uop_range + [
            Field("src_factor_out", config.inp_index_bits, doc="input index step per outer iteration"),
            Field("src_factor_in", config.inp_index_bits, doc="input index step per inner iteration"),
            Field("wgt_factor_out", config.wgt_index_bits, doc="weight index step per outer iteration"),
            Field("wgt_factor_in", config.wgt_index_bits, doc="weight index step per inner iteration"),
        ]
    elif opcode == Opcode.ALU:
        body = uop_range + [
            Field("src_factor_out", config.acc_index_bits, doc="operand index step per outer iteration"),
            Field("src_factor_in", config.acc_index_bits, doc="operand index step per inner iteration"),
            Field("op", ALU_OP_BITS, doc="operation: " + ", ".join(f"{o.value}={o.name.lower()}" for o in AluOp)),
            Field("use_imm", 1, doc="operand is the immediate, not acc[src]"),
            Field("imm", ALU_IMM_BITS, signed=True, doc="signed immediate operand"),
        ]
    elif opcode == Opcode.FINISH:
        body = []
    else:  # pragma: no cover - Opcode is closed
        raise AssertionError(opcode)
    return tuple(header + body)


_DEP_DOCS = {
    "pop_prev": "wait for a token from the previous stage before starting",
    "pop_next": "wait for a token from the next stage before starting",
    "push_prev": "send a token to the previous stage when done",
    "push_next": "send a token to the next stage when done",
}
_PAD_DOCS = {
    "y_pad0": "zero rows above", "y_pad1": "zero rows below",
    "x_pad0": "zero entries left of each row", "x_pad1": "zero entries right of each row",
}


def requant_shift_bits(config: AccelConfig) -> int:
    """Width of a requantizing STORE's shift: any amount below ``acc_width``."""
    return max(1, ceil_log2(config.acc_width))


def required_insn_bits(config: AccelConfig) -> int:
    """The widest instruction kind's total field width for this config."""
    return max(sum(f.width for f in fields_of(config, op)) for op in Opcode)


@functools.cache
def insn_bits(config: AccelConfig) -> int:
    """Instruction width for ``config``: 128 bits, or 256 when some instruction's fields need more."""
    return 128 if required_insn_bits(config) <= 128 else 256


def insn_bytes(config: AccelConfig) -> int:
    """Bytes per instruction word (`insn_bits` / 8)."""
    return insn_bits(config) // 8


def derived(config: AccelConfig) -> dict:
    """Every derived parameter of ``config`` (`AccelConfig.derived`) and the instruction width,
    for `gemforge info` and generated files."""
    return {**config.derived(), "insn_bits": insn_bits(config)}


def uop_fields(config: AccelConfig) -> list[Field]:
    """Micro-op fields in packing order (bit 0 upwards)."""
    return [
        Field("dst", config.uop_dst_bits, doc="accumulator index"),
        Field("src", config.uop_src_bits, doc="input index (GEMM) or accumulator index (ALU)"),
        Field("wgt", config.uop_wgt_bits, doc="weight index (GEMM)"),
    ]


# ---------------------------------------------------------------------------- validation

def engine_of(insn: Instruction) -> Engine:
    """The engine whose command queue an instruction goes to."""
    if isinstance(insn, Load):
        if insn.mem not in LOAD_ENGINE:
            raise IsaError(f"LOAD cannot target the {getattr(insn.mem, 'buffer', insn.mem)} buffer; allowed: "
                           f"{', '.join(m.buffer for m in LOAD_ENGINE)}")
        return LOAD_ENGINE[insn.mem]
    return OPCODE_ENGINE[insn.opcode]


def validate(insn: Instruction, config: AccelConfig) -> None:
    """Refuse an instruction that cannot be encoded for ``config``.

    Checks every field against its range (never truncates), the buffer kind
    against the instruction, and the dependency flags against the engine."""
    kind = type(insn)
    if kind not in INSTRUCTION_TYPES.values():
        raise IsaError(f"not an instruction: {insn!r}")
    name = kind.__name__.upper()
    if isinstance(insn, Load) and not isinstance(insn.mem, MemType) or \
            isinstance(insn, Store) and not isinstance(insn.mem, MemType):
        raise IsaError(f"{name} mem must be a MemType, not {insn.mem!r}")
    engine = engine_of(insn)            # refuses a LOAD into a buffer no engine loads
    if isinstance(insn, Store):
        if insn.mem not in STORE_MEMS:
            raise IsaError(f"STORE reads the {' or '.join(m.buffer for m in STORE_MEMS)} buffer, "
                           f"not {insn.mem.buffer}")
        if insn.requant and insn.mem != MemType.ACC:
            raise IsaError(f"a requantizing STORE reads the acc buffer, not {insn.mem.buffer}")
        if not insn.requant and (insn.shift or insn.relu or insn.bias or insn.bias_per_row or insn.bias_base):
            raise IsaError("STORE without requant takes no shift, relu or bias; shift, relu, bias, bias_per_row "
                           "and bias_base must be 0")
        if not insn.bias and (insn.bias_per_row or insn.bias_base):
            raise IsaError("STORE without bias takes no bias_per_row or bias_base; they must be 0")
    if isinstance(insn, Load) and insn.mem == MemType.UOP and \
            (insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1):
        raise IsaError("LOAD uop takes no padding; y_pad0, y_pad1, x_pad0 and x_pad1 must be 0")
    if isinstance(insn, Alu) and not isinstance(insn.op, AluOp):
        raise IsaError(f"ALU op must be an AluOp, not {insn.op!r}")
    label = mnemonic(insn)
    for side, stage in (("prev", "previous"), ("next", "next")):
        if f"pop_{side}" not in TOKEN_POPS[engine] and (getattr(insn, f"pop_{side}") or getattr(insn, f"push_{side}")):
            raise IsaError(f"{label} runs on the {engine.value} engine, which has no {stage} stage: "
                           f"pop_{side} and push_{side} must be clear")
    for field, lo, hi in _field_ranges(config, insn.opcode):
        value = _field_value(insn, field.name)
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, np.integer)):
            raise IsaError(f"{label} field {field.name} must be an integer, not {value!r}")
        if not lo <= value <= hi:
            raise IsaError(
                f"{label} field {field.name} = {value} is out of range: "
                f"it is {field.width} bits{' signed' if field.signed else ''} "
                f"for this config, so {lo}..{hi}")


@functools.lru_cache(maxsize=256)
def _field_ranges(config: AccelConfig, opcode: Opcode) -> tuple[tuple[Field, int, int], ...]:
    # Cached with the fields: validate runs for every instruction encoded or decoded.
    return tuple((f, f.lo, f.hi) for f in _fields_of(config, Opcode(opcode)))


def _field_value(insn: Instruction, name: str):
    """The value field ``name`` of ``insn`` encodes: the opcode, ALU ``use_imm`` for an
    immediate that is set, and 0 for one that is not."""
    if name == "opcode":
        return int(insn.opcode)
    if name == "use_imm":
        return 0 if insn.imm is None else 1
    value = getattr(insn, name)
    return 0 if value is None and name == "imm" else value


def validate_uop(uop: Uop, config: AccelConfig) -> None:
    for field in uop_fields(config):
        value = getattr(uop, field.name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not field.lo <= value <= field.hi:
            raise IsaError(f"micro-op field {field.name} = {value!r} is out of range: "
                           f"it is {field.width} bits for this config, so 0..{field.hi}")


def mnemonic(insn: Instruction) -> str:
    """Assembly mnemonic: 'load.inp', 'store.out', 'gemm', 'alu.max', 'finish'."""
    if isinstance(insn, (Load, Store)):
        return f"{type(insn).__name__.lower()}.{insn.mem.name.lower()}"
    if isinstance(insn, Alu):
        return f"alu.{insn.op.name.lower()}"
    return type(insn).__name__.lower()


# ---------------------------------------------------------------------------- binary encoding

def encode(insn: Instruction, config: AccelConfig) -> int:
    """Encode one instruction to an integer of ``insn_bits(config)`` bits."""
    validate(insn, config)
    word, pos = 0, 0
    for field in _fields_of(config, insn.opcode):
        value = int(_field_value(insn, field.name)) & ((1 << field.width) - 1)
        word |= value << pos
        pos += field.width
    return word


def decode(word: int, config: AccelConfig) -> Instruction:
    """Decode one instruction word; refuses unknown opcodes and non-canonical words."""
    if not 0 <= word < (1 << insn_bits(config)):
        raise EncodingError(f"instruction word does not fit {insn_bits(config)} bits")
    raw_opcode = word & ((1 << OPCODE_BITS) - 1)
    try:
        opcode = Opcode(raw_opcode)
    except ValueError:
        raise EncodingError(
            f"unknown opcode {raw_opcode}; valid opcodes are "
            + ", ".join(f"{o.value} ({o.name})" for o in Opcode)) from None
    values: dict[str, int] = {}
    pos = 0
    for field in _fields_of(config, opcode):
        raw = (word >> pos) & ((1 << field.width) - 1)
        if field.signed and raw >> (field.width - 1):
            raw -= 1 << field.width
        values[field.name] = raw
        pos += field.width
    if word >> pos:
        raise EncodingError(f"{opcode.name} word has non-zero bits above bit {pos - 1}")
    del values["opcode"]
    kind = INSTRUCTION_TYPES[opcode]
    for flag in DEP_FLAGS:
        values[flag] = bool(values[flag])
    try:
        if opcode in (Opcode.LOAD, Opcode.STORE):
            values["mem"] = MemType(values["mem"])
        if opcode == Opcode.GEMM:
            values["reset"] = bool(values["reset"])
            values["overwrite"] = bool(values["overwrite"])
        if opcode == Opcode.STORE:
            for flag in ("requant", "relu", "bias", "bias_per_row"):
                values[flag] = bool(values[flag])
        if opcode == Opcode.ALU:
            values["op"] = AluOp(values["op"])
            use_imm = values.pop("use_imm")
            if not use_imm and values["imm"] != 0:
                raise EncodingError("ALU word has a non-zero imm field but use_imm is clear")
            values["imm"] = values["imm"] if use_imm else None
    except ValueError as exc:
        if isinstance(exc, EncodingError):
            raise
        raise EncodingError(f"{opcode.name} word has an invalid field: {exc}") from None
    insn = kind(**values)
    try:
        validate(insn, config)
    except IsaError as exc:
        raise EncodingError(f"word decodes to an invalid instruction: {exc}") from None
    return insn


def encode_program(insns: Iterable[Instruction], config: AccelConfig) -> bytes:
    """Little-endian instruction words, ``insn_bytes(config)`` each."""
    n = insn_bytes(config)
    return b"".join(encode(insn, config).to_bytes(n, "little") for insn in insns)


def decode_program(data: bytes, config: AccelConfig) -> list[Instruction]:
    n = insn_bytes(config)
    if len(data) % n:
        raise EncodingError(
            f"instruction stream of {len(data)} bytes is not a whole number of {n}-byte words")
    return [decode(int.from_bytes(data[i:i + n], "little"), config) for i in range(0, len(data), n)]


def encode_uops(uops: Iterable[Uop], config: AccelConfig) -> bytes:
    """Micro-ops packed dst | src | wgt from bit 0, ``config.uop_bits`` each, little-endian."""
    fields = uop_fields(config)
    n = config.uop_bits // 8
    out = bytearray()
    for uop in uops:
        validate_uop(uop, config)
        word, pos = 0, 0
        for field in fields:
            word |= int(getattr(uop, field.name)) << pos
            pos += field.width
        out += word.to_bytes(n, "little")
    return bytes(out)


def decode_uops(data: bytes, config: AccelConfig) -> list[Uop]:
    n = config.uop_bits // 8
    if len(data) % n:
        raise EncodingError(f"micro-op data of {len(data)} bytes is not a whole number of {n}-byte words")
    fields = uop_fields(config)
    uops = []
    for i in range(0, len(data), n):
        word = int.from_bytes(data[i:i + n], "little")
        values, pos = {}, 0
        for field in fields:
            values[field.name] = (word >> pos) & ((1 << field.width) - 1)
            pos += field.width
        if word >> pos:
            raise EncodingError(f"micro-op {i // n} has non-zero bits above bit {pos - 1}")
        uops.append(Uop(**values))
    return uops

