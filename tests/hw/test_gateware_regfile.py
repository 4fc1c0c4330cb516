"""The AXI4-Lite register file built from the register map, and the map's generated views."""

import pytest

from gemforge.hw.gateware.testbench import axil_read, axil_write, simulate

from gemforge.hw.gateware.regfile import RegisterFile
from gemforge.hw.regmap import REGISTERS, Register, by_name, to_c_header, to_markdown

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


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
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
