"""Text assembler and disassembler for gemforge programs.

One instruction per line: a mnemonic (`isa.mnemonic`), then flags as bare
words, then ``field=value`` pairs named exactly as the instruction
dataclass's fields::

    ; comments start with ';' or '#'
    .config default digest=67c6f40117cc
    .uop_offset 0
    .arena_bytes 1024
    .tensor x offset=256 shape=1x16 dtype=int8
    .tensor w offset=512 shape=16x16 dtype=int8
    .tensor y offset=768 shape=1x16 dtype=int8
    .uop dst=0 src=0 wgt=0
    load.uop sram_base=0 dram_base=0 y_size=1 x_size=1 x_stride=1
    load.inp sram_base=0 dram_base=16 y_size=1 x_size=1 x_stride=1
    load.wgt push_next sram_base=0 dram_base=2 y_size=1 x_size=1 x_stride=1
    gemm pop_prev overwrite uop_bgn=0 uop_end=1 iter_out=1 iter_in=1
    alu.shr push_next uop_bgn=0 uop_end=1 iter_out=1 iter_in=1 imm=3
    store.out pop_prev sram_base=0 dram_base=48 y_size=1 x_size=1 x_stride=1
    finish

Mnemonics are case-insensitive; flags and field names are not. Flags are
the dependency flags (``pop_prev pop_next push_prev push_next``)
and every other boolean field (GEMM's ``reset`` and ``overwrite``, STORE's ``requant``, ``relu``, ``bias``
and ``bias_per_row``). Fields with a default
(pads, loop factors, ALU ``imm``) may be omitted; an ALU without ``imm=``
takes its operand from the accumulator. Integers are decimal or ``0x`` hex.

Directives describe the rest of a `Program`:

* ``.uop dst=N src=N [wgt=N]`` appends a micro-op (in text order);
* ``.uop_offset N`` and ``.arena_bytes N`` set the layout (defaults: 0, and
  the end of the last micro-op or tensor, whichever is further);
* ``.tensor NAME offset=N shape=AxBxC dtype=D`` adds a tensor region
  (``shape=()`` for a 0-d tensor);
* ``.config NAME [digest=HEX]`` names the config the text was written for
  (``digest`` is `AccelConfig.digest`, a hash of its fields, so a modified
  config that kept a preset's name is told apart): the disassembler writes
  both, the assembler refuses a text whose name or digest differs from the
  config it assembles for.

A program to run (``assemble(..., runnable=True)``, what ``gemforge asm``
does) ends with ``finish``, its only FINISH instruction.

Every syntax table here (mnemonics, field names, defaults, flags, order) is
derived from the instruction dataclasses and `isa.fields_of`, and every range
check is `isa.validate`'s, so the assembler cannot drift from the encoder.

`disassemble` writes canonical text: layout directives first, then the
micro-ops, then one line per instruction with flags in the order above and
fields in encoding order, required fields always, optional ones only when
they differ from their default, numbers in decimal. Hence, for every program
``p`` it accepts and every text ``t`` that assembles:

* ``assemble(disassemble(p), p.config)`` has ``p``'s instructions, micro-ops
  and layout (constant *contents* are not text and are left out);
* ``disassemble(assemble(t, c))`` is canonical, i.e. a fixed point.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterable

from .config import AccelConfig, load_config
from .isa import (
    DEP_FLAGS,
    INSTRUCTION_TYPES,
    AluOp,
    Finish,
    Instruction,
    IsaError,
    MemType,
    Opcode,
    Uop,
    fields_of,
    mnemonic,
    uop_fields,
    validate,
    validate_uop,
)

from .program import TENSOR_DTYPES, Program, TensorRegion

__all__ = [
    "AsmError",
    "assemble",
    "assemble_instructions",
    "disassemble",
    "legal_flags",
    "disassemble_instructions",
    "format_instruction",
    "format_uop",
    "mnemonics",
    "template",
]


class AsmError(ValueError):
    """Assembly text (or a program to disassemble) is invalid; the message says where."""


# ---------------------------------------------------------------------------- syntax tables

# Dataclass fields fixed by the mnemonic rather than written as operands.
_VARIANT_FIELDS = {"mem": MemType, "op": AluOp}


@dataclass(frozen=True)
class _Kind:
    """How one mnemonic maps onto an instruction dataclass."""

    cls: type
    fixed: dict[str, Any]         # fields the mnemonic sets (mem / op)
    flags: tuple[str, ...]        # boolean fields, written as bare words
    defaults: dict[str, Any]      # optional value fields and their defaults
    value_fields: frozenset[str]  # every field written as name=value

    @property
    def opcode(self) -> Opcode:
        return self.cls.opcode


def _prototype(kind: _Kind) -> Instruction:
    """The kind with every field zero or default: legal iff the mnemonic is."""
    required = {name: 0 for name in kind.value_fields if name not in kind.defaults}
    return kind.cls(**kind.fixed, **required)


def _build_kinds() -> dict[str, _Kind]:
    """Every mnemonic `isa.mnemonic` can produce, legal or not.

    Illegal combinations (``load.out``, ``store.inp``) stay in the table so
    that the assembler reports `isa.validate`'s reason instead of a bare
    "unknown mnemonic"; `mnemonics` lists only the legal ones."""
    kinds: dict[str, _Kind] = {}
    for cls in INSTRUCTION_TYPES.values():
        fields = dataclasses.fields(cls)
        # Dependency flags first, in DEP_FLAGS order, then the kind's own
        # boolean fields (GEMM reset), so disassembly order is fixed.
        own_flags = [f.name for f in fields if isinstance(f.default, bool) and f.name not in DEP_FLAGS]
        flags = (*DEP_FLAGS, *own_flags)
        variants = [f for f in fields if f.name in _VARIANT_FIELDS]
        values = [f for f in fields if f.name not in flags and f.name not in _VARIANT_FIELDS]
        defaults = {f.name: f.default for f in values if f.default is not dataclasses.MISSING}
        assert len(variants) <= 1, f"{cls.__name__} has more than one mnemonic-selected field"
        choices = [{}] if not variants else [
            {variants[0].name: member} for member in _VARIANT_FIELDS[variants[0].name]]
        for fixed in choices:
            kind = _Kind(cls, fixed, flags, defaults, frozenset(f.name for f in values))
            kinds[mnemonic(_prototype(kind))] = kind
    return kinds


_KINDS = _build_kinds()


def template(name: str) -> Instruction:
    """The instruction mnemonic ``name`` stands for, every field zero or default.

    Raises
    ------
    AsmError
        When ``name`` is not a mnemonic."""
    kind = _KINDS.get(name.lower())
    if kind is None:
        raise AsmError(f"unknown mnemonic {name!r}; expected one of {', '.join(mnemonics())}")
    return _prototype(kind)


def mnemonics(config: AccelConfig | str | None = None) -> list[str]:
    """The mnemonics that name a legal instruction kind, in table order."""
    config = load_config(config)
    legal = []
    for name, kind in _KINDS.items():
        try:
            validate(_prototype(kind), config)
        except IsaError:
            continue
        legal.append(name)
    return legal


def legal_flags(name: str, config: AccelConfig | str | None = None) -> tuple[str, ...]:
    """The flags mnemonic ``name`` accepts: each that `isa.validate` takes on its own or
    together with every other flag of the kind that is not a dependency flag (a STORE's
    ``relu`` needs ``requant``), in table order."""
    config = load_config(config)
    kind = _KINDS[name]
    prototype = _prototype(kind)
    own = {flag: True for flag in kind.flags if flag not in DEP_FLAGS}
    legal = []
    for flag in kind.flags:
        for extra in ({}, own):
            try:
                validate(dataclasses.replace(prototype, **{**extra, flag: True}), config)
            except IsaError:
                continue
            legal.append(flag)
            break
    return tuple(legal)


def _operand_order(kind: _Kind, config: AccelConfig) -> list[str]:
    """Value fields in encoding order (as the ISA reference lists them)."""
    order = [f.name for f in fields_of(config, kind.opcode) if f.name in kind.value_fields]
    assert set(order) == kind.value_fields, (order, kind.value_fields)
    return order


# ---------------------------------------------------------------------------- lexing helpers

_NUMBER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+)\Z")
_DIM = re.compile(r"[0-9]+\Z")
_NAME = re.compile(r"[^\s=#;]+\Z")
_COMMENT = re.compile(r"[#;].*")
_EQUALS = re.compile(r"\s*=\s*")


def _parse_int(text: str, what: str, line: int) -> int:
    """A decimal or 0x-hex integer, optionally signed (ranges are `validate`'s job)."""
    if not _NUMBER.match(text):
        raise AsmError(f"line {line}: bad number {text!r} for {what}; "
                       "write a decimal or 0x-prefixed hexadecimal integer")
    body = text.lstrip("+-")
    if len(body) > 40:       # beyond any field (and Python's 4300-digit limit for decimals)
        raise AsmError(f"line {line}: number {text[:20]}… for {what} has {len(body)} digits, beyond any field's range")
    magnitude = int(body, 16) if body[:2].lower() == "0x" else int(body, 10)
    return -magnitude if text.startswith("-") else magnitude


def _split_pairs(tokens: list[str], line: int, what: str) -> tuple[list[str], dict[str, str]]:
    """Bare words and ``key=value`` pairs of a line, refusing duplicate keys."""
    words: list[str] = []
    pairs: dict[str, str] = {}
    for token in tokens:
        if "=" not in token:
            words.append(token)
            continue
        key, _, value = token.partition("=")
        if not key or not value or "=" in value:
            raise AsmError(f"line {line}: malformed operand {token!r} in {what}; write name=value")
        if key in pairs:
            raise AsmError(f"line {line}: duplicate field {key} in {what}")
        pairs[key] = value
    return words, pairs


# ---------------------------------------------------------------------------- assembling

@dataclass
class _Parsed:
    instructions: list[Instruction] = dataclasses.field(default_factory=list)
    uops: list[Uop] = dataclasses.field(default_factory=list)
    uop_offset: int = 0
    arena_bytes: int | None = None
    tensors: dict[str, tuple[int, TensorRegion]] = dataclasses.field(default_factory=dict)  # name -> (line, region)
    directive_lines: dict[str, int] = dataclasses.field(default_factory=dict)
    instruction_lines: list[int] = dataclasses.field(default_factory=list)


def _parse_instruction(tokens: list[str], line: int, config: AccelConfig) -> Instruction:
    name = tokens[0].lower()
    kind = _KINDS.get(name)
    if kind is None:
        raise AsmError(f"line {line}: unknown mnemonic {tokens[0]!r}; expected one of "
                       + ", ".join(mnemonics(config)))
    try:
        validate(_prototype(kind), config)
    except IsaError as exc:
        raise AsmError(f"line {line}: {exc}") from None
    words, pairs = _split_pairs(tokens[1:], line, name)
    values: dict[str, Any] = dict(kind.fixed)
    for word in words:
        if word in kind.flags:
            if word in values:
                raise AsmError(f"line {line}: duplicate flag {word} in {name}")
            values[word] = True
        elif word in kind.value_fields:
            raise AsmError(f"line {line}: field {word} of {name} needs a value; write {word}=N")
        else:
            raise AsmError(f"line {line}: unknown flag {word!r} for {name}; allowed flags: "
                           + ", ".join(kind.flags))
    for key, text in pairs.items():
        if key in kind.fixed:
            raise AsmError(f"line {line}: {key} is given by the mnemonic {name}; remove {key}={text}")
        if key in kind.flags:
            raise AsmError(f"line {line}: {key} is a flag of {name}; write it as a bare word, "
                           f"not {key}={text}")
        if key not in kind.value_fields:
            raise AsmError(f"line {line}: unknown field {key!r} for {name}; allowed fields: "
                           + ", ".join(_operand_order(kind, config)))
        values[key] = _parse_int(text, f"field {key}", line)
    missing = [f for f in _operand_order(kind, config) if f not in kind.defaults and f not in values]
    if missing:
        raise AsmError(f"line {line}: {name} is missing required field"
                       f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    insn = kind.cls(**values)
    try:
        validate(insn, config)
    except IsaError as exc:
        raise AsmError(f"line {line}: {exc}") from None
    return insn


def _parse_uop(tokens: list[str], line: int, config: AccelConfig) -> Uop:
    words, pairs = _split_pairs(tokens[1:], line, ".uop")
    names = [f.name for f in uop_fields(config)]
    if words:
        raise AsmError(f"line {line}: unexpected {words[0]!r} in .uop; write "
                       + " ".join(f"{n}=N" for n in names))
    for key in pairs:
        if key not in names:
            raise AsmError(f"line {line}: unknown field {key!r} for .uop; allowed fields: {', '.join(names)}")
    defaults = {f.name: f.default for f in dataclasses.fields(Uop) if f.default is not dataclasses.MISSING}
    missing = [n for n in names if n not in pairs and n not in defaults]
    if missing:
        raise AsmError(f"line {line}: .uop is missing required field"
                       f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    uop = Uop(**{k: _parse_int(v, f"field {k}", line) for k, v in pairs.items()})
    try:
        validate_uop(uop, config)
    except IsaError as exc:
        raise AsmError(f"line {line}: {exc}") from None
    return uop


def _parse_tensor(tokens: list[str], line: int) -> TensorRegion:
    words, pairs = _split_pairs(tokens[1:], line, ".tensor")
    usage = "write .tensor NAME offset=N shape=AxBxC dtype=D"
    if len(words) != 1:
        raise AsmError(f"line {line}: .tensor takes exactly one name; {usage}")
    name = words[0]
    if not _NAME.match(name):
        raise AsmError(f"line {line}: bad tensor name {name!r}")
    for key in pairs:
        if key not in ("offset", "shape", "dtype"):
            raise AsmError(f"line {line}: unknown field {key!r} for .tensor; allowed fields: offset, shape, dtype")
    missing = [k for k in ("offset", "shape", "dtype") if k not in pairs]
    if missing:
        raise AsmError(f"line {line}: .tensor {name} is missing {', '.join(missing)}; {usage}")
    offset = _parse_int(pairs["offset"], "field offset", line)
    if offset < 0:
        raise AsmError(f"line {line}: tensor {name} offset must be non-negative, not {offset}")
    shape_text = pairs["shape"]
    if shape_text == "()":
        shape: tuple[int, ...] = ()
    else:
        dims = shape_text.lower().split("x")
        if not all(_DIM.match(d) for d in dims):
            raise AsmError(f"line {line}: bad shape {shape_text!r} for tensor {name}; write decimal "
                           "sizes joined by 'x' (e.g. 1x16x16), or () for a 0-d tensor")
        shape = tuple(_parse_int(d, f"a dimension of tensor {name}", line) for d in dims)
    if pairs["dtype"] not in TENSOR_DTYPES:
        raise AsmError(f"line {line}: unknown dtype {pairs['dtype']!r} for tensor {name}; "
                       f"use one of {', '.join(TENSOR_DTYPES)}")
    return TensorRegion(name, offset, shape, pairs["dtype"])


def _parse(text: str, config: AccelConfig) -> _Parsed:
    parsed = _Parsed()
    for line, raw in enumerate(text.splitlines(), start=1):
        tokens = _EQUALS.sub("=", _COMMENT.sub("", raw)).split()
        if not tokens:
            continue
        head = tokens[0].lower()
        if not head.startswith("."):
            parsed.instructions.append(_parse_instruction(tokens, line, config))
            parsed.instruction_lines.append(line)
        elif head == ".uop":
            parsed.uops.append(_parse_uop(tokens, line, config))
        elif head == ".tensor":
            region = _parse_tensor(tokens, line)
            if region.name in parsed.tensors:
                first = parsed.tensors[region.name][0]
                raise AsmError(f"line {line}: duplicate tensor {region.name} (first defined on line {first})")
            parsed.tensors[region.name] = (line, region)
        elif head in (".uop_offset", ".arena_bytes"):
            if head in parsed.directive_lines:
                raise AsmError(f"line {line}: duplicate {head} directive "
                               f"(first on line {parsed.directive_lines[head]})")
            if len(tokens) != 2:
                raise AsmError(f"line {line}: {head} takes exactly one number")
            value = _parse_int(tokens[1], head, line)
            if value < 0:
                raise AsmError(f"line {line}: {head} must be non-negative, not {value}")
            if head == ".uop_offset" and value % config.uop_entry_bytes:
                raise AsmError(f"line {line}: .uop_offset {value} is not a multiple of the "
                               f"{config.uop_entry_bytes}-byte micro-op size")
            parsed.directive_lines[head] = line
            setattr(parsed, head[1:], value)
        elif head == ".config":
            digest = tokens[2][len("digest="):] if len(tokens) == 3 and tokens[2].startswith("digest=") else None
            if len(tokens) != 2 and digest is None:
                raise AsmError(f"line {line}: .config takes a name and optionally digest=HEX")
            if tokens[1] != config.name:
                raise AsmError(f"line {line}: the program says .config {tokens[1]}, but it is being assembled for "
                               f"config {config.name!r}; pass --config {tokens[1]} or fix the directive")
            if digest is not None and digest.lower() != config.digest:
                raise AsmError(f"line {line}: the program was written for a config {tokens[1]!r} with digest "
                               f"{digest}, but config {config.name!r} has digest {config.digest} (the same name, "
                               "different fields); assemble it with the config file it was written for")
        else:
            raise AsmError(f"line {line}: unknown directive {tokens[0]!r}; expected one of "
                           ".config, .uop, .uop_offset, .arena_bytes, .tensor")
    return parsed


def assemble_instructions(text: str, config: AccelConfig | str | None) -> list[Instruction]:
    """The instructions of assembly ``text`` (directives are checked, then ignored).

    Raises
    ------
    AsmError
        On the first invalid line, with its number."""
    return _parse(text, load_config(config)).instructions


def assemble(text: str, config: AccelConfig | str | None, *, runnable: bool = False) -> Program:
    """Assemble ``text`` into a `Program` for ``config`` (an `AccelConfig` or a preset name).

    Raises
    ------
    AsmError
        On the first invalid line, with its number; or when the layout does
        not fit an explicit ``.arena_bytes``."""
    config = load_config(config)
    parsed = _parse(text, config)
    if runnable:
        _check_runnable(parsed)
    uop_end = parsed.uop_offset + len(parsed.uops) * config.uop_entry_bytes
    tensor_ends = [region.offset + region.nbytes for _, region in parsed.tensors.values()]
    arena = parsed.arena_bytes
    if arena is None:
        arena = max([uop_end, *tensor_ends])
    else:
        arena_line = parsed.directive_lines[".arena_bytes"]
        # Report each overflow at the line that caused it, not at Program().
        for line, region in parsed.tensors.values():
            if region.offset + region.nbytes > arena:
                raise AsmError(f"line {line}: tensor {region.name} ends at byte "
                               f"{region.offset + region.nbytes}, past the {arena}-byte arena "
                               f"set on line {arena_line}")
        if uop_end > arena:
            raise AsmError(f"line {arena_line}: the arena of {arena} bytes is too small for "
                           f"{len(parsed.uops)} micro-ops ending at byte {uop_end}")
    return Program(config, parsed.instructions, parsed.uops, parsed.uop_offset, arena,
                   {name: region for name, (_, region) in parsed.tensors.items()})


def _check_runnable(parsed: _Parsed) -> None:
    """A program to run ends with FINISH, its only one: the accelerator runs until FINISH
    retires, so a program without it never finishes and one with it earlier stops early."""
    finishes = [line for insn, line in zip(parsed.instructions, parsed.instruction_lines) if isinstance(insn, Finish)]
    if not parsed.instructions:
        raise AsmError("the program has no instructions; a program ends with finish")
    if not isinstance(parsed.instructions[-1], Finish):
        raise AsmError(f"line {parsed.instruction_lines[-1]}: the program must end with finish "
                       "(the accelerator runs until FINISH retires)")
    if len(finishes) > 1:
        raise AsmError(f"line {finishes[0]}: finish before the end of the program (only the last instruction "
                       "may be finish)")


# ---------------------------------------------------------------------------- disassembling

def format_instruction(insn: Instruction, config: AccelConfig | str | None) -> str:
    """One instruction as canonical assembly (validated first, so it reassembles).

    Raises
    ------
    AsmError
        When the instruction is not valid for ``config``."""
    config = load_config(config)
    try:
        validate(insn, config)
    except IsaError as exc:
        raise AsmError(str(exc)) from None
    name = mnemonic(insn)
    kind = _KINDS[name]
    parts = [name]
    parts += [flag for flag in kind.flags if getattr(insn, flag)]
    for field in _operand_order(kind, config):
        value = getattr(insn, field)
        if field in kind.defaults and value == kind.defaults[field]:
            continue
        parts.append(f"{field}={int(value)}")
    return " ".join(parts)


def format_uop(uop: Uop, config: AccelConfig | str | None) -> str:
    """A ``.uop`` directive; every field is written, so micro-op tables line up."""
    config = load_config(config)
    try:
        validate_uop(uop, config)
    except IsaError as exc:
        raise AsmError(str(exc)) from None
    return ".uop " + " ".join(f"{f.name}={int(getattr(uop, f.name))}" for f in uop_fields(config))


def disassemble_instructions(insns: Iterable[Instruction], config: AccelConfig | str | None) -> str:
    """Canonical text of an instruction list, one line each."""
    lines = []
    for index, insn in enumerate(insns):
        try:
            lines.append(format_instruction(insn, config))
        except AsmError as exc:
            raise AsmError(f"instruction {index}: {exc}") from None
    return "".join(line + "\n" for line in lines)


def _format_tensor(key: str, region: TensorRegion) -> str:
    if key != region.name or not _NAME.match(region.name):
        raise AsmError(f"tensor {key!r} cannot be written as assembly: its name must be one "
                       "word without '=', '#' or ';' and match its region's name")
    shape = "x".join(str(int(d)) for d in region.shape) if region.shape else "()"
    return f".tensor {region.name} offset={int(region.offset)} shape={shape} dtype={region.dtype}"


def disassemble(program: Program) -> str:
    """Canonical assembly text of ``program`` (see the module docstring).

    Constant tensor *contents* have no text form; each constant is noted in a
    comment so the reader knows the binary carries data the text does not.

    Raises
    ------
    AsmError
        When an instruction, micro-op or tensor name cannot be written so that
        it reassembles to the same program."""
    config = program.config
    lines = [f".config {config.name} digest={config.digest}" if _NAME.match(config.name)
             else "; config with an unprintable name",
             f".uop_offset {program.uop_offset}",
             f".arena_bytes {program.arena_bytes}"]
    lines += [_format_tensor(key, region) for key, region in program.tensors.items()]
    lines += [f"; constant {name}: {int(data.nbytes)} bytes of data, not shown"
              for name, data in program.constants.items()]
    for index, uop in enumerate(program.uops):
        try:
            lines.append(format_uop(uop, config))
        except AsmError as exc:
            raise AsmError(f"micro-op {index}: {exc}") from None
    text = "".join(line + "\n" for line in lines)
    return text + disassemble_instructions(program.instructions, config)
