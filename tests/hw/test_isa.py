"""ISA: encode/decode round trips, the packing order, and every refusal."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gemforge.hw import isa
from gemforge.hw.isa import (
    Alu, AluOp, EncodingError, Finish, Gemm, IsaError, Load, MemType, Opcode, Store, Uop, insn_bits, insn_bytes,
)
from gemforge.hw.isa_doc import isa_reference
from strategies import CONFIGS, ENGINE_FLAGS, instructions, uops

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PARAMS = pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))


def pack(values: dict[str, int], fields: list[isa.Field]) -> int:
    """Reference packer: fields from bit 0 upward, two's complement for signed ones."""
    word, pos = 0, 0
    for f in fields:
        value = values[f.name]
        assert f.lo <= value <= f.hi
        word |= (value % (1 << f.width)) << pos
        pos += f.width
    return word


def field_values(insn: isa.Instruction) -> dict[str, int]:
    """An instruction's field values as the encoding tables name them."""
    values = {"opcode": int(insn.opcode)}
    for f in dataclasses.fields(insn):
        value = getattr(insn, f.name)
        if f.name == "imm":
            values["use_imm"] = int(value is not None)
            values["imm"] = 0 if value is None else value
        else:
            values[f.name] = int(value)
    return values


def sample_load(**changes) -> Load:
    base = dict(mem=MemType.INP, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1)
    return Load(**{**base, **changes})


def sample_store(**changes) -> Store:
    return Store(**{**dict(mem=MemType.OUT, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1),
                    **changes})


def sample_gemm(**changes) -> Gemm:
    return Gemm(**{**dict(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), **changes})


def sample_alu(**changes) -> Alu:
    return Alu(**{**dict(op=AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), **changes})


# ---------------------------------------------------------------------------- round trips

@PARAMS
@FAST
@given(data=st.data())
def test_encode_decode_round_trip(config, data):
    insn = data.draw(instructions(config))
    word = isa.encode(insn, config)
    assert 0 <= word < 1 << insn_bits(config)
    assert isa.decode(word, config) == insn
    assert isa.encode(isa.decode(word, config), config) == word


@PARAMS
@FAST
@given(data=st.data())
def test_encoding_matches_reference_packing(config, data):
    insn = data.draw(instructions(config))
    assert isa.encode(insn, config) == pack(field_values(insn), isa.fields_of(config, insn.opcode))


@PARAMS
@FAST
@given(data=st.data())
def test_any_decodable_word_re_encodes_identically(config, data):
    """Words built from arbitrary raw field bits: decode either refuses them
    with EncodingError or returns an instruction that encodes back to the word."""
    opcode = data.draw(st.sampled_from(Opcode))
    fields = isa.fields_of(config, opcode)
    raw = {f.name: data.draw(st.integers(0, (1 << f.width) - 1)) for f in fields}
    raw["opcode"] = int(opcode)
    word = pack({f.name: raw[f.name] if not f.signed or raw[f.name] <= f.hi else raw[f.name] - (1 << f.width)
                 for f in fields}, fields)
    try:
        insn = isa.decode(word, config)
    except EncodingError:
        return
    assert isa.encode(insn, config) == word


@PARAMS
@FAST
@given(data=st.data())
def test_program_round_trip(config, data):
    insns = data.draw(st.lists(instructions(config), max_size=8))
    blob = isa.encode_program(insns, config)
    assert len(blob) == len(insns) * insn_bytes(config)
    assert isa.decode_program(blob, config) == insns


@PARAMS
@FAST
@given(data=st.data())
def test_uop_round_trip(config, data):
    items = data.draw(st.lists(uops(config), max_size=8))
    blob = isa.encode_uops(items, config)
    assert len(blob) == len(items) * config.uop_bits // 8
    assert isa.decode_uops(blob, config) == items
    for uop, offset in zip(items, range(0, len(blob), config.uop_bits // 8)):
        word = int.from_bytes(blob[offset:offset + config.uop_bits // 8], "little")
        assert word == pack(dataclasses.asdict(uop), isa.uop_fields(config))


@PARAMS
def test_every_kind_fits_the_instruction_word(config):
    assert isa.required_insn_bits(config) <= insn_bits(config)
    assert insn_bits(config) == (128 if isa.required_insn_bits(config) <= 128 else 256)


def test_wide_config_needs_256_bits():
    assert insn_bits(CONFIGS["wide"]) == 256 and CONFIGS["wide"].uop_bits == 64


def test_encoding_is_little_endian_with_opcode_in_low_bits():
    config = CONFIGS["tiny"]
    blob = isa.encode_program([Finish(), sample_gemm()], config)
    assert blob[0] == Opcode.FINISH and blob[insn_bytes(config)] & 0b111 == Opcode.GEMM


# ---------------------------------------------------------------------------- range refusals

def _int_field_names(insn) -> list[str]:
    skip = {"mem", "op", "reset", "overwrite", "requant", "relu", "bias", "bias_per_row", *isa.DEP_FLAGS}
    return [f.name for f in dataclasses.fields(insn) if f.name not in skip]


@PARAMS
@FAST
@given(data=st.data())
def test_out_of_range_values_refused_with_field_and_range(config, data):
    insn = data.draw(instructions(config).filter(lambda i: not isinstance(i, Finish)))
    names = _int_field_names(insn)
    if isinstance(insn, Load) and insn.mem == MemType.UOP:
        names = [n for n in names if "pad" not in n]  # refused earlier, for any non-zero value
    if isinstance(insn, Store) and not insn.requant:
        names = [n for n in names if n != "shift"]  # likewise
    if isinstance(insn, Store) and not insn.bias:
        names = [n for n in names if n != "bias_base"]  # likewise
    name = data.draw(st.sampled_from(names))
    (field,) = [f for f in isa.fields_of(config, insn.opcode) if f.name == name]
    bad = data.draw(st.sampled_from([field.hi + 1, field.lo - 1, field.hi + 1000, -(1 << 40)]))
    with pytest.raises(IsaError) as info:
        isa.encode(dataclasses.replace(insn, **{name: bad}), config)
    message = str(info.value)
    assert f"field {name} = {bad} is out of range" in message
    assert f"{field.width} bits" in message and f"{field.lo}..{field.hi}" in message


@PARAMS
def test_field_too_large_refused(config):
    hi = (1 << config.sram_addr_bits) - 1
    isa.encode(sample_load(sram_base=hi), config)
    with pytest.raises(IsaError, match=rf"load.inp field sram_base = {hi + 1} is out of range: it is "
                                       rf"{config.sram_addr_bits} bits for this config, so 0\.\.{hi}$"):
        isa.encode(sample_load(sram_base=hi + 1), config)


def test_negative_value_refused():
    with pytest.raises(IsaError, match=r"gemm field iter_in = -1 is out of range: .* so 0\.\.16383$"):
        isa.encode(sample_gemm(iter_in=-1), CONFIGS["tiny"])


def test_imm_signed_range():
    config = CONFIGS["tiny"]
    for ok in (-(1 << 15), -1, 0, (1 << 15) - 1):
        assert isa.decode(isa.encode(sample_alu(imm=ok), config), config).imm == ok
    for bad in ((1 << 15), -(1 << 15) - 1):
        with pytest.raises(IsaError, match=rf"alu.add field imm = {bad} is out of range: it is 16 bits "
                                           r"signed for this config, so -32768\.\.32767"):
            isa.encode(sample_alu(imm=bad), config)


def test_non_integer_field_refused():
    with pytest.raises(IsaError, match=r"load.inp field x_size must be an integer, not 1\.5"):
        isa.encode(sample_load(x_size=1.5), CONFIGS["tiny"])


def test_uop_out_of_range_refused():
    config = CONFIGS["tiny"]
    with pytest.raises(IsaError, match=r"micro-op field dst = 256 is out of range: it is 8 bits .* 0\.\.255"):
        isa.encode_uops([Uop(dst=256, src=0)], config)
    with pytest.raises(IsaError, match=r"micro-op field wgt = -1 is out of range"):
        isa.encode_uops([Uop(dst=0, src=0, wgt=-1)], config)


# ---------------------------------------------------------------------------- kind and flag refusals

@pytest.mark.parametrize("flag", ["pop_prev", "push_prev"])
@pytest.mark.parametrize("mem", [MemType.INP, MemType.WGT])
def test_load_engine_has_no_previous_stage(flag, mem):
    with pytest.raises(IsaError, match=rf"load.{mem.name.lower()} runs on the load engine, which has no "
                                       r"previous stage: pop_prev and push_prev must be clear"):
        isa.encode(sample_load(mem=mem, **{flag: True}), CONFIGS["tiny"])


@pytest.mark.parametrize("flag", ["pop_next", "push_next"])
@pytest.mark.parametrize("mem", [MemType.OUT, MemType.ACC])
def test_store_engine_has_no_next_stage(flag, mem):
    with pytest.raises(IsaError, match=rf"store.{mem.name.lower()} runs on the store engine, which has no "
                                       r"next stage: pop_next and push_next must be clear"):
        isa.encode(sample_store(mem=mem, **{flag: True}), CONFIGS["tiny"])


@pytest.mark.parametrize("insn", [sample_load(mem=MemType.ACC), sample_load(mem=MemType.UOP),
                                  sample_gemm(), sample_alu(), Finish()], ids=isa.mnemonic)
def test_compute_engine_takes_every_flag(insn):
    assert isa.engine_of(insn) == isa.Engine.COMPUTE
    assert set(ENGINE_FLAGS[isa.Engine.COMPUTE]) == set(isa.DEP_FLAGS)
    flagged = dataclasses.replace(insn, **{f: True for f in isa.DEP_FLAGS})
    config = CONFIGS["tiny"]
    assert isa.decode(isa.encode(flagged, config), config) == flagged


def test_load_to_out_refused():
    with pytest.raises(IsaError, match=r"LOAD cannot target the out buffer; allowed: inp, wgt, acc, uop"):
        isa.encode(sample_load(mem=MemType.OUT), CONFIGS["tiny"])


@pytest.mark.parametrize("mem", [MemType.INP, MemType.WGT, MemType.UOP])
def test_store_from_non_output_buffer_refused(mem):
    with pytest.raises(IsaError, match=rf"STORE reads the out or acc buffer, not {mem.name.lower()}"):
        isa.encode(sample_store(mem=mem), CONFIGS["tiny"])


@pytest.mark.parametrize("pad", ["y_pad0", "y_pad1", "x_pad0", "x_pad1"])
def test_uop_load_with_padding_refused(pad):
    with pytest.raises(IsaError, match=r"LOAD uop takes no padding"):
        isa.encode(sample_load(mem=MemType.UOP, **{pad: 1}), CONFIGS["tiny"])


def test_mem_must_be_memtype():
    with pytest.raises(IsaError, match=r"LOAD mem must be a MemType, not 0"):
        isa.encode(sample_load(mem=0), CONFIGS["tiny"])


def test_alu_op_must_be_aluop():
    with pytest.raises(IsaError, match=r"ALU op must be an AluOp, not 'add'"):
        isa.encode(sample_alu(op="add"), CONFIGS["tiny"])


def test_not_an_instruction_refused():
    with pytest.raises(IsaError, match=r"not an instruction: Uop"):
        isa.encode(Uop(0, 0), CONFIGS["tiny"])


# ---------------------------------------------------------------------------- decode refusals

@pytest.mark.parametrize("opcode", [5, 6, 7])
def test_decode_unknown_opcode_refused(opcode):
    with pytest.raises(EncodingError, match=rf"unknown opcode {opcode}; valid opcodes are 0 \(LOAD\), "
                                            r"1 \(STORE\), 2 \(GEMM\), 3 \(ALU\), 4 \(FINISH\)"):
        isa.decode(opcode, CONFIGS["tiny"])


@PARAMS
@FAST
@given(data=st.data())
def test_decode_non_zero_unused_bits_refused(config, data):
    insn = data.draw(instructions(config))
    used = sum(f.width for f in isa.fields_of(config, insn.opcode))
    assume(used < insn_bits(config))  # `large` LOAD fills all 128 bits
    bit = data.draw(st.integers(used, insn_bits(config) - 1))
    with pytest.raises(EncodingError, match=rf"{insn.opcode.name} word has non-zero bits above bit {used - 1}"):
        isa.decode(isa.encode(insn, config) | 1 << bit, config)


@pytest.mark.parametrize("word", [-1, 1 << 128])
def test_decode_word_too_wide_refused(word):
    with pytest.raises(EncodingError, match=r"instruction word does not fit 128 bits"):
        isa.decode(word, CONFIGS["tiny"])


def test_decode_imm_without_use_imm_refused():
    config = CONFIGS["tiny"]
    fields = isa.fields_of(config, Opcode.ALU)
    values = field_values(sample_alu(imm=5)) | {"use_imm": 0}
    with pytest.raises(EncodingError, match=r"ALU word has a non-zero imm field but use_imm is clear"):
        isa.decode(pack(values, fields), config)


def test_decode_bad_mem_refused():
    config = CONFIGS["tiny"]
    values = field_values(sample_load()) | {"mem": 7}
    with pytest.raises(EncodingError, match=r"LOAD word has an invalid field: 7 is not a valid MemType"):
        isa.decode(pack(values, isa.fields_of(config, Opcode.LOAD)), config)


def test_decode_invalid_instruction_refused():
    config = CONFIGS["tiny"]
    values = field_values(sample_load()) | {"pop_prev": 1}
    with pytest.raises(EncodingError, match=r"word decodes to an invalid instruction: load.inp runs on "
                                            r"the load engine"):
        isa.decode(pack(values, isa.fields_of(config, Opcode.LOAD)), config)


def test_decode_program_partial_word_refused():
    with pytest.raises(EncodingError, match=r"instruction stream of 17 bytes is not a whole number of 16-byte"):
        isa.decode_program(bytes(17), CONFIGS["tiny"])


def test_decode_uops_refusals():
    config = CONFIGS["tiny"]  # 24 of 32 bits used
    with pytest.raises(EncodingError, match=r"micro-op data of 5 bytes is not a whole number of 4-byte words"):
        isa.decode_uops(bytes(5), config)
    with pytest.raises(EncodingError, match=r"micro-op 1 has non-zero bits above bit 23"):
        isa.decode_uops(bytes(4) + (1 << 24).to_bytes(4, "little"), config)


# ---------------------------------------------------------------------------- names

def test_mnemonics():
    assert [isa.mnemonic(i) for i in (sample_load(mem=MemType.WGT), sample_store(mem=MemType.ACC),
                                      sample_gemm(), sample_alu(op=AluOp.SHR), Finish())] == \
        ["load.wgt", "store.acc", "gemm", "alu.shr", "finish"]


# ---------------------------------------------------------------------------- the generated reference

def _section(page: str, heading: str) -> str:
    return page.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def _rows(fields: list[isa.Field]) -> list[str]:
    rows, pos = [], 0
    for f in fields:
        bits = f"[{pos}]" if f.width == 1 else f"[{pos + f.width - 1}:{pos}]"     # [msb:lsb]
        rows.append(f"| {bits} | {f.width} | `{f.name}` | "
                    f"{'signed' if f.signed else 'unsigned'} | {f.lo}..{f.hi} | {f.doc} |")
        pos += f.width
    return rows


@PARAMS
def test_reference_documents_every_field_at_its_bits(config):
    page = isa_reference(config)
    for opcode in Opcode:
        section = _section(page, f"## {opcode.name} (opcode {opcode.value})")
        for row in _rows(isa.fields_of(config, opcode)):
            assert row in section
        first_line = isa.INSTRUCTION_TYPES[opcode].__doc__.strip().splitlines()[0].replace("``", "`")
        assert first_line in section
    micro = _section(page, "## Micro-op")
    assert all(row in micro for row in _rows(isa.uop_fields(config)))
    assert f"{config.uop_bits} bits" in micro


@PARAMS
def test_reference_lists_enumerations_and_parameters(config):
    page = isa_reference(config)
    for enum_cls in (Opcode, MemType, isa.AluOp):
        for member in enum_cls:
            assert f"| {member.value} | `{member.name}` | `{member.name.lower()}` |" in page
    assert "| 4 | `MUL` | `mul` | wrap-around multiplication" in page  # from the `#:` comment
    for key, value in {**config.to_dict(), **isa.derived(config)}.items():
        assert f"| `{key}` | {value} |" in page
    assert f"one **{insn_bits(config)}-bit** word" in page


def test_reference_describes_the_token_protocol():
    page = isa_reference("tiny")
    tokens = _section(page, "## Dependency tokens")
    for queue in ("load → compute", "compute → load", "compute → store", "store → compute"):
        assert f"| {queue} |" in tokens
    assert f"up to {CONFIGS['tiny'].token_queue_depth} tokens" in tokens
    assert "### End of program" in tokens and "FINISH" in tokens
    assert "no previous stage" in tokens and "full queue" in tokens


def test_reference_follows_the_config():
    assert isa_reference("tiny") != isa_reference(CONFIGS["wide"])
    assert "| [25:10] | 16 | `sram_base` |" in isa_reference(CONFIGS["wide"])
