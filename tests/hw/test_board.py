"""The board top's blocks in Amaranth's simulator: UART, bridge protocol, AXI memory.

The whole board top runs in co-simulation in tests/sim/test_board_cosim.py.
"""

from __future__ import annotations

import re

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring

from gemforge.hw.board import bridge as bridge_module
from gemforge.hw.board.bridge import Bridge
from gemforge.hw.board.memory import RESP_SLVERR, AxiMemory, BytePortSignature
from gemforge.hw.board.protocol import BRIDGE_MAGIC, Opcode, Status, header
from gemforge.hw.board.top import BoardTop
from gemforge.hw.board.uart import UartRx, UartTx
from gemforge.hw.config import PRESETS
from gemforge.hw.gateware.regfile import RegisterFile
from gemforge.hw.gateware.testbench import simulate, stream_get, stream_put
from gemforge.hw.regmap import REGISTERS, by_name


# ---------------------------------------------------------------------------- UART

class _Loopback(Elaboratable):
    def __init__(self, cpb):
        self.tx, self.rx = UartTx(cpb), UartRx(cpb)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx, m.submodules.rx = self.tx, self.rx
        m.d.comb += self.rx.rx.eq(self.tx.tx)
        return m


@pytest.mark.parametrize("cpb", [4, 7])
def test_uart_loopback(cpb):
    dut = _Loopback(cpb)
    sent = [0x00, 0xFF, 0x55, 0xA3, 0x01, 0x80]
    got = []

    async def send(ctx):
        for byte in sent:
            await stream_put(ctx, dut.tx.sink, byte)

    async def receive(ctx):
        for _ in sent:
            got.append(await stream_get(ctx, dut.rx.source))

    simulate(dut, send, receive)
    assert got == sent


def test_uart_rx_drops_a_byte_with_a_low_stop_bit():
    cpb = 4
    dut = UartRx(cpb)
    seen = {"error": 0, "valid": 0}

    async def drive(ctx):
        for frame in ([0, *[1, 0, 1, 0, 1, 0, 1, 0], 0], [0, *[0] * 8, 1]):   # bad stop bit, then 0x00
            for level in frame:
                ctx.set(dut.rx, level)
                for _ in range(cpb):
                    _, _, err, valid = await ctx.tick().sample(dut.framing_error, dut.source.valid)
                    seen["error"] += err
                    seen["valid"] += valid and seen["valid"] == 0
            ctx.set(dut.rx, 1)
            for _ in range(3 * cpb):
                _, _, err, valid, payload = await ctx.tick().sample(dut.framing_error, dut.source.valid,
                                                                     dut.source.payload)
                seen["error"] += err
                if valid:
                    seen["payload"] = payload
                    seen["valid"] = 1
        assert seen["error"] == 1 and seen.get("payload") == 0x00

    simulate(dut, drive)


@pytest.mark.parametrize("cls", [UartRx, UartTx])
@pytest.mark.parametrize("bad", [3, 0, 4.5, "8"])
def test_uart_refuses_bad_cycles_per_bit(cls, bad):
    with pytest.raises(ValueError, match="Cycles per bit must be an integer of at least 4"):
        cls(bad)


# ---------------------------------------------------------------------------- bridge

class _BridgeRig(Elaboratable):
    """The bridge on a register file and an AXI memory, at the byte-stream level."""

    def __init__(self, mem_bytes=256, timeout_cycles=60):
        self.regs = RegisterFile(REGISTERS)
        self.bridge = Bridge(mem_bytes, self.regs.addr_bits, timeout_cycles)
        self.memory = AxiMemory(64, mem_bytes, 3)

    def elaborate(self, platform):
        m = Module()
        m.submodules.regs, m.submodules.bridge, m.submodules.memory = self.regs, self.bridge, self.memory
        wiring.connect(m, self.bridge.axil, self.regs.bus)
        wiring.connect(m, self.bridge.mem, self.memory.bytes)
        return m


def _exchange(rig, frames, answers):
    """Send each byte string of ``frames`` and read the number of bytes in ``answers``; returns them."""
    got = []

    async def talk(ctx):
        for frame, n in zip(frames, answers):
            for byte in frame:
                await stream_put(ctx, rig.bridge.rx, byte)
            got.append(bytes([await stream_get(ctx, rig.bridge.tx) for _ in range(n)]))

    simulate(rig, talk)
    return got


def test_bridge_ping_memory_and_registers():
    rig = _BridgeRig()
    irq = by_name("IRQ_ENABLE").offset
    got = _exchange(rig, [
        b"\x00\x00" + header(Opcode.PING),
        header(Opcode.WRITE_MEM, 0x13, 5) + b"hello",
        header(Opcode.READ_MEM, 0x12, 7),
        header(Opcode.WRITE_REG, irq, 1),
        header(Opcode.READ_REG, irq),
        header(Opcode.READ_REG, by_name("ID").offset),
        header(Opcode.ZERO_MEM, 0x14, 2),
        header(Opcode.READ_MEM, 0x12, 7),
    ], [9, 1, 8, 1, 5, 5, 1, 8])
    assert got[0] == bytes([Status.OK]) + BRIDGE_MAGIC.to_bytes(4, "little") + (256).to_bytes(4, "little")
    assert got[1] == bytes([Status.OK])
    assert got[2] == bytes([Status.OK]) + b"\x00hello\x00"
    assert got[3] == bytes([Status.OK])
    assert got[4] == bytes([Status.OK]) + (1).to_bytes(4, "little")
    assert got[5] == bytes([Status.OK]) + (0).to_bytes(4, "little")     # ID is driven by the accelerator
    assert got[6] == bytes([Status.OK])
    assert got[7] == bytes([Status.OK]) + b"\x00h\x00\x00lo\x00"


def test_bridge_errors_never_hang():
    rig = _BridgeRig(mem_bytes=256, timeout_cycles=60)
    got = _exchange(rig, [
        header(Opcode.READ_MEM, 250, 7),                  # past the end
        header(Opcode.WRITE_MEM, 255, 2) + b"xy",         # past the end: payload consumed
        header(Opcode.READ_MEM, 0xFFFF_FFFF, 2),          # wraps 32 bits
        header(0x42, 0, 0),                               # unknown opcode
        header(Opcode.WRITE_REG, 0x2, 0),                 # unaligned register
        header(Opcode.READ_REG, 1 << 12, 0),              # beyond the register map
        header(Opcode.ZERO_MEM, 200, 57),                 # past the end
        header(Opcode.WRITE_MEM, 0, 3) + b"a",            # the host stops mid-payload
        header(Opcode.READ_MEM, 0, 2),
    ], [1, 1, 1, 1, 1, 1, 1, 1, 3])
    assert got[:8] == [bytes([s]) for s in (Status.RANGE, Status.RANGE, Status.RANGE, Status.BAD_OPCODE,
                                            Status.RANGE, Status.RANGE, Status.RANGE, Status.TIMEOUT)]
    assert got[8] == bytes([Status.OK]) + b"a\x00"


def test_bridge_protocol_table_matches_the_definitions():
    """The docstring's tables are the integration contract: they must name every opcode and
    status with its value, and nothing else."""
    doc = bridge_module.__doc__
    opcodes = dict(re.findall(r"^([A-Z_]+)\s+0x([0-9A-F]{2})\s", doc, re.M))
    expected = {**{o.name: f"{o.value:02X}" for o in Opcode}, **{s.name: f"{s.value:02X}" for s in Status}}
    assert opcodes == expected
    assert f"0x{BRIDGE_MAGIC:08x}" in doc


@pytest.mark.parametrize("args, message", [
    ((100, 8, 10), "Memory size must be a power of two"),
    ((256, 8, 0), "Timeout must be a positive number of cycles"),
])
def test_bridge_refuses_bad_parameters(args, message):
    with pytest.raises(ValueError, match=message):
        Bridge(*args)


# ---------------------------------------------------------------------------- memory

def test_axi_memory_bursts_and_slverr_beyond_its_size():
    dut = AxiMemory(64, 64, 3)              # 8 beats
    axi = dut.axi

    async def tb(ctx):
        # Write 3 beats from beat 6: the third lies beyond the memory.
        ctx.set(axi.awaddr, 48)
        ctx.set(axi.awlen, 2)
        ctx.set(axi.awid, 5)
        ctx.set(axi.awvalid, 1)
        await ctx.tick().until(axi.awready)
        ctx.set(axi.awvalid, 0)
        for beat in range(3):
            ctx.set(axi.wdata, 0x1111_1111_1111_1111 * (beat + 1))
            ctx.set(axi.wstrb, 0xFF)
            ctx.set(axi.wlast, beat == 2)
            ctx.set(axi.wvalid, 1)
            await ctx.tick().until(axi.wready)
        ctx.set(axi.wvalid, 0)
        ctx.set(axi.bready, 1)
        bresp, bid = await ctx.tick().sample(axi.bresp, axi.bid).until(axi.bvalid)
        assert (bresp, bid) == (RESP_SLVERR, 5)
        ctx.set(axi.bready, 0)
        # Read beats 5..8 back, with a one-cycle pause on the R channel.
        ctx.set(axi.araddr, 40)
        ctx.set(axi.arlen, 3)
        ctx.set(axi.arid, 6)
        ctx.set(axi.arvalid, 1)
        await ctx.tick().until(axi.arready)
        ctx.set(axi.arvalid, 0)
        beats = []
        for i in range(4):
            if i == 1:                       # hold the second beat off for a cycle
                ctx.set(axi.rready, 0)
                await ctx.tick()
            ctx.set(axi.rready, 1)
            beats.append(await ctx.tick().sample(axi.rdata, axi.rresp, axi.rlast, axi.rid).until(axi.rvalid))
        ctx.set(axi.rready, 0)
        assert [b[0] for b in beats[:3]] == [0, 0x1111_1111_1111_1111, 0x2222_2222_2222_2222]
        assert [b[1] for b in beats] == [0, 0, 0, RESP_SLVERR]
        assert [b[2] for b in beats] == [0, 0, 0, 1] and {b[3] for b in beats} == {6}

    simulate(dut, tb)


@pytest.mark.parametrize("size", [4, 100, 0])
def test_axi_memory_refuses_bad_sizes(size):
    with pytest.raises(ValueError, match="Memory size must be a power of two of at least one bus beat"):
        AxiMemory(64, size, 3)


def test_byte_port_signature_refuses_bad_widths():
    with pytest.raises(ValueError, match="Address width must be a positive integer"):
        BytePortSignature(0)


# ---------------------------------------------------------------------------- board top

@pytest.mark.parametrize("kwargs, message", [
    (dict(mem_bytes=3000), "Memory size must be a power of two of at least 4096"),
    (dict(clk_hz=300_000), "must be at least 4 times the baud rate"),
])
def test_board_top_refuses_bad_parameters(kwargs, message):
    args = dict(config=PRESETS["tiny"], mem_bytes=1 << 16, clk_hz=25_000_000, baud=115200) | kwargs
    with pytest.raises(ValueError, match=message):
        BoardTop(**args)


def test_board_top_refuses_a_non_config():
    with pytest.raises(TypeError, match="Config must be an AccelConfig"):
        BoardTop("tiny", 1 << 16, 25_000_000, 115200)
