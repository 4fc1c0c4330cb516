"""A config's parameters as a C header, so C code on a board needs nothing else.

`config_header` writes, as ``#define`` macros, every `AccelConfig` field, every derived
parameter (`isa.derived`: entry bytes and depth of each buffer, index and micro-op widths,
the instruction width), the instruction bytes, the arena alignment (`program.arena_alignment`),
the opcodes, buffer kinds and ALU operations, and the bit offset (``_SHIFT``, from bit 0 of the
little-endian word) and width of every instruction field of every opcode (`isa.fields_of`)
and of every micro-op field (`isa.uop_fields`). Each value is read from its one definition,
as Gemmini's ``gemmini_params.h`` and VTA's ``pkg_config`` emit theirs. `gemforge generate`
writes it as ``gemforge_params.h`` beside the register map's ``gemforge_regs.h``
(`regmap.to_c_header`); the two share the ``GEMFORGE_`` prefix and no macro name.
"""

from __future__ import annotations

import json

from .config import BUS_ADDR_BITS, AccelConfig
from .isa import AluOp, MemType, Opcode, derived, fields_of, insn_bytes, uop_fields
from .program import arena_alignment

__all__ = ["config_header"]


def config_header(config: AccelConfig, guard: str = "GEMFORGE_PARAMS_H") -> str:
    """The parameters of ``config`` as a C header of ``#define`` macros (see the module)."""
    names: set[str] = set()
    lines = [f"/* gemforge parameters of config {config.name}: generated from gemforge.hw (config, isa, "
             "program), do not edit. */",
             f"#ifndef {guard}", f"#define {guard}"]

    def define(name: str, value, comment: str = "", *, signed: bool = False) -> None:
        macro = f"GEMFORGE_{name.upper()}"
        assert macro not in names, f"{macro} is defined twice"
        assert "*/" not in comment
        names.add(macro)
        literal = _c_literal(value, signed=signed)
        lines.append(f"#define {macro} {literal}" + (f"  /* {comment} */" if comment else ""))

    def section(title: str) -> None:
        lines.extend(["", f"/* {title} */"])

    section("The config's fields (AccelConfig)")
    for field, value in config.to_dict().items():
        define("config_name" if field == "name" else field, value)
    define("config_digest", config.digest, "AccelConfig.digest: every field but the name")

    section("Derived parameters")
    for name, value in derived(config).items():
        if name.endswith("_range"):         # an inclusive (lowest, highest) pair of signed values
            low, high = value
            define(f"{name.removesuffix('_range')}_min", low, signed=True)
            define(f"{name.removesuffix('_range')}_max", high, signed=True)
        else:
            define(name, value)
    define("insn_bytes", insn_bytes(config), "bytes per instruction word")
    define("arena_alignment", arena_alignment(config), "a program's arena starts at a multiple of this")
    define("bus_addr_bits", BUS_ADDR_BITS, "width of a DRAM byte address")

    section("Opcodes, buffer kinds (LOAD/STORE mem) and ALU operations")
    for opcode in Opcode:
        define(f"opcode_{opcode.name}", int(opcode))
    for mem in MemType:
        define(f"mem_{mem.name}", int(mem))
    for op in AluOp:
        define(f"alu_op_{op.name}", int(op))

    section("Instruction fields: bit offset (_SHIFT) in the little-endian word and width (_WIDTH)")
    for opcode in Opcode:
        shift = 0
        for field in fields_of(config, opcode):
            prefix = f"insn_{opcode.name}_{field.name}"
            define(f"{prefix}_shift", shift, field.doc)
            define(f"{prefix}_width", field.width)
            shift += field.width

    section("Micro-op fields: bit offset (_SHIFT) in the little-endian word and width (_WIDTH)")
    shift = 0
    for field in uop_fields(config):
        define(f"uop_{field.name}_shift", shift, field.doc)
        define(f"uop_{field.name}_width", field.width)
        shift += field.width

    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def _c_literal(value, *, signed: bool = False) -> str:
    """``value`` as a C constant: an unsigned integer (a signed ``int`` with ``signed``, a
    negative one parenthesized), a double or a string."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise AssertionError(f"no C literal for {value!r}")
    if isinstance(value, str):
        return json.dumps(value)        # a config name or digest: letters, digits, '_', '-', '.'
    if isinstance(value, float):
        return repr(value)
    if signed:
        assert -(1 << 31) < value < 1 << 31, value
        return f"({value})" if value < 0 else str(value)
    assert 0 <= value < 1 << 64, value
    return f"{value}u" if value < 1 << 32 else f"{value}ull"
