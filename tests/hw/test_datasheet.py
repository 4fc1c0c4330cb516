"""The integration datasheet: generated for several configs, every fact checked against
an independent source (the Verilog's port list, the register map, the ISA tables, the
assembler's parser, fsim's buffer shapes, Verilator itself)."""

import functools
import inspect
import json
import re
import shutil
import subprocess
import types

import numpy as np
import pytest

from gemforge.hw import asm, isa, regmap
from gemforge.hw.config import PRESETS, AccelConfig, load_config
from gemforge.hw.flow.datasheet import datasheet, register_reset, verilator_flags
from gemforge.hw.microarch import max_burst_beats
from gemforge.hw.gateware.top import READ_CLIENTS
from gemforge.hw.flow import generate as generate_module
from gemforge.hw.flow.generate import generate
from gemforge.hw.flow.verilog import LINT_WAIVERS, TOP_NAME, verilog_top
from gemforge.hw.isa import insn_bits
from gemforge.hw.program import FORMAT_VERSION, MAGIC, arena_alignment
from gemforge.sim.cosim import harness
from gemforge.sim.fsim import Fsim

#: Unlike any preset: batch > 1, 16-bit inputs and accumulators, a 512-bit bus (8-beat bursts).
ODD = AccelConfig(name="odd", batch=2, block_in=8, block_out=4, inp_width=16, wgt_width=8, acc_width=16,
                  out_width=8, inp_buffer_bytes=2048, wgt_buffer_bytes=4096, acc_buffer_bytes=2048,
                  out_buffer_bytes=1024, uop_buffer_bytes=512, bus_width=512, cmd_queue_depth=16,
                  token_queue_depth=8)
CONFIGS = {"tiny": PRESETS["tiny"], "default": PRESETS["default"], "odd": ODD}


@functools.lru_cache(maxsize=None)
def verilog(name: str) -> str:
    return verilog_top(CONFIGS[name])


@pytest.fixture(scope="module", params=list(CONFIGS))
def sheet(request):
    config = CONFIGS[request.param]
    return config, datasheet(config)


def section(text: str, title: str) -> str:
    """The body of the ``## title`` section."""
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no section {title!r}"
    return match.group(1)


def table_rows(body: str) -> list[list[str]]:
    """Cells of every table row of ``body`` (header and separator rows dropped)."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")]
            for line in body.splitlines() if line.startswith("| ")]
    return rows[1:] if rows else rows


def verilog_ports(text: str) -> set[tuple[str, str, int]]:
    """(name, direction, width) of the top module's ports, parsed from the Verilog."""
    module = text[text.index(f"module {TOP_NAME}("):]
    module = module[:module.index("endmodule")]
    header = module[:module.index(");")]
    names = {n.strip() for n in header[header.index("(") + 1:].split(",")}
    ports = set()
    for direction, msb, name in re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", module, re.MULTILINE):
        if name in names:
            ports.add((name, direction, int(msb) + 1 if msb else 1))
    assert {p[0] for p in ports} == names, names - {p[0] for p in ports}
    return ports


@pytest.mark.parametrize("name", ["tiny", "odd"])
def test_port_table_is_the_verilog_port_list(name):
    config = CONFIGS[name]
    expected = verilog_ports(verilog(name))
    rows = table_rows(section(datasheet(config), "Ports"))
    got = {(r[0].strip("`"), r[1], int(r[2])) for r in rows}
    assert got == expected
    assert {"clk", "rst", "irq", "m_axi__araddr", "s_axil__wdata"} <= {p[0] for p in got}


def test_clock_and_reset_match_the_verilog():
    text = verilog("tiny")
    body = section(datasheet("tiny"), "Clock and reset")
    assert "**synchronous**" in body and "active high" in body
    # A synchronous active-high reset: no always block is sensitive to rst.
    assert "posedge clk" in text and "posedge rst" not in text and "negedge rst" not in text
    assert "`clk`" in body and "`rst`" in body


def test_bus_widths(sheet):
    config, text = sheet
    body = section(text, "Bus widths")
    assert f"{config.bus_width} bits ({config.bus_bytes} bytes" in body
    assert f"{insn_bits(config)} bits" in body and f"{config.uop_bits} bits" in body


def test_every_register_with_offset_access_and_reset(sheet):
    _, text = sheet
    body = section(text, "Registers") + section(text, "Counters")
    lines = body.splitlines()
    for reg in regmap.REGISTERS:
        row = [line for line in lines if f"`{reg.name}`" in line and f"`{reg.offset:#06x}`" in line]
        assert row, f"register {reg.name} at {reg.offset:#06x} missing"
        if not reg.counter:
            cells = row[0].strip("|").split(" | ")
            assert cells[2].strip() == reg.access
            assert cells[3].strip() == (f"`{regmap.ID_MAGIC:#010x}`" if reg.name == "ID" else "`0`")


def test_register_reset_prefers_the_map():
    assert register_reset(regmap.by_name("ID")) == regmap.ID_MAGIC
    assert register_reset(regmap.by_name("INSN_COUNT")) == 0
    assert register_reset(types.SimpleNamespace(name="X", reset=0x1234)) == 0x1234


def test_every_counter(sheet):
    _, text = sheet
    rows = table_rows(section(text, "Counters"))
    assert [r[0].strip("`") for r in rows] == [name for name, _ in regmap.COUNTERS]
    assert "FINISH" in section(text, "Counters") and "includes" in section(text, "Counters")


def test_every_fault_code(sheet):
    _, text = sheet
    for fault in getattr(regmap, "FAULT_DOCS", {}):
        assert f"| {int(fault)} | `{fault.name}` |" in text


def test_every_opcode_and_field(sheet):
    config, text = sheet
    for enum_cls in (isa.Opcode, isa.MemType, isa.AluOp):
        for member in enum_cls:
            assert f"`{member.name}`" in text
    for opcode in isa.Opcode:
        assert f"## {opcode.name} (opcode {opcode.value})" in text
        for field in isa.fields_of(config, opcode):
            assert f"`{field.name}`" in text
    for field in isa.uop_fields(config):
        assert f"`{field.name}`" in section(text, "Buffer entries")


def test_every_assembler_directive_and_mnemonic(sheet):
    config, text = sheet
    body = section(text, "Assembler syntax")
    directives = set(re.findall(r'"(\.[a-z_]+)"', inspect.getsource(asm._parse)))
    assert directives >= {".uop", ".tensor", ".config"}
    for directive in directives:
        assert f"`{directive} " in body or f"`{directive}`" in body, directive
    mnemonics = [r[0].strip("`") for r in table_rows(body)]
    assert mnemonics == asm.mnemonics(config)
    for flag in isa.DEP_FLAGS:
        assert f"`{flag}`" in body


def test_entry_layouts_match_the_config_and_fsim(sheet):
    config, text = sheet
    rows = {r[0].strip("`"): r for r in table_rows(section(text, "Buffer entries"))}
    assert set(rows) == {"inp", "wgt", "acc", "out", "uop"}
    sim = Fsim(config, np.zeros(config.bus_bytes, np.uint8))
    for buffer, row in rows.items():
        assert int(row[3]) == config.entry_bytes(buffer)
        assert int(row[4]) == config.depth(buffer)
        if buffer == "uop":
            continue
        nrows, ncols = (int(d) for d in row[1].split(" × "))
        bits = int(row[2].removeprefix("int"))
        assert nrows * ncols * bits // 8 == config.entry_bytes(buffer)
        assert (nrows, ncols) == getattr(sim, buffer).shape[1:]


def test_dram_master(sheet):
    config, text = sheet
    body = section(text, "DRAM master behaviour")
    beats = max_burst_beats(config.bus_bytes)
    assert 4096 % (beats * config.bus_bytes) == 0
    assert f"at most **{beats} beats** ({beats * config.bus_bytes} bytes)" in body
    assert f"AxSIZE = {config.bus_bytes.bit_length() - 1}" in body
    ids = {r[1].strip("`"): int(r[0]) for r in table_rows(body)}
    assert ids == {name: i for i, name in enumerate(READ_CLIENTS)}


def test_program_format_and_relocation(sheet):
    config, text = sheet
    body = section(text, "Program file format")
    assert f"`{MAGIC.decode()}`" in body and f"version {FORMAT_VERSION}" in body
    program = asm.assemble(".tensor x offset=0 shape=2 dtype=int8\nfinish\n", config, runnable=True)
    program.constants["x"] = np.zeros(2, np.int8)
    blob = program.to_bytes()
    hlen = int.from_bytes(blob[12:16], "little")
    fields = {r[0].strip("`") for r in table_rows(body)}
    assert fields == set(json.loads(blob[16:16 + hlen]))
    reloc = section(text, "Loading and relocating a program")
    assert f"**{arena_alignment(config)} bytes**" in reloc
    units = {r[0]: int(r[1].split()[0]) for r in table_rows(reloc)}
    for row, unit in units.items():
        mnemonic = row.split()[0].strip("`")
        # A requantizing STORE moves output entries in DRAM (what the loader, `relocated`, counts).
        buffer = "out" if row.endswith("with `requant`") else mnemonic.split(".")[1]
        assert unit == config.entry_bytes(buffer)
    assert {"`load.inp`", "`load.wgt`", "`store.out`", "`store.acc` with `requant`"} <= set(units)


def _commands(text: str) -> list[list[str]]:
    body = section(text, "Verilator flags")
    block = body[body.index("```") + 3:]
    return [line.split() for line in block[:block.index("```")].strip().splitlines()]


def test_verilator_flags_are_the_lint_waivers(sheet):
    _, text = sheet
    for cmd in _commands(text):
        assert [a for a in cmd if a.startswith("-Wno-")] == verilator_flags() == [f"-Wno-{w}" for w in LINT_WAIVERS]


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
def test_verilator_commands_work(tmp_path):
    """The datasheet's commands, run verbatim on the generated Verilog: clean lint, and a build."""
    (tmp_path / f"{TOP_NAME}.v").write_text(verilog("tiny"))
    for cmd in _commands(datasheet("tiny")):
        result = subprocess.run([shutil.which("verilator"), *cmd[1:]], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0 and "%Warning" not in result.stderr, result.stderr[-3000:]
    # Queues of depth 2 (a one-entry FIFO inside Amaranth's buffered one) lint clean too.
    shallow = PRESETS["tiny"].replace(name="shallow", cmd_queue_depth=2, token_queue_depth=2)
    (tmp_path / f"{TOP_NAME}.v").write_text(verilog_top(shallow))
    lint = _commands(datasheet(shallow))[0]
    result = subprocess.run([shutil.which("verilator"), *lint[1:]], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0 and "%Warning" not in result.stderr, result.stderr[-3000:]


def test_cosim_build_satisfies_the_datasheet(tmp_path, monkeypatch):
    """The co-simulation compiles the same Verilog with flags that keep every waived warning
    non-fatal (captured from `harness.build` with a recording runner)."""
    seen = {}

    class Recorder:
        def build(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setenv("GEMFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(harness, "simulator_available", lambda simulator: True)
    monkeypatch.setattr(harness, "_runner", lambda simulator: Recorder())
    monkeypatch.setattr(generate_module, "verilog_top", lambda config: verilog(config.name))
    harness.build(PRESETS["tiny"], "verilator", dram_bytes=1 << 16)
    args = seen["build_args"]
    assert "-Wno-fatal" in args or set(verilator_flags()) <= set(args), args
    assert any(str(src).endswith(f"{TOP_NAME}.v") for src in seen["sources"])


def test_generate_writes_the_datasheet(tmp_path, monkeypatch):
    monkeypatch.setattr(generate_module, "verilog_top", lambda config: verilog(config.name))
    written = generate(PRESETS["tiny"], tmp_path)
    assert tmp_path / "datasheet.md" in written and tmp_path / f"{TOP_NAME}.v" in written
    assert (tmp_path / "datasheet.md").read_text() == datasheet("tiny")


@pytest.mark.parametrize("name, device", [("tiny", "fsim"), ("default", "fsim"), ("odd", "fsim"),
                                          ("tiny", "verilator")])
def test_the_assembler_example_runs(name, device):
    """The datasheet's example, copied out of the text, assembles for its config (and only
    for it), and computes y = (x · wᵀ) >> 3 on fsim and on the RTL."""
    from gemforge.driver.runtime.device import open_device
    if device != "fsim" and not harness.simulator_available(device):
        pytest.skip(f"{device} is not installed")
    config = CONFIGS[name]
    text = re.search(r"## Assembler syntax.*?```\n(.*?)```", datasheet(config), re.S).group(1)
    assert f".config {name} digest={config.digest}\n" in text and "load.uop " in text
    program = asm.assemble(text, config, runnable=True)
    other = PRESETS["large"]
    with pytest.raises(asm.AsmError, match=f".config {name}"):
        asm.assemble(text, other)
    rng = np.random.default_rng(len(name))
    x, w = (rng.integers(-3, 4, program.tensors[t].shape).astype(program.tensors[t].dtype) for t in ("x", "w"))
    dev = open_device(device, config, **({} if device == "fsim" else {"dram_bytes": 1 << 22}))
    try:
        out, _ = dev.run_program(program, {"x": x, "w": w}, ["y"])
    finally:
        dev.close()
    np.testing.assert_array_equal(out["y"], (x.astype(np.int64) @ w.astype(np.int64).T) >> 3)


def test_assembler_table_lists_only_the_flags_each_mnemonic_takes():
    text = datasheet("tiny")
    rows = {m.group(1): set(re.findall(r"`(\w+)`", m.group(2)))
            for m in re.finditer(r"^\| `([\w.]+)` \| \w+ \| ([^|]*) \|", text, re.M)}
    assert rows["store.out"] == {"pop_prev", "push_prev"}
    assert rows["load.inp"] == {"pop_next", "push_next"}
    assert {"requant", "relu", "bias", "bias_per_row"} <= rows["store.acc"]
    for mnemonic, flags in rows.items():
        for flag in flags:
            asm.assemble_instructions(f"{mnemonic} {flag} " + " ".join(
                f"{f}=1" for f in asm._operand_order(asm._KINDS[mnemonic], PRESETS['tiny'])
                if f not in asm._KINDS[mnemonic].defaults) + (" requant" if flag in ("relu", "bias") else "")
                + (" requant bias" if flag == "bias_per_row" else ""), "tiny")


def test_the_assembler_docstring_shows_the_default_example():
    from gemforge.hw.flow.datasheet import example_source
    doc = inspect.cleandoc(asm.__doc__).split("::", 1)[1].split("\n\n")[1]
    code = [line.strip() for line in doc.splitlines() if not line.strip().startswith(";")]
    assert code == [line for line in example_source(PRESETS["default"]).splitlines() if not line.startswith(";")]


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="iverilog is not installed")
@pytest.mark.parametrize("standard", ["-g2005", "-g2012"])
def test_outputs_are_defined_after_reset_under_either_standard(tmp_path, standard):
    """As the datasheet says: under Icarus as Verilog-2005 or SystemVerilog, every output is
    0 or 1 after a reset of a few cycles, and an AXI-Lite read of ID answers the magic."""
    ports = top_ports_of("tiny")
    (tmp_path / f"{TOP_NAME}.v").write_text(verilog("tiny"))
    decls = "\n".join(f"  {'reg' if d == 'input' else 'wire'} [{w - 1}:0] {n};" for n, d, w, _ in ports)
    inputs = [n for n, d, _, _ in ports if d == "input" and n not in ("clk", "rst")]
    outputs = [n for n, d, _, _ in ports if d == "output"]
    ident = regmap.by_name("ID")
    checks = " ".join(f'if ((^{n}) === 1\'bx) $display("X on {n}");' for n in outputs)
    bench = f"""module bench;
{decls}
  {TOP_NAME} dut({", ".join(f".{n}({n})" for n, _, _, _ in ports)});
  always #5 clk = ~clk;
  initial begin
    clk = 0; rst = 1;
    {" ".join(f"{n} = 0;" for n in inputs)}
    repeat (3) @(posedge clk);
    #1 rst = 0;
    @(posedge clk); #1;
    {checks}
    s_axil__araddr = {ident.offset}; s_axil__arvalid = 1; s_axil__rready = 1;
    repeat (4) begin @(posedge clk); #1; if (s_axil__rvalid) $display("ID %h", s_axil__rdata); end
    $finish;
  end
endmodule
"""
    (tmp_path / "bench.v").write_text(bench)
    subprocess.run(["iverilog", standard, "-o", "sim", "bench.v", f"{TOP_NAME}.v"], cwd=tmp_path, check=True,
                   capture_output=True)
    run = subprocess.run(["vvp", "-n", "sim"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "X on" not in run.stdout, run.stdout
    assert f"ID {regmap.ID_MAGIC:08x}" in run.stdout, run.stdout


def top_ports_of(name: str):
    from gemforge.hw.flow.datasheet import top_ports
    return top_ports(CONFIGS[name])


def test_tensor_layouts_section_matches_compiled_programs(sheet):
    """The datasheet's device layouts are those of the tensors the compiler writes."""
    from gemforge.compiler import compile_dense
    config, text = sheet
    body = section(text, "Tensor layouts of compiled programs")
    rows = {r[0]: r[2] for r in table_rows(body)}
    assert rows["matrix A"] == "`(M/B, K/BI, B, BI)`" and rows["result"] == "`(M/B, N/BO, B, BO)`"
    m, k, n = 3 * config.batch, 2 * config.block_in, 5 * config.block_out
    program = compile_dense(config, m, k, n).program
    b, bi, bo = config.batch, config.block_in, config.block_out
    assert program.tensors["a"].shape == (m // b, k // bi, b, bi)
    assert program.tensors["w"].shape == (n // bo, k // bi, bo, bi)
    assert program.tensors["out"].shape == (m // b, n // bo, b, bo)


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_configuration_table_gives_each_field_its_value_and_allowed_range(name):
    from gemforge.hw.config import field_rules
    config = load_config(name)
    sheet = datasheet(config)
    values = config.to_dict()
    for field, allowed in field_rules():
        value = f"`{values[field]}`" if field in values else "—"
        label = f"`{field}`" if field in values else field
        assert f"| {label} | {value} | {allowed} |" in sheet
