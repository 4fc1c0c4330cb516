"""Assembler/disassembler: exact round trips and one error test per kind of mistake."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemforge.hw.config import AccelConfig
from gemforge.hw.program import Program, ProgramError, TensorRegion
from gemforge.hw import isa
from gemforge.hw.asm import (
    AsmError, assemble, assemble_instructions, disassemble, disassemble_instructions,
    format_instruction, mnemonics,
)
from gemforge.hw.isa import Alu, AluOp, Finish, Gemm, Load, MemType, Store, Uop
from strategies import CONFIGS, programs

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PARAMS = pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
TINY = CONFIGS["tiny"]

FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next", "reset", "overwrite", "requant", "relu", "bias",
         "bias_per_row")


def assert_same_program(a: Program, b: Program) -> None:
    assert a.config == b.config
    assert a.instructions == b.instructions
    assert a.uops == b.uops
    assert (a.uop_offset, a.arena_bytes) == (b.uop_offset, b.arena_bytes)
    assert list(a.tensors.items()) == list(b.tensors.items())
    assert isa.encode_program(a.instructions, a.config) == isa.encode_program(b.instructions, b.config)
    assert isa.encode_uops(a.uops, a.config) == isa.encode_uops(b.uops, b.config)


# ---------------------------------------------------------------------------- a noisy writer

@st.composite
def noisy_text(draw, program: Program) -> str:
    """Valid but non-canonical assembly of ``program``: shuffled operands, hex,
    explicit defaults, odd spacing, comments, blank lines, interleaved directives.
    Written independently of the disassembler so both sides are checked."""
    def number(value: int) -> str:
        if draw(st.booleans()):
            return str(value)
        digits = f"{abs(value):x}"
        digits = digits.upper() if draw(st.booleans()) else digits
        return ("-" if value < 0 else "") + draw(st.sampled_from(["0x", "0X"])) + digits

    def pair(key: str, value: str) -> str:
        return key + draw(st.sampled_from(["=", " = ", "= ", " ="])) + value

    def join(tokens: list[str]) -> str:
        line = draw(st.sampled_from(["", " ", "\t"]))
        for i, token in enumerate(tokens):
            line += token + ("" if i == len(tokens) - 1 else draw(st.sampled_from([" ", "  ", "\t"])))
        return line + draw(st.sampled_from(["", "  # note", " ; x=1 bogus", "\t;"]))

    def instruction(insn) -> str:
        tokens = []
        for f in dataclasses.fields(insn):
            value = getattr(insn, f.name)
            if f.name in FLAGS:
                if value:
                    tokens.append(f.name)
            elif f.name not in ("mem", "op"):
                optional = f.default is not dataclasses.MISSING
                if optional and value == f.default and draw(st.booleans()):
                    continue
                if value is not None:
                    tokens.append(pair(f.name, number(value)))
        tokens = draw(st.permutations(tokens))
        name = isa.mnemonic(insn)
        return join([name.upper() if draw(st.booleans()) else name, *tokens])

    body: list[tuple[str, str]] = [("insn", instruction(i)) for i in program.instructions]
    # Micro-ops keep their relative order; they may sit anywhere among instructions.
    for uop in program.uops:
        where = draw(st.integers(0, len(body)))
        later = [k for k, (kind, _) in enumerate(body) if kind == "uop"]
        where = max([where, *(k + 1 for k in later)])
        fields = [pair("dst", number(uop.dst)), pair("src", number(uop.src))]
        if uop.wgt or draw(st.booleans()):
            fields.append(pair("wgt", number(uop.wgt)))
        body.insert(where, ("uop", join([".uop", *draw(st.permutations(fields))])))

    head = [join([".config", program.config.name])] if draw(st.booleans()) else []
    tensors = []
    if program.uop_offset or draw(st.booleans()):
        head.append(join([".uop_offset", number(program.uop_offset)]))
    default_arena = max([program.uop_offset + len(program.uops) * program.config.uop_entry_bytes,
                         *(r.offset + r.nbytes for r in program.tensors.values())])
    if program.arena_bytes != default_arena or draw(st.booleans()):
        head.append(join([".arena_bytes", number(program.arena_bytes)]))
    for r in program.tensors.values():
        shape = "x".join(map(str, r.shape)) if r.shape else "()"
        fields = draw(st.permutations([pair("offset", number(r.offset)), pair("shape", shape),
                                       pair("dtype", r.dtype)]))
        tensors.append(join([".tensor", r.name, *fields]))
    head = draw(st.permutations(head))
    # Tensors keep their relative order (it is the Program's dict order).
    after = 0
    for line in tensors:
        after = draw(st.integers(after, len(head)))
        head.insert(after, line)
        after += 1
    lines = head + [text for _, text in body]
    out = []
    for line in lines:
        out += draw(st.sampled_from([[], [""], ["# comment"], ["   ; another"]]))
        out.append(line)
    return "\n".join(out) + draw(st.sampled_from(["", "\n", "\n\n"]))


# ---------------------------------------------------------------------------- round trips

@PARAMS
@FAST
@given(data=st.data())
def test_program_text_program(config, data):
    program = data.draw(programs(config))
    text = disassemble(program)
    again = assemble(text, config)
    assert_same_program(again, program)
    assert disassemble(again) == text


@PARAMS
@FAST
@given(data=st.data())
def test_text_program_text(config, data):
    program = data.draw(programs(config))
    text = data.draw(noisy_text(program))
    assembled = assemble(text, config)
    assert_same_program(assembled, program)
    canonical = disassemble(assembled)
    assert canonical == disassemble(program)
    assert disassemble(assemble(canonical, config)) == canonical  # a fixed point


@FAST
@given(data=st.data())
def test_assemble_instructions_matches_assemble(data):
    program = data.draw(programs(TINY))
    text = disassemble(program)
    assert assemble_instructions(text, TINY) == program.instructions
    assert disassemble_instructions(program.instructions, TINY) == \
        "".join(line + "\n" for line in text.splitlines() if not line.startswith((".", ";")))


# ---------------------------------------------------------------------------- examples

EXAMPLE = """\
; a small program
.config tiny
.tensor x offset=0 shape=1x16 dtype=int8   # input
.tensor y offset=0x10 shape=4 dtype=int32
.uop dst=0 src=0 wgt=0
.uop dst=1 src=0x2
load.inp push_next sram_base=0 dram_base=0 y_size=1 x_size=4 x_stride=4 x_pad1=2
load.uop sram_base=0 dram_base=0 y_size=1 x_size=2 x_stride=2
gemm pop_prev reset uop_bgn=0 uop_end=1 iter_out=1 iter_in=1
alu.shr uop_bgn=0 uop_end=2 iter_out=1 iter_in=1 imm=-3
alu.max uop_bgn=0 uop_end=2 iter_out=2 iter_in=1 src_factor_in=0x10
store.out pop_prev sram_base=0 dram_base=4 y_size=1 x_size=1 x_stride=1

finish
"""


def test_example_assembles_to_expected_program():
    program = assemble(EXAMPLE, "tiny")
    assert program.instructions == [
        Load(mem=MemType.INP, push_next=True, sram_base=0, dram_base=0, y_size=1, x_size=4, x_stride=4,
             x_pad1=2),
        Load(mem=MemType.UOP, sram_base=0, dram_base=0, y_size=1, x_size=2, x_stride=2),
        Gemm(pop_prev=True, reset=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1),
        Alu(op=AluOp.SHR, imm=-3, uop_bgn=0, uop_end=2, iter_out=1, iter_in=1),
        Alu(op=AluOp.MAX, uop_bgn=0, uop_end=2, iter_out=2, iter_in=1, src_factor_in=16),
        Store(mem=MemType.OUT, pop_prev=True, sram_base=0, dram_base=4, y_size=1, x_size=1, x_stride=1),
        Finish(),
    ]
    assert program.uops == [Uop(0, 0, 0), Uop(1, 2, 0)]
    assert program.tensors == {"x": TensorRegion("x", 0, (1, 16), "int8"),
                               "y": TensorRegion("y", 16, (4,), "int32")}
    assert program.uop_offset == 0
    assert program.arena_bytes == 32  # end of y; the micro-ops end at byte 8


def test_module_docstring_example_assembles():
    import gemforge.hw.asm as asm_module
    doc = asm_module.__doc__
    block = doc[doc.index("::\n\n") + 4:].split("\n\n")[0]
    program = assemble(block, "default")
    assert [isa.mnemonic(i) for i in program.instructions] == \
        ["load.uop", "load.inp", "load.wgt", "gemm", "alu.shr", "store.out", "finish"]
    assert len(program.uops) == 1 and program.arena_bytes == 1024 and set(program.tensors) == {"x", "w", "y"}


def test_canonical_text():
    text = disassemble(assemble(EXAMPLE, TINY))
    assert text.splitlines() == [
        f".config tiny digest={TINY.digest}",
        ".uop_offset 0",
        ".arena_bytes 32",
        ".tensor x offset=0 shape=1x16 dtype=int8",
        ".tensor y offset=16 shape=4 dtype=int32",
        ".uop dst=0 src=0 wgt=0",
        ".uop dst=1 src=2 wgt=0",
        "load.inp push_next sram_base=0 dram_base=0 y_size=1 x_size=4 x_stride=4 x_pad1=2",
        "load.uop sram_base=0 dram_base=0 y_size=1 x_size=2 x_stride=2",
        "gemm pop_prev reset uop_bgn=0 uop_end=1 iter_out=1 iter_in=1",
        "alu.shr uop_bgn=0 uop_end=2 iter_out=1 iter_in=1 imm=-3",
        "alu.max uop_bgn=0 uop_end=2 iter_out=2 iter_in=1 src_factor_in=16",
        "store.out pop_prev sram_base=0 dram_base=4 y_size=1 x_size=1 x_stride=1",
        "finish",
    ]


def test_flags_in_canonical_order():
    insn = Gemm(push_next=True, pop_prev=True, push_prev=True, pop_next=True, reset=True,
                uop_bgn=1, uop_end=2, iter_out=3, iter_in=4)
    assert format_instruction(insn, TINY) == \
        "gemm pop_prev pop_next push_prev push_next reset uop_bgn=1 uop_end=2 iter_out=3 iter_in=4"


def test_alu_imm_zero_is_not_the_register_form():
    text = "alu.add uop_bgn=0 uop_end=1 iter_out=1 iter_in=1 imm=0\nalu.add uop_bgn=0 uop_end=1 iter_out=1 iter_in=1"
    with_imm, with_reg = assemble_instructions(text, TINY)
    assert with_imm.imm == 0 and with_reg.imm is None
    assert format_instruction(with_imm, TINY).endswith(" imm=0")
    assert "imm" not in format_instruction(with_reg, TINY)


def test_empty_text_is_an_empty_program():
    program = assemble("\n  # nothing\n;\n", TINY)
    assert (program.instructions, program.uops, program.arena_bytes) == ([], [], 0)


def test_explicit_layout_directives():
    program = assemble(".uop_offset 8\n.arena_bytes 0x1000\n.uop dst=1 src=1\n", TINY)
    assert (program.uop_offset, program.arena_bytes) == (8, 4096)


def test_default_arena_covers_micro_ops_past_tensors():
    program = assemble(".uop_offset 64\n.tensor t offset=0 shape=8 dtype=int8\n.uop dst=0 src=0\n", TINY)
    assert program.arena_bytes == 64 + TINY.uop_entry_bytes


def test_zero_dimensional_tensor():
    program = assemble(".tensor s offset=4 shape=() dtype=float32\n", TINY)
    assert program.tensors["s"].shape == () and program.arena_bytes == 8
    assert ".tensor s offset=4 shape=() dtype=float32" in disassemble(program)


def test_constants_are_noted_not_written():
    region = TensorRegion("w", 0, (2, 2), "int8")
    program = Program(TINY, [Finish()], arena_bytes=4, tensors={"w": region},
                      constants={"w": np.zeros((2, 2), np.int8)})
    text = disassemble(program)
    assert "; constant w: 4 bytes of data, not shown" in text
    again = assemble(text, TINY)
    assert again.tensors == program.tensors and again.constants == {}


def test_mnemonics_are_the_legal_kinds():
    assert mnemonics(TINY) == ["load.inp", "load.wgt", "load.acc", "load.uop", "store.acc", "store.out",
                               "gemm", "alu.min", "alu.max", "alu.add", "alu.shr", "alu.mul", "finish"]


# ---------------------------------------------------------------------------- errors

GEMM_ARGS = "uop_bgn=0 uop_end=1 iter_out=1 iter_in=1"
LOAD_ARGS = "sram_base=0 dram_base=0 y_size=1 x_size=1 x_stride=1"


def refused(text: str, message: str) -> None:
    """Assembling ``text`` fails with exactly ``message``."""
    with pytest.raises(AsmError) as info:
        assemble(text, TINY)
    assert str(info.value) == message


def test_error_unknown_mnemonic():
    refused(f"finish\n\ngem {GEMM_ARGS}",
            "line 3: unknown mnemonic 'gem'; expected one of " + ", ".join(mnemonics(TINY)))


def test_error_illegal_kind_gives_the_isa_reason():
    refused(f"load.out {LOAD_ARGS}", "line 1: LOAD cannot target the out buffer; allowed: inp, wgt, acc, uop")
    refused(f"store.wgt {LOAD_ARGS}", "line 1: STORE reads the out or acc buffer, not wgt")


def test_error_unknown_field():
    refused(f"gemm {GEMM_ARGS} src_factor=1",
            "line 1: unknown field 'src_factor' for gemm; allowed fields: uop_bgn, uop_end, iter_out, "
            "iter_in, dst_factor_out, dst_factor_in, src_factor_out, src_factor_in, wgt_factor_out, "
            "wgt_factor_in")


def test_error_mnemonic_field_given_again():
    refused(f"load.inp mem=0 {LOAD_ARGS}", "line 1: mem is given by the mnemonic load.inp; remove mem=0")


def test_error_unknown_flag():
    refused(f"gemm {GEMM_ARGS} clear",
            "line 1: unknown flag 'clear' for gemm; allowed flags: pop_prev, pop_next, push_prev, "
            "push_next, reset, overwrite")


def test_error_reset_is_gemm_only():
    refused("alu.add reset uop_bgn=0 uop_end=1 iter_out=1 iter_in=1",
            "line 1: unknown flag 'reset' for alu.add; allowed flags: pop_prev, pop_next, push_prev, push_next")


def test_error_flag_with_value():
    refused(f"gemm reset=1 {GEMM_ARGS}", "line 1: reset is a flag of gemm; write it as a bare word, not reset=1")


def test_error_field_without_value():
    refused("gemm uop_bgn uop_end=1 iter_out=1 iter_in=1",
            "line 1: field uop_bgn of gemm needs a value; write uop_bgn=N")


@pytest.mark.parametrize("bad", ["1.5", "abc", "0x", "1e3", "0b11", "--1", "0xg"])
def test_error_bad_number(bad):
    refused(f"gemm uop_bgn={bad} uop_end=1 iter_out=1 iter_in=1",
            f"line 1: bad number {bad!r} for field uop_bgn; write a decimal or 0x-prefixed hexadecimal integer")


def test_error_malformed_operand():
    refused("gemm uop_bgn= uop_end=1", "line 1: malformed operand 'uop_bgn=uop_end=1' in gemm; write name=value")
    refused(f"gemm {GEMM_ARGS} =3", "line 1: malformed operand 'iter_in=1=3' in gemm; write name=value")


def test_error_duplicate_field():
    refused(f"gemm {GEMM_ARGS} iter_in=2", "line 1: duplicate field iter_in in gemm")


def test_error_duplicate_flag():
    refused(f"gemm reset reset {GEMM_ARGS}", "line 1: duplicate flag reset in gemm")


def test_error_missing_required_fields():
    refused("finish\nload.inp sram_base=0 dram_base=0 x_size=1",
            "line 2: load.inp is missing required fields y_size, x_stride")
    refused("gemm uop_bgn=0 uop_end=1 iter_out=1", "line 1: gemm is missing required field iter_in")


@pytest.mark.parametrize("value", [256, -1, 0x100])
def test_error_out_of_range_uses_isa_message(value):
    expected = None
    try:
        isa.validate(Gemm(uop_bgn=value, uop_end=1, iter_out=1, iter_in=1), TINY)
    except isa.IsaError as exc:
        expected = str(exc)
    assert expected and "uop_bgn" in expected and "0..255" in expected
    refused(f"gemm uop_bgn={value} uop_end=1 iter_out=1 iter_in=1", f"line 1: {expected}")


def test_error_imm_out_of_range():
    refused("alu.add uop_bgn=0 uop_end=1 iter_out=1 iter_in=1 imm=-32769",
            "line 1: alu.add field imm = -32769 is out of range: it is 16 bits signed for this config, "
            "so -32768..32767")


def test_error_flags_not_allowed_on_engine():
    refused(f"load.wgt pop_prev {LOAD_ARGS}",
            "line 1: load.wgt runs on the load engine, which has no previous stage: pop_prev and "
            "push_prev must be clear")
    refused(f"store.out push_next {LOAD_ARGS}",
            "line 1: store.out runs on the store engine, which has no next stage: pop_next and "
            "push_next must be clear")


def test_error_uop_load_with_padding():
    refused(f"load.uop {LOAD_ARGS} y_pad0=1",
            "line 1: LOAD uop takes no padding; y_pad0, y_pad1, x_pad0 and x_pad1 must be 0")


def test_error_unknown_directive():
    refused(".uops dst=0 src=0", "line 1: unknown directive '.uops'; expected one of .config, .uop, "
                                 ".uop_offset, .arena_bytes, .tensor")


def test_error_uop_directive():
    refused(".uop dst=0 src=0 idx=3", "line 1: unknown field 'idx' for .uop; allowed fields: dst, src, wgt")
    refused(".uop dst=0", "line 1: .uop is missing required field src")
    refused(".uop 0 0 0", "line 1: unexpected '0' in .uop; write dst=N src=N wgt=N")
    refused(".uop dst=256 src=0",
            "line 1: micro-op field dst = 256 is out of range: it is 8 bits for this config, so 0..255")
    refused(".uop dst=0 src=0 src=1", "line 1: duplicate field src in .uop")


def test_error_layout_directives():
    refused(".uop_offset 0\n.uop_offset 4", "line 2: duplicate .uop_offset directive (first on line 1)")
    refused(".uop_offset 6", "line 1: .uop_offset 6 is not a multiple of the 4-byte micro-op size")
    refused(".arena_bytes -4", "line 1: .arena_bytes must be non-negative, not -4")
    refused(".arena_bytes 4 8", "line 1: .arena_bytes takes exactly one number")
    refused(".arena_bytes lots", "line 1: bad number 'lots' for .arena_bytes; write a decimal or "
                                 "0x-prefixed hexadecimal integer")
    refused(".config", "line 1: .config takes a name and optionally digest=HEX")
    refused(".config tiny sha=1", "line 1: .config takes a name and optionally digest=HEX")


def test_config_digest_tells_a_modified_config_apart():
    """A config file derived from a preset keeps the preset's name; the digest the
    disassembler writes still refuses the text for the preset itself."""
    modified = AccelConfig.from_dict({**TINY.to_dict(), "inp_buffer_bytes": TINY.inp_buffer_bytes * 2})
    assert modified.name == TINY.name and modified.digest != TINY.digest
    text = disassemble(assemble(EXAMPLE, modified))
    assert assemble(text, modified).instructions == assemble(EXAMPLE, modified).instructions
    with pytest.raises(AsmError, match=f"with digest {modified.digest}, but config 'tiny' has digest {TINY.digest}"):
        assemble(text, TINY)
    # Hand-written text may leave the digest out; the name alone is then checked.
    assert assemble(".config tiny\n" + EXAMPLE, TINY).instructions == assemble(EXAMPLE, TINY).instructions


def test_error_layout_past_arena():
    refused(".arena_bytes 16\n.tensor t offset=8 shape=3x4 dtype=int8",
            "line 2: tensor t ends at byte 20, past the 16-byte arena set on line 1")
    refused(".uop dst=0 src=0\n.uop dst=0 src=0\n.arena_bytes 4",
            "line 3: the arena of 4 bytes is too small for 2 micro-ops ending at byte 8")


def test_error_tensor_directive():
    refused(".tensor offset=0 shape=1 dtype=int8",
            "line 1: .tensor takes exactly one name; write .tensor NAME offset=N shape=AxBxC dtype=D")
    refused(".tensor t offset=0 shape=2",
            "line 1: .tensor t is missing dtype; write .tensor NAME offset=N shape=AxBxC dtype=D")
    refused(".tensor t offset=0 shape=2x-1 dtype=int8",
            "line 1: bad shape '2x-1' for tensor t; write decimal sizes joined by 'x' (e.g. 1x16x16), "
            "or () for a 0-d tensor")
    refused(".tensor t offset=0 shape=2 dtype=int7",
            "line 1: unknown dtype 'int7' for tensor t; use one of int8, uint8, int16, uint16, int32, uint32, int64, float32, float64")
    refused(".tensor t offset=-1 shape=2 dtype=int8", "line 1: tensor t offset must be non-negative, not -1")
    refused(".tensor t offset=0 shape=2 dtype=int8 align=4",
            "line 1: unknown field 'align' for .tensor; allowed fields: offset, shape, dtype")
    refused(".tensor t offset=0 shape=2 dtype=int8\n\n.tensor t offset=8 shape=2 dtype=int8",
            "line 3: duplicate tensor t (first defined on line 1)")


def test_error_first_bad_line_wins():
    refused("finish\nbogus\ngemm", "line 2: unknown mnemonic 'bogus'; expected one of " + ", ".join(mnemonics(TINY)))


def test_error_is_a_value_error():
    assert issubclass(AsmError, ValueError)


def test_disassemble_refuses_invalid_instruction():
    program = Program(TINY, [Finish(), Gemm(uop_bgn=999, uop_end=1, iter_out=1, iter_in=1)])
    with pytest.raises(AsmError, match=r"^instruction 1: gemm field uop_bgn = 999 is out of range"):
        disassemble(program)


def test_disassemble_refuses_invalid_uop():
    program = Program(TINY, [], [Uop(0, 0), Uop(0, 300)], arena_bytes=8)
    with pytest.raises(AsmError, match=r"^micro-op 1: micro-op field src = 300 is out of range"):
        disassemble(program)


@pytest.mark.parametrize("name", ["two words", "a=b", "x#y"])
def test_disassemble_refuses_unwritable_tensor_name(name):
    program = Program(TINY, [], arena_bytes=4, tensors={name: TensorRegion(name, 0, (4,), "int8")})
    with pytest.raises(AsmError, match=r"cannot be written as assembly"):
        disassemble(program)


def test_program_refuses_malformed_tensor_regions():
    for region, reason in [(TensorRegion("", 0, (4,), "int8"), "non-empty string"),
                           (TensorRegion("x", -4, (4,), "int8"), "offset"),
                           (TensorRegion("x", 0, (-1, 4), "int8"), "shape"),
                           (TensorRegion("x", 0, (4,), "object"), "dtype"),
                           (TensorRegion("x", 0.5, (4,), "int8"), "offset")]:
        with pytest.raises(ProgramError, match=reason):
            Program(TINY, [], arena_bytes=64, tensors={region.name: region})
    for layout in ({"arena_bytes": float("inf")}, {"arena_bytes": 64, "uop_offset": -4}, {"arena_bytes": 1 << 40}):
        with pytest.raises(ProgramError, match="whole number of bytes"):
            Program(TINY, [], **layout)
