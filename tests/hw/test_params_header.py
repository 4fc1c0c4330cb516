"""The parameter C header (`gemforge.hw.params_header`): it holds every config field and
derived parameter, compiles beside the register map's header, and C code that reads
instruction and micro-op words with its field macros gets the values the encoder put there."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import CONFIGS, instructions, uops

from gemforge.hw import isa
from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Opcode
from gemforge.hw.params_header import config_header
from gemforge.hw.program import arena_alignment
from gemforge.hw.regmap import by_name, to_c_header

CC = shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc) on PATH")
BUFFERS = ("inp", "wgt", "acc", "out", "uop")


def macros(header: str) -> dict[str, str]:
    """``{name: replacement text}`` of the header's ``#define``s (comments dropped)."""
    found = {}
    for line in header.splitlines():
        match = re.match(r"#define (\w+)(?: (.*?))?(?:\s+/\*.*\*/)?$", line)
        if match:
            found[match[1]] = match[2] or ""
    return found


def c_int(text: str) -> int:
    return int(text.strip("()").removesuffix("ull").removesuffix("u"))


@pytest.mark.parametrize("name", ["tiny", "default", "wide"])
def test_every_field_and_derived_parameter_is_a_macro(name):
    config = CONFIGS[name]
    defined = macros(config_header(config))
    assert defined["GEMFORGE_CONFIG_NAME"] == f'"{config.name}"'
    for field, value in config.to_dict().items():
        if field == "name":
            continue
        text = defined[f"GEMFORGE_{field.upper()}"]
        assert (float(text) if isinstance(value, float) else c_int(text)) == value
    for key, value in config.derived().items():
        if key == "alu_imm_range":
            assert (c_int(defined["GEMFORGE_ALU_IMM_MIN"]), c_int(defined["GEMFORGE_ALU_IMM_MAX"])) == tuple(value)
        else:
            assert c_int(defined[f"GEMFORGE_{key.upper()}"]) == value, key
    assert c_int(defined["GEMFORGE_INSN_BYTES"]) == isa.insn_bytes(config)
    assert c_int(defined["GEMFORGE_INSN_BITS"]) == isa.insn_bits(config)
    assert c_int(defined["GEMFORGE_ARENA_ALIGNMENT"]) == arena_alignment(config)
    for opcode in Opcode:
        for field in isa.fields_of(config, opcode):
            assert f"GEMFORGE_INSN_{opcode.name}_{field.name.upper()}_SHIFT" in defined


def test_headers_share_no_macro():
    assert not set(macros(config_header(PRESETS["default"]))) & set(macros(to_c_header()))


def compile_c(tmp_path, config, source: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "gemforge_regs.h").write_text(to_c_header())
    (tmp_path / "gemforge_params.h").write_text(config_header(config))
    (tmp_path / "check.c").write_text(source)
    return subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror", *extra, "check.c"],
                          cwd=tmp_path, capture_output=True, text=True)


@needs_cc
@pytest.mark.parametrize("name", ["tiny", "default", "large", "wide"])
def test_header_compiles_with_the_values_of_python(name, tmp_path):
    config = CONFIGS[name]
    asserts = {
        "GEMFORGE_INSN_BYTES": isa.insn_bytes(config),
        "GEMFORGE_INSN_BITS": isa.insn_bits(config),
        "GEMFORGE_ARENA_ALIGNMENT": arena_alignment(config),
        "GEMFORGE_BUS_BYTES": config.bus_width // 8,
        "GEMFORGE_TOKEN_QUEUE_DEPTH": config.token_queue_depth,
        "GEMFORGE_BLOCK_IN * GEMFORGE_BLOCK_OUT * GEMFORGE_BATCH": config.macs_per_uop,
        "GEMFORGE_ALU_IMM_MIN": config.alu_imm_range[0],
        "GEMFORGE_OPCODE_ALU": int(Opcode.ALU),
        "GEMFORGE_REG_STATUS": by_name("STATUS").offset,
        **{f"GEMFORGE_{b.upper()}_ENTRY_BYTES": config.entry_bytes(b) for b in BUFFERS},
        **{f"GEMFORGE_{b.upper()}_DEPTH": config.depth(b) for b in BUFFERS},
    }
    # A field's offset, counted here from the widths in encoding order.
    store = isa.fields_of(config, Opcode.STORE)
    names = [f.name for f in store]
    asserts["GEMFORGE_INSN_STORE_BIAS_BASE_SHIFT"] = sum(f.width for f in store[:names.index("bias_base")])
    source = ['#include "gemforge_regs.h"', '#include "gemforge_params.h"',
              *(f'_Static_assert(({expr}) == ({value}), "{expr}");' for expr, value in asserts.items()),
              'static const char name[] = GEMFORGE_CONFIG_NAME;',
              'static const double clock = GEMFORGE_CLOCK_MHZ;',
              'int main(void) { return name[0] == 0 || clock <= 0; }', ""]
    result = compile_c(tmp_path, config, "\n".join(source), "-fsyntax-only")
    assert result.returncode == 0, result.stderr


def decoder_source(config) -> str:
    """A C program reading instruction (``I w0 w1 ...``) and micro-op (``U w0 ...``) words as
    32-bit hex words, low first, and printing each field the header names, by its macros."""
    lines = ['#include <stdio.h>', '#include <stdint.h>', '#include "gemforge_params.h"',
             'static unsigned long long field(const uint32_t *w, unsigned shift, unsigned width) {',
             '    unsigned long long v = 0;',
             '    for (unsigned i = 0; i < width; i++)',
             '        v |= (unsigned long long)((w[(shift + i) / 32] >> ((shift + i) % 32)) & 1u) << i;',
             '    return v;', '}',
             'int main(void) {', '    char kind; uint32_t w[GEMFORGE_INSN_BYTES / 4];',
             '    while (scanf(" %c", &kind) == 1) {',
             '        unsigned n = kind == \'I\' ? GEMFORGE_INSN_BYTES / 4 : GEMFORGE_UOP_ENTRY_BYTES / 4;',
             '        for (unsigned i = 0; i < n; i++) if (scanf("%x", &w[i]) != 1) return 1;',
             '        if (kind == \'U\') {']
    for field in isa.uop_fields(config):
        m = f"GEMFORGE_UOP_{field.name.upper()}"
        lines.append(f'            printf("{field.name}=%llu ", field(w, {m}_SHIFT, {m}_WIDTH));')
    lines += ['        } else switch (field(w, GEMFORGE_INSN_LOAD_OPCODE_SHIFT, GEMFORGE_INSN_LOAD_OPCODE_WIDTH)) {']
    for opcode in Opcode:
        lines.append(f'        case GEMFORGE_OPCODE_{opcode.name}:')
        for field in isa.fields_of(config, opcode):
            m = f"GEMFORGE_INSN_{opcode.name}_{field.name.upper()}"
            lines.append(f'            printf("{field.name}=%llu ", field(w, {m}_SHIFT, {m}_WIDTH));')
        lines.append('            break;')
    lines += ['        default: return 2;', '        }', '        printf("\\n");', '    }', '    return 0;', '}', '']
    return "\n".join(lines)


def words(value: int, nbytes: int) -> str:
    return " ".join(f"{(value >> (32 * i)) & 0xFFFF_FFFF:x}" for i in range(nbytes // 4))


def field_values(insn, config) -> str:
    """What the decoder should print for ``insn``: each field's raw bits, from the dataclass."""
    out = []
    for field in isa.fields_of(config, insn.opcode):
        if field.name == "opcode":
            value = int(insn.opcode)
        elif field.name == "use_imm":
            value = insn.imm is not None
        else:
            value = getattr(insn, field.name)
        out.append(f"{field.name}={int(value or 0) & ((1 << field.width) - 1)} ")
    return "".join(out)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    built = {}

    def build(name):
        if name not in built:
            out = tmp_path_factory.mktemp(f"decoder-{name}")
            result = compile_c(out, CONFIGS[name], decoder_source(CONFIGS[name]), "-o", "decoder")
            assert result.returncode == 0, result.stderr
            built[name] = out / "decoder"
        return built[name]
    return build


@needs_cc
@pytest.mark.parametrize("name", ["tiny", "default", "wide"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_c_reads_the_fields_the_encoder_wrote(name, decoders, data):
    config = CONFIGS[name]
    insns = data.draw(st.lists(instructions(config), min_size=1, max_size=20))
    micro = data.draw(st.lists(uops(config), min_size=1, max_size=8))
    n = isa.insn_bytes(config)
    text = [f"I {words(isa.encode(i, config), n)}" for i in insns]
    expected = [field_values(i, config) for i in insns]
    packed = isa.encode_uops(micro, config)
    for k, uop in enumerate(micro):
        word = int.from_bytes(packed[k * config.uop_entry_bytes:(k + 1) * config.uop_entry_bytes], "little")
        text.append(f"U {words(word, config.uop_entry_bytes)}")
        expected.append("".join(f"{f.name}={getattr(uop, f.name)} " for f in isa.uop_fields(config)))
    result = subprocess.run([decoders(name)], input="\n".join(text) + "\n", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected
