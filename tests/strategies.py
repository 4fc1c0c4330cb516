"""Shared hypothesis strategies: valid configs, instructions, micro-ops and programs.

Import as ``from strategies import instructions`` (tests/conftest.py puts
tests/ on ``sys.path``). Field *ranges* come from `isa.fields_of` and
`isa.uop_fields`; which buffers each kind may use and which dependency flags
each engine has are restated here on purpose, as an independent reference
for the checks in `isa.validate`.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from gemforge.hw import isa
from gemforge.hw.config import PRESETS, AccelConfig
from gemforge.hw.isa import AluOp, Engine, MemType, Opcode

__all__ = [
    "CONFIGS", "WIDE",
    "LOAD_MEMS", "STORE_MEMS", "ENGINE_FLAGS",
    "accel_configs", "field_range", "deps_for",
    "loads", "stores", "gemms", "alus", "finishes", "instructions",
    "uops", "tensor_regions", "programs",
]

#: A config at the limits: 16-bit buffer indices everywhere, so instructions
#: need 256 bits and micro-ops 64.
WIDE = AccelConfig(
    name="wide", batch=1, block_in=1, block_out=1,
    inp_buffer_bytes=1 << 16, wgt_buffer_bytes=1 << 16, acc_buffer_bytes=1 << 18,
    out_buffer_bytes=1 << 16, uop_buffer_bytes=1 << 19)

#: Every preset plus `WIDE`, for parametrized round trips.
CONFIGS: dict[str, AccelConfig] = {**PRESETS, "wide": WIDE}

LOAD_MEMS = (MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP)
STORE_MEMS = (MemType.OUT, MemType.ACC)
#: The dependency flags each engine may set (load has no previous stage, store no next).
ENGINE_FLAGS = {
    Engine.LOAD: ("pop_next", "push_next"),
    Engine.COMPUTE: ("pop_prev", "pop_next", "push_prev", "push_next"),
    Engine.STORE: ("pop_prev", "push_prev"),
}


@st.composite
def accel_configs(draw) -> AccelConfig:
    """A random valid `AccelConfig`, built from depths so every constraint holds."""
    shape = {k: 1 << draw(st.integers(0, 5)) for k in ("batch", "block_in", "block_out")}
    inp_width = draw(st.sampled_from((8, 16)))
    wgt_width = draw(st.sampled_from((8, 16)))
    acc_width = draw(st.sampled_from((16, 32)))
    out_width = draw(st.sampled_from([w for w in (8, 16, 32) if w <= acc_width]))
    entry = {
        "inp": shape["batch"] * shape["block_in"] * inp_width // 8,
        "wgt": shape["block_out"] * shape["block_in"] * wgt_width // 8,
        "acc": shape["batch"] * shape["block_out"] * acc_width // 8,
        "out": shape["batch"] * shape["block_out"] * out_width // 8,
    }
    depth = {b: 1 << draw(st.integers(0, 12)) for b in ("inp", "wgt", "acc")}
    depth["out"] = depth["acc"]  # the mirror rule needs equal depths
    sizes = {f"{b}_buffer_bytes": depth[b] * entry[b] for b in entry}
    # At most 3 x 13 index bits, so a micro-op always fits 64 bits (8 bytes).
    uop_bytes = (1 << draw(st.integers(0, 12))) * 8
    return AccelConfig(
        name="random", **shape, inp_width=inp_width, wgt_width=wgt_width, acc_width=acc_width,
        out_width=out_width, **sizes, uop_buffer_bytes=uop_bytes,
        bus_width=draw(st.sampled_from((64, 128, 256, 512))),
        cmd_queue_depth=1 << draw(st.integers(1, 12)),
        token_queue_depth=1 << draw(st.integers(1, 12)),
        clock_mhz=draw(st.floats(1, 1000)))


def field_range(config: AccelConfig, opcode: Opcode, name: str) -> tuple[int, int]:
    """``(lo, hi)`` of an instruction field for ``config``."""
    (field,) = [f for f in isa.fields_of(config, opcode) if f.name == name]
    return field.lo, field.hi


def _ints(config: AccelConfig, opcode: Opcode, name: str) -> st.SearchStrategy[int]:
    lo, hi = field_range(config, opcode, name)
    return st.integers(lo, hi)


@st.composite
def deps_for(draw, engine: Engine) -> dict[str, bool]:
    """Dependency flags legal on ``engine``."""
    return {flag: draw(st.booleans()) for flag in ENGINE_FLAGS[engine]}


def _with_deps(draw, insn):
    return dataclasses.replace(insn, **draw(deps_for(isa.engine_of(insn))))


def _int_fields(draw, config: AccelConfig, cls: type, opcode: Opcode) -> dict[str, int]:
    """Every integer dataclass field of ``cls``, drawn over its encoding range."""
    skip = {"mem", "op", "imm", "reset", "overwrite", "requant", "relu", "bias", "bias_per_row", *isa.DEP_FLAGS}
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    return {n: draw(_ints(config, opcode, n)) for n in names}


@st.composite
def loads(draw, config: AccelConfig) -> isa.Load:
    mem = draw(st.sampled_from(LOAD_MEMS))
    values = _int_fields(draw, config, isa.Load, Opcode.LOAD)
    if mem == MemType.UOP:
        values.update(y_pad0=0, y_pad1=0, x_pad0=0, x_pad1=0)
    return _with_deps(draw, isa.Load(mem=mem, **values))


@st.composite
def stores(draw, config: AccelConfig) -> isa.Store:
    mem = draw(st.sampled_from(STORE_MEMS))
    values = _int_fields(draw, config, isa.Store, Opcode.STORE)
    flags = {name: draw(st.booleans()) for name in ("requant", "relu", "bias", "bias_per_row")}
    flags["requant"] &= mem == MemType.ACC
    if not flags["requant"]:
        values.update(shift=0)
        flags.update(relu=False, bias=False)
    if not flags["bias"]:
        values.update(bias_base=0)
        flags.update(bias_per_row=False)
    return _with_deps(draw, isa.Store(mem=mem, **flags, **values))


@st.composite
def gemms(draw, config: AccelConfig) -> isa.Gemm:
    values = _int_fields(draw, config, isa.Gemm, Opcode.GEMM)
    return _with_deps(draw, isa.Gemm(reset=draw(st.booleans()), overwrite=draw(st.booleans()), **values))


@st.composite
def alus(draw, config: AccelConfig) -> isa.Alu:
    values = _int_fields(draw, config, isa.Alu, Opcode.ALU)
    imm = draw(st.none() | _ints(config, Opcode.ALU, "imm"))
    return _with_deps(draw, isa.Alu(op=draw(st.sampled_from(AluOp)), imm=imm, **values))


@st.composite
def finishes(draw) -> isa.Finish:
    return _with_deps(draw, isa.Finish())


def instructions(config: AccelConfig) -> st.SearchStrategy[isa.Instruction]:
    """A random valid instruction of any kind for ``config``."""
    return st.one_of(loads(config), stores(config), gemms(config), alus(config), finishes())


@st.composite
def uops(draw, config: AccelConfig) -> isa.Uop:
    return isa.Uop(**{f.name: draw(st.integers(f.lo, f.hi)) for f in isa.uop_fields(config)})


_TENSOR_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,11}", fullmatch=True)
_DTYPES = st.sampled_from(("int8", "int16", "int32", "uint8", "float32"))


@st.composite
def tensor_regions(draw, name: str | None = None):
    from gemforge.hw.program import TensorRegion
    shape = tuple(draw(st.lists(st.integers(0, 8), max_size=4)))
    return TensorRegion(name if name is not None else draw(_TENSOR_NAME),
                        draw(st.integers(0, 1 << 16)), shape, draw(_DTYPES))


@st.composite
def programs(draw, config: AccelConfig, max_insns: int = 12, max_uops: int = 8):
    """A random `Program` (no constants) whose layout is consistent."""
    from gemforge.hw.program import Program
    insns = draw(st.lists(instructions(config), max_size=max_insns))
    uop_list = draw(st.lists(uops(config), max_size=max_uops))
    names = draw(st.lists(_TENSOR_NAME, max_size=3, unique=True))
    tensors = {n: draw(tensor_regions(n)) for n in names}
    uop_offset = draw(st.integers(0, 64)) * config.uop_entry_bytes
    needed = max([uop_offset + len(uop_list) * config.uop_entry_bytes,
                  *(r.offset + r.nbytes for r in tensors.values())])
    arena = needed + draw(st.sampled_from((0, 0, 1, 4096)))
    return Program(config, insns, uop_list, uop_offset, arena, tensors)
