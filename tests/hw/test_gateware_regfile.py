"""The AXI4-Lite register file built from the register map, and the map's generated views."""

import pytest
from amaranth import Shape

from gemforge.hw.gateware.testbench import axil_read, axil_write, simulate

from gemforge.hw.gateware.regfile import RegisterFile
from gemforge.hw.isa import TOKEN_QUEUES
from gemforge.hw.regmap import REGISTERS, Register, by_name, to_c_header, to_markdown, token_field

REGS = [Register("ID", 0x0, "ro", "id"), Register("CTRL", 0x4, "wo", "ctrl"),
        Register("ADDR", 0x8, "rw", "address"), Register("COUNT", 0xC, "rw", "count")]


def test_register_file_reads_writes_and_strobes():
    dut = RegisterFile(REGS)
    strobes = []

    async def tb(ctx):
        ctx.set(dut.id, 0x1234)
        assert await axil_read(ctx, dut.bus, 0x0) == 0x1234
        await axil_write(ctx, dut.bus, 0x8, 0xDEADBEEF)
        await axil_write(ctx, dut.bus, 0xC, 7)
        assert await axil_read(ctx, dut.bus, 0x8) == 0xDEADBEEF
        assert await axil_read(ctx, dut.bus, 0xC) == 7
        assert ctx.get(dut.addr) == 0xDEADBEEF
        await axil_write(ctx, dut.bus, 0x4, 1)
        await axil_write(ctx, dut.bus, 0x0, 99)       # read-only: ignored
        assert await axil_read(ctx, dut.bus, 0x0) == 0x1234
        assert await axil_read(ctx, dut.bus, 0x4) == 0  # write-only reads as 0
        assert strobes == [1]

    async def monitor(ctx):
        async for _clk, _rst, stb, value in ctx.tick().sample(dut.ctrl_stb, dut.ctrl):
            if stb:
                strobes.append(value)

    simulate(dut, tb, processes=[monitor])


def test_register_file_rejects_non_registers():
    with pytest.raises(TypeError, match="Register"):
        RegisterFile([("ID", 0)])


def test_register_map_is_consistent_and_documented():
    offsets = [r.offset for r in REGISTERS]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(o % 4 == 0 for o in offsets)
    header, page = to_c_header(), to_markdown()
    for reg in REGISTERS:
        assert f"#define GEMFORGE_REG_{reg.name} 0x{reg.offset:04x}u" in header
        assert f"`{reg.name}`" in page
    assert by_name("CYCLES_HI").offset == by_name("CYCLES_LO").offset + 4


def test_bitfields_pack_and_unpack_by_name():
    status, cmdq = by_name("STATUS"), by_name("DEBUG_CMDQ")
    assert status.pack(DONE=1, ERROR=1) == 0b110
    assert status.unpack(0b1001) == {"BUSY": 1, "DONE": 0, "ERROR": 0, "ABORTING": 1}
    assert cmdq.unpack(cmdq.pack(LOAD=5, COMPUTE=1023, STORE=7)) == {"LOAD": 5, "COMPUTE": 1023, "STORE": 7}
    with pytest.raises(KeyError, match="STATUS has no field 'DON'; it has BUSY, DONE, ERROR, ABORTING"):
        status.pack(DON=1)
    with pytest.raises(ValueError, match="DEBUG_CMDQ.LOAD is 10 bits wide, so 1024 does not fit"):
        cmdq.pack(LOAD=1024)


def test_every_bitfield_is_in_the_layout_the_header_and_the_page():
    """The StructLayout the gateware packs with, the C header and the Markdown all come from
    the same fields; the token-count fields name every token queue of the ISA."""
    header, page = to_c_header(), to_markdown()
    token_fields = set()
    for reg in REGISTERS:
        assert reg.layout.size == 32
        for name, (lo, width) in reg.bits().items():
            assert reg.layout[name].offset == lo and Shape.cast(reg.layout[name].shape).width == width
            if width == 1:
                assert f"#define GEMFORGE_{reg.name}_{name} (1u << {lo})" in header
            else:
                assert f"#define GEMFORGE_{reg.name}_{name}_SHIFT {lo}u" in header
                assert f"#define GEMFORGE_{reg.name}_{name}_MASK 0x{((1 << width) - 1) << lo:08x}u" in header
            assert f"] {name}" in page
            if reg.name.startswith("DEBUG_TOKENS"):
                token_fields.add(name)
    assert token_fields == {token_field(q) for q in TOKEN_QUEUES}


def test_fields_wider_than_a_register_are_refused():
    from gemforge.hw.regmap import Bitfield
    reg = Register("WIDE", 0x100, "ro", "too many fields", fields=tuple(Bitfield(f"F{i}", 10) for i in range(4)))
    with pytest.raises(ValueError, match="WIDE's fields take 40 bits, more than a register's 32"):
        reg.layout
