"""The ISA reference page, generated from the code.

`isa_reference` renders Markdown from `gemforge.hw.isa` and an `AccelConfig`
alone: semantics from the instruction dataclasses' docstrings, field layouts
from `isa.fields_of` / `isa.uop_fields`, enumerations from the enum classes
(member descriptions from their ``#:`` comments, as Sphinx autodoc reads
them), engines from `isa.engine_of`, and numbers from ``isa.derived(config)``.
Nothing here restates a width or a value, so the page cannot drift from the
encoder.
"""

from __future__ import annotations

import enum
import inspect
import re

from . import isa
from .asm import mnemonics, template
from .config import AccelConfig, load_config
from .isa import insn_bits, insn_bytes

__all__ = ["isa_reference"]


def isa_reference(config: AccelConfig | str | None = None) -> str:
    """The Markdown ISA reference for ``config`` (an `AccelConfig` or a preset name)."""
    config = load_config(config)
    sections = [
        _overview(config),
        _enumerations(),
        *(_instruction(config, opcode) for opcode in isa.Opcode),
        _micro_op(config),
        _dependencies(config),
        _parameters(config),
    ]
    return "\n\n".join(s.strip("\n") for s in sections) + "\n"


# ---------------------------------------------------------------------------- sections

def _overview(config: AccelConfig) -> str:
    used = {op: sum(f.width for f in isa.fields_of(config, op)) for op in isa.Opcode}
    rows = [(f"`{op.name}`", str(used[op]), str(insn_bits(config) - used[op])) for op in isa.Opcode]
    return "\n".join([
        f"# gemforge ISA reference — config `{config.name}`",
        "",
        "Generated from `gemforge.hw.isa` and the config by `gemforge.hw.isa_doc`; do not edit.",
        "",
        _rst_to_md(_first_paragraphs(isa.__doc__, 2)),
        "",
        f"For this config every instruction is one **{insn_bits(config)}-bit** word "
        f"({insn_bytes(config)} bytes); a micro-op is stored in **{config.uop_bits} bits**.",
        "",
        _table(("kind", "bits used", "unused (zero) bits"), rows),
    ])


def _enumerations() -> str:
    parts = ["## Enumerations"]
    for enum_cls in (isa.Opcode, isa.MemType, isa.AluOp):
        docs = _member_docs(enum_cls)
        width = {isa.Opcode: isa.OPCODE_BITS, isa.MemType: isa.MEM_TYPE_BITS, isa.AluOp: isa.ALU_OP_BITS}[enum_cls]
        rows = [(str(m.value), f"`{m.name}`", f"`{m.name.lower()}`", docs.get(m.name, "")) for m in enum_cls]
        parts += ["", f"### {enum_cls.__name__} ({width} bits)", "",
                  _table(("value", "name", "mnemonic part", "meaning"), rows)]
    return "\n".join(parts)


def _instruction(config: AccelConfig, opcode: isa.Opcode) -> str:
    cls = isa.INSTRUCTION_TYPES[opcode]
    names = [name for name in mnemonics(config) if type(template(name)) is cls]
    engines = {name: isa.engine_of(template(name)).value for name in names}
    fields = isa.fields_of(config, opcode)
    total = sum(f.width for f in fields)
    return "\n".join([
        f"## {opcode.name} (opcode {opcode.value})",
        "",
        "Assembly: " + ", ".join(f"`{n}` ({engines[n]} engine)" for n in names) + ".",
        "",
        _rst_to_md(inspect.cleandoc(cls.__doc__ or "")),
        "",
        _field_table(fields),
        "",
        f"{total} of {insn_bits(config)} bits used; bits {total} and up are zero.",
    ])


def _micro_op(config: AccelConfig) -> str:
    fields = isa.uop_fields(config)
    used = sum(f.width for f in fields)
    return "\n".join([
        "## Micro-op",
        "",
        _rst_to_md(inspect.cleandoc(isa.Uop.__doc__ or "")),
        "",
        _rst_to_md(inspect.cleandoc(isa.encode_uops.__doc__ or "")),
        "",
        _field_table(fields),
        "",
        f"{used} of {config.uop_bits} bits used ({config.uop_entry_bytes} bytes per micro-op); "
        f"the buffer holds {config.uop_depth} micro-ops.",
    ])


def _dependencies(config: AccelConfig) -> str:
    stages = list(isa.Engine)  # pipeline order: load → compute → store
    rows = []
    for before, after in zip(stages, stages[1:]):
        rows.append((f"{before.value} → {after.value}", f"`push_next` on {before.value}",
                     f"`pop_prev` on {after.value}", "data ready"))
        rows.append((f"{after.value} → {before.value}", f"`push_prev` on {after.value}",
                     f"`pop_next` on {before.value}", "buffer free"))
    first, last = stages[0].value, stages[-1].value
    return "\n".join([
        "## Dependency tokens",
        "",
        _rst_to_md(inspect.cleandoc(isa._Deps.__doc__ or "")),
        "",
        f"The engines form the pipeline {' → '.join(s.value for s in stages)}. Between each pair "
        f"of neighbours there are two token queues, one each way, each holding up to "
        f"{config.token_queue_depth} tokens (`token_queue_depth`):",
        "",
        _table(("queue", "sender", "receiver", "meaning"), rows),
        "",
        "- A `pop_*` flag blocks the instruction *before it starts* until a token is in the queue, "
        "then consumes it.",
        "- A `push_*` flag adds a token *after the instruction completes*; a push into a full queue "
        "blocks its engine until the receiver pops.",
        f"- The {first} engine has no previous stage and the {last} engine no next stage, so "
        f"`pop_prev`/`push_prev` are refused on {first}-engine instructions and "
        f"`pop_next`/`push_next` on {last}-engine ones.",
        "- Each engine executes its own instructions in program order; tokens are the only "
        "ordering between engines.",
        "",
        "### End of program",
        "",
        f"A program ends with one `{isa.Opcode.FINISH.name}`, its last instruction (see above). "
        "When it retires, every other engine must be idle and every token queue empty, so each "
        "queue's pushes and pops must balance: an unbalanced program is wrong even if it computes "
        "the right result. Neither the simulator nor the hardware hangs on one: fsim raises an error "
        "with the queue state, the hardware ends the program with a fault code (`TOKEN_IMBALANCE`, "
        "`DEADLOCK` or `NO_FINISH`; see the register map's fault table).",
    ])


def _parameters(config: AccelConfig) -> str:
    params = [(f"`{k}`", str(v)) for k, v in config.to_dict().items()]
    derived = [(f"`{k}`", str(v)) for k, v in isa.derived(config).items()]
    return "\n".join([
        "## Parameters",
        "",
        "### Configuration",
        "",
        _table(("parameter", "value"), params),
        "",
        "### Derived",
        "",
        _table(("parameter", "value"), derived),
    ])


# ---------------------------------------------------------------------------- helpers

def _field_table(fields: list[isa.Field]) -> str:
    rows = []
    pos = 0
    for f in fields:
        # [msb:lsb], as the register map and Verilog write bit ranges.
        bits = f"[{pos}]" if f.width == 1 else f"[{pos + f.width - 1}:{pos}]"
        rows.append((bits, str(f.width), f"`{f.name}`",
                     "signed" if f.signed else "unsigned", f"{f.lo}..{f.hi}", f.doc))
        pos += f.width
    return _table(("bits [msb:lsb]", "width", "field", "signedness", "range", "description"), rows)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    def row(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    return "\n".join([row(header), "|" + "|".join("---" for _ in header) + "|", *(row(r) for r in rows)])


def _member_docs(enum_cls: type[enum.Enum]) -> dict[str, str]:
    """Member descriptions from ``NAME = value  #: text`` comments in the class source."""
    try:
        source = inspect.getsource(enum_cls)
    except (OSError, TypeError):  # no source (frozen install): the table just has no meanings
        return {}
    pattern = re.compile(r"^\s*(\w+)\s*=.*?#:\s*(.*?)\s*$")
    return {m.group(1): m.group(2) for m in map(pattern.match, source.splitlines()) if m}


def _first_paragraphs(doc: str | None, count: int) -> str:
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(paragraphs[:count])


def _rst_to_md(text: str) -> str:
    """The little reStructuredText the ISA docstrings use, as Markdown.

    ``literal`` becomes `literal`, and a paragraph ending in ``::`` introduces
    an indented literal block, which becomes a fenced code block."""
    out: list[str] = []
    lines = text.replace("``", "`").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(line.rstrip()[:-1] if line.strip() != "::" else "")
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            body = inspect.cleandoc("\n".join(block))
            out += ["", "```", *body.splitlines(), "```", ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip("\n")
