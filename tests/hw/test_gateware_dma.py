"""DMA address generation, padding and data movement, in Amaranth's simulator."""

import numpy as np
import pytest

from gemforge.hw.gateware.testbench import AxiReadMemory, AxiWriteMemory, simulate, stream_put

from gemforge.hw.config import PRESETS
from gemforge.hw.gateware.dma import BurstGenerator, DmaReader, DmaWriter, max_burst_beats
from gemforge.hw.gateware.tile_load import TileLoader
from gemforge.hw.gateware.tokens import TokenQueue

# (entry bytes, bus bytes): entries smaller than, equal to and larger than a beat.
SIZES = [(4, 8), (8, 8), (16, 8), (64, 8), (2, 32)]
COMMANDS = [dict(base=3, y_size=3, x_size=5, x_stride=7), dict(base=0, y_size=1, x_size=1, x_stride=0),
            dict(base=5, y_size=2, x_size=3, x_stride=2)]


def expected_entries(data, entry, cmd):
    out = []
    for y in range(cmd["y_size"]):
        for x in range(cmd["x_size"]):
            e = cmd["base"] + y * cmd["x_stride"] + x
            out.append(int.from_bytes(data[e * entry:(e + 1) * entry], "little"))
    return out


@pytest.mark.parametrize("entry,bus", SIZES)
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_reader_moves_strided_tiles(entry, bus, stall):
    dut = DmaReader(entry, bus)
    data = bytes(np.random.default_rng(entry).integers(0, 256, 8192, dtype=np.uint8))
    mem = AxiReadMemory(dut.bus, data, bus, stall=stall, seed=entry)
    got = []

    async def tb(ctx):
        ctx.set(dut.out.ready, 1)
        for cmd in COMMANDS:
            await stream_put(ctx, dut.cmd, cmd)
            for _ in range(400):
                await ctx.tick()
                if not ctx.get(dut.busy):
                    break
            assert not ctx.get(dut.busy)

    async def monitor(ctx):
        async for _clk, _rst, valid, ready, payload in ctx.tick().sample(dut.out.valid, dut.out.ready, dut.out.p):
            if valid and ready:
                got.append(payload)

    simulate(dut, tb, processes=[mem.run, monitor])
    assert got == [v for cmd in COMMANDS for v in expected_entries(data, entry, cmd)]


def test_bursts_split_at_boundaries():
    """Rows longer than a burst split at max-burst (hence 4 KiB) boundaries, in order."""
    entry, bus = 256, 8
    dut = BurstGenerator(entry, bus)
    maxb = max_burst_beats(bus)
    bursts = []

    async def tb(ctx):
        ctx.set(dut.burst.ready, 1)
        await stream_put(ctx, dut.cmd, dict(base=1, y_size=2, x_size=3, x_stride=5))
        for _ in range(40):
            _, _, valid, addr, length = await ctx.tick().sample(dut.burst.valid, dut.burst.p.addr, dut.burst.p.len)
            if valid:
                bursts.append((addr, length + 1))

    simulate(dut, tb)
    beats_per_entry = entry // bus
    expected = []
    for row in range(2):
        beat, left = (1 + row * 5) * beats_per_entry, 3 * beats_per_entry
        while left:
            n = min(left, maxb - beat % maxb)
            expected.append((beat * bus, n))
            beat, left = beat + n, left - n
    assert bursts == expected
    for addr, n in bursts:
        assert addr // 4096 == (addr + n * bus - 1) // 4096


@pytest.mark.parametrize("entry,bus", SIZES)
def test_writer_writes_strided_tiles_with_strobes(entry, bus):
    dut = DmaWriter(entry, bus)
    dram = bytearray(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    expected = bytearray(dram)
    mem = AxiWriteMemory(dut.bus, dram, bus, stall=0.3, seed=2)
    cmd = dict(base=3, y_size=3, x_size=5, x_stride=7)
    values = [int(v) for v in np.random.default_rng(2).integers(0, 1 << min(62, entry * 8), 15)]
    k = 0
    for y in range(3):
        for x in range(5):
            e = cmd["base"] + y * cmd["x_stride"] + x
            expected[e * entry:(e + 1) * entry] = values[k].to_bytes(entry, "little")
            k += 1

    async def tb(ctx):
        await stream_put(ctx, dut.cmd, cmd)
        for v in values:
            ctx.set(dut.inp.payload, v)
            ctx.set(dut.inp.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(dut.inp.ready)
                if ready:
                    break
        ctx.set(dut.inp.valid, 0)
        for _ in range(300):
            await ctx.tick()
            if not ctx.get(dut.busy):
                break
        assert not ctx.get(dut.busy)

    simulate(dut, tb, processes=[mem.run])
    assert dram == expected


@pytest.mark.parametrize("buffer", ["inp", "wgt"])
def test_tile_loader_pads_with_zeros(buffer):
    config = PRESETS["tiny"]
    dut = TileLoader(config, buffer)
    entry = config.entry_bytes(buffer)
    data = bytes(np.random.default_rng(3).integers(1, 256, 4096, dtype=np.uint8))
    mem = AxiReadMemory(dut.bus, data, config.bus_bytes, stall=0.3, seed=4)
    cmd = dict(sram_base=5, dram_base=2, y_size=2, x_size=3, x_stride=4, y_pad0=1, y_pad1=2, x_pad0=2, x_pad1=1)
    writes = {}

    async def tb(ctx):
        await stream_put(ctx, dut.cmd, cmd)
        for _ in range(300):
            await ctx.tick()
            if not ctx.get(dut.busy):
                break
        assert not ctx.get(dut.busy)

    async def monitor(ctx):
        async for _clk, _rst, en, addr, value in ctx.tick().sample(dut.wr_en, dut.wr_addr, dut.wr_data):
            if en:
                assert addr not in writes, "an entry was written twice"
                writes[addr] = value

    simulate(dut, tb, processes=[mem.run, monitor])
    rows, pitch = 1 + 2 + 2, 2 + 3 + 1
    expected = {}
    for r in range(rows):
        for c in range(pitch):
            value = 0
            if 1 <= r < 3 and 2 <= c < 5:
                e = 2 + (r - 1) * 4 + (c - 2)
                value = int.from_bytes(data[e * entry:(e + 1) * entry], "little")
            expected[5 + r * pitch + c] = value
    assert writes == expected


def test_token_queue_counts_and_blocks():
    dut = TokenQueue(3)

    async def tb(ctx):
        assert ctx.get(dut.can_push) and not ctx.get(dut.can_pop)
        ctx.set(dut.push, 1)
        for _ in range(5):          # two pushes into a full queue are ignored
            await ctx.tick()
        assert ctx.get(dut.count) == 3 and not ctx.get(dut.can_push)
        ctx.set(dut.pop, 1)
        await ctx.tick()            # push and pop together while full: pop only
        assert ctx.get(dut.count) == 2
        ctx.set(dut.push, 0)
        for _ in range(4):
            await ctx.tick()
        assert ctx.get(dut.count) == 0 and not ctx.get(dut.can_pop)

    simulate(dut, tb)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_token_queue_rejects_bad_capacity():
    with pytest.raises(TypeError, match="positive integer"):
        TokenQueue(0)
