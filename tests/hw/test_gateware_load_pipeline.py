"""Pipelined LOADs, in Amaranth's simulator: a command's bursts go out while the previous
command's data still arrives, the data stays in order, and a LOAD's token push never comes
before its tile is in SRAM.
"""

import random

import numpy as np
import pytest

from gemforge.hw.config import PRESETS
from gemforge.hw.microarch import dma_groups
from gemforge.hw.gateware.dma_read import DmaReader
from gemforge.hw.gateware.load import LoadEngine
from gemforge.hw.gateware.testbench import (
    AxiReadMemory, group_entries, issue_words, simulate, stream_get, stream_put, wait_until_low,
)
from gemforge.hw.gateware.tile_load import TileLoader
from gemforge.hw.isa import Load, MemType, encode

from test_gateware_dma import WIDE_BUS, expected_entries, padded_tile, random_commands, wait_idle


def bus_log(bus, log):
    """A process recording (cycle, "ar" | "r") for every AR and R handshake of ``bus``."""
    async def process(ctx):
        cycle = 0
        async for _clk, _rst, arvalid, arready, rvalid, rready in ctx.tick().sample(
                bus.arvalid, bus.arready, bus.rvalid, bus.rready):
            if arvalid and arready:
                log.append((cycle, "ar"))
            if rvalid and rready:
                log.append((cycle, "r"))
            cycle += 1
    return process


def beats_of(cmd, entry, bus):
    """R beats of one command (burst lengths add up to the rows' beats)."""
    k = max(1, bus // entry)
    total = 0
    for y in range(cmd["y_size"]):
        first = cmd["base"] + y * cmd["x_stride"]
        if entry >= bus:
            total += cmd["x_size"] * entry // bus
        else:
            total += (first + cmd["x_size"] - 1) // k - first // k + 1
    return total


@pytest.mark.parametrize("contended", [0, 1])
def test_reader_issues_next_bursts_during_previous_data(contended):
    """Two short commands back to back: the second's AR goes out before the first's last R
    beat, unless another client asks for the bus (then commands do not chain)."""
    entry, bus = 16, 8
    dut = DmaReader(entry, bus)
    data = bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8))
    mem = AxiReadMemory(dut.bus, data, bus)
    commands = [dict(base=0, y_size=1, x_size=4, x_stride=4), dict(base=40, y_size=1, x_size=4, x_stride=4)]
    log, entries = [], []

    async def tb(ctx):
        ctx.set(dut.bus.contended, contended)
        for cmd in commands:
            await stream_put(ctx, dut.cmd, cmd)
        await wait_idle(ctx, dut)

    async def sink(ctx):
        while True:
            entries.extend(group_entries(await stream_get(ctx, dut.out)))

    simulate(dut, tb, processes=[mem.run, sink, bus_log(dut.bus, log)])
    assert entries == [v for cmd in commands for v in expected_entries(data, entry, cmd)]
    first_beats = beats_of(commands[0], entry, bus)
    r_cycles = [c for c, kind in log if kind == "r"]
    ar_cycles = [c for c, kind in log if kind == "ar"]
    assert len(ar_cycles) == 2 and len(r_cycles) == first_beats + beats_of(commands[1], entry, bus)
    if contended:
        assert ar_cycles[1] > r_cycles[first_beats - 1], "chained a command while another client asked"
    else:
        assert ar_cycles[1] < r_cycles[first_beats - 1], "the second command waited for the first's data"
        # Data streams on: no gap between the two commands' beats.
        assert r_cycles[first_beats] - r_cycles[first_beats - 1] == 1


@pytest.mark.parametrize("entry,bus,lanes", [(16, 8, None), (8, 8, None), (4, 8, None), (4, 32, 2), (1, 8, 1)],
                         ids=["wide", "beat", "narrow", "narrow-l2", "bytes-l1"])
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_reader_chained_commands_keep_order(entry, bus, lanes, stall):
    """Many random commands offered without waiting, under random bus and consumer
    backpressure: groups and entries are the concatenation of the commands'."""
    dut = DmaReader(entry, bus, lanes, depth=3)
    k = max(1, bus // entry)
    rng = random.Random(f"chain-{entry}-{bus}-{lanes}-{stall}")
    commands = random_commands(rng, k, count=10)
    data = bytes(np.random.default_rng(entry + bus).integers(0, 256, 8192, dtype=np.uint8))
    mem = AxiReadMemory(dut.bus, data, bus, stall=stall, seed=entry)
    groups = []

    async def tb(ctx):
        for cmd in commands:
            await stream_put(ctx, dut.cmd, cmd)
        await wait_idle(ctx, dut, cycles=5000)

    async def sink(ctx):
        while True:
            if rng.random() < stall:
                await ctx.tick()
            else:
                groups.append(group_entries(await stream_get(ctx, dut.out)))

    simulate(dut, tb, processes=[mem.run, sink])
    assert [len(g) for g in groups] == [n for cmd in commands for n in dma_groups(
        **cmd, entry_bytes=entry, bus_bytes=bus, lanes=lanes)]
    assert [v for g in groups for v in g] == [v for cmd in commands for v in expected_entries(data, entry, cmd)]


@pytest.mark.parametrize("config,buffer", [(PRESETS["tiny"], "inp"), (PRESETS["tiny"], "wgt"), (WIDE_BUS, "inp")],
                         ids=["tiny-inp", "tiny-wgt", "wide-inp"])
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_tile_loader_chained_tiles_and_done(config, buffer, stall):
    """Padded tiles (some empty, some padding only) offered back to back: every tile is
    written in order, and ``done`` pulses once per tile, in the cycle of its last write."""
    entry, depth = config.entry_bytes(buffer), config.depth(buffer)
    dut = TileLoader(config, buffer)
    rng = random.Random(f"tiles-{config.name}-{buffer}-{stall}")
    k = max(1, config.bus_bytes // entry)
    commands = []
    for i in range(8):
        x_size = rng.randint(1, 2 * k + 3)
        y_size = 0 if i % 4 == 3 else rng.randint(1, 3)
        pads = [rng.randint(0, 2), rng.randint(0, 2), rng.randint(0, k + 1), rng.randint(0, k + 1)]
        if i == 5:
            pads = [0, 0, 0, 0]     # y_size 0 and no padding below: no positions at all
            y_size = 0
        commands.append(dict(sram_base=rng.randrange(depth), dram_base=rng.randrange(0, 3 * k + 3),
                             y_size=y_size, x_size=x_size, x_stride=x_size + rng.randrange(0, 2 * k),
                             y_pad0=pads[0], y_pad1=pads[1], x_pad0=pads[2], x_pad1=pads[3]))
    data = bytes(np.random.default_rng(7).integers(1, 256, 8192, dtype=np.uint8))
    mem = AxiReadMemory(dut.bus, data, config.bus_bytes, stall=stall, seed=3)
    events = []    # (cycle, "w", addr, values) and (cycle, "done")

    async def tb(ctx):
        for cmd in commands:
            await stream_put(ctx, dut.cmd, cmd)
        await wait_idle(ctx, dut, cycles=5000)

    async def monitor(ctx):
        cycle = 0
        async for _clk, _rst, en, addr, count, values, done in ctx.tick().sample(
                dut.wr.en, dut.wr.addr, dut.wr.count, dut.wr.data, dut.done):
            if en:
                events.append((cycle, "w", addr, [values[i] for i in range(count)]))
            if done:
                events.append((cycle, "done"))
            cycle += 1

    simulate(dut, tb, processes=[mem.run, monitor])
    tiles = [[]]
    for event in events:
        if event[1] == "w":
            tiles[-1].append(event)
        else:
            tiles.append([])
    assert tiles.pop() == [], "writes after the last done"
    assert len(tiles) == len(commands)
    done_cycles = [e[0] for e in events if e[1] == "done"]
    assert len(set(done_cycles)) == len(done_cycles)
    for cmd, writes, done_cycle in zip(commands, tiles, done_cycles):
        tile = padded_tile(data, entry, cmd)
        assert [v for *_, values in writes for v in values] == tile
        addrs = [(a + i) % depth for _, _, a, values in writes for i in range(len(values))]
        assert addrs == [(cmd["sram_base"] + i) % depth for i in range(len(tile))]
        if writes:
            assert writes[-1][0] == done_cycle, "done is not the cycle of the tile's last write"


def _load_engine_run(config, insns, stall, seed, can_push_rate=1.0):
    """Run `LoadEngine` on LOAD instructions with token queues that always have tokens and
    (randomly) room; returns (inp/wgt DRAM data, event log, bus logs)."""
    dut = LoadEngine(config)
    rng = random.Random(seed)
    data = bytes(np.random.default_rng(seed).integers(1, 256, 16384, dtype=np.uint8))
    mems = {name: AxiReadMemory(getattr(dut, f"{name}_bus"), data, config.bus_bytes, stall=stall,
                                seed=seed + i) for i, name in enumerate(("inp", "wgt"))}
    events = []
    bus_logs = {"inp": [], "wgt": []}
    finished = []

    async def tb(ctx):
        ctx.set(dut.next_pop.can_pop, 1)
        await issue_words(ctx, dut.cmd, [encode(insn, config) for insn in insns])
        if await wait_until_low(ctx, dut.busy):
            finished.append(True)

    async def tokens(ctx):
        while True:
            ctx.set(dut.next_push.can_push, int(rng.random() < can_push_rate))
            await ctx.tick()

    async def monitor(ctx):
        cycle = 0
        async for (_clk, _rst, ien, iaddr, icount, idata, wen, waddr, wcount, wdata, push, can_push, pop,
                   retire) in ctx.tick().sample(
                dut.inp_wr.en, dut.inp_wr.addr, dut.inp_wr.count, dut.inp_wr.data,
                dut.wgt_wr.en, dut.wgt_wr.addr, dut.wgt_wr.count, dut.wgt_wr.data,
                dut.next_push.push, dut.next_push.can_push, dut.next_pop.pop, dut.retire):
            if ien:
                events.append((cycle, "inp", iaddr, [idata[i] for i in range(icount)]))
            if wen:
                events.append((cycle, "wgt", waddr, [wdata[i] for i in range(wcount)]))
            if push:
                assert can_push, "pushed into a full queue"
                events.append((cycle, "push"))
            if pop:
                events.append((cycle, "pop"))
            if retire:
                events.append((cycle, "retire"))
            cycle += 1

    simulate(dut, tb, processes=[mems["inp"].run, mems["wgt"].run, tokens, monitor,
                                 bus_log(dut.inp_bus, bus_logs["inp"]), bus_log(dut.wgt_bus, bus_logs["wgt"])])
    assert finished, "the engine did not finish"
    return data, events, bus_logs


def _tile_of(data, config, insn):
    buffer = "wgt" if insn.mem == MemType.WGT else "inp"
    return buffer, padded_tile(data, config.entry_bytes(buffer), dict(
        dram_base=insn.dram_base, y_size=insn.y_size, x_size=insn.x_size, x_stride=insn.x_stride,
        y_pad0=insn.y_pad0, y_pad1=insn.y_pad1, x_pad0=insn.x_pad0, x_pad1=insn.x_pad1))


def _random_loads(config, rng, count):
    insns = []
    for i in range(count):
        mem = rng.choice([MemType.INP, MemType.INP, MemType.WGT])
        buffer = "wgt" if mem == MemType.WGT else "inp"
        k = max(1, config.bus_bytes // config.entry_bytes(buffer))
        x_size = rng.randint(1, 2 * k + 2)
        y_size = rng.choice([0, 1, 1, 2])
        pads = [rng.randint(0, 1), rng.randint(0, 1), rng.randint(0, 2), rng.randint(0, 2)] if buffer == "inp" \
            else [0, 0, 0, 0]
        rows = pads[0] + y_size + pads[1]
        pitch = pads[2] + x_size + pads[3]
        depth = config.depth(buffer)
        insns.append(Load(mem=mem, sram_base=rng.randrange(depth - rows * pitch + 1) if rows * pitch <= depth else 0,
                          dram_base=rng.randrange(0, 4 * k), y_size=y_size, x_size=x_size,
                          x_stride=x_size + rng.randrange(0, k + 1),
                          y_pad0=pads[0], y_pad1=pads[1], x_pad0=pads[2], x_pad1=pads[3],
                          pop_next=rng.random() < 0.5, push_next=rng.random() < 0.6))
    return insns


@pytest.mark.parametrize("stall,can_push_rate", [(0.0, 1.0), (0.3, 1.0), (0.3, 0.4)],
                         ids=["free", "bus-stall", "bus-and-token-stall"])
def test_load_engine_pushes_after_each_tile(stall, can_push_rate):
    """Random LOADs (inp and wgt, with padding, some without data): tiles land in order, each
    instruction retires once and in order, and its push comes only after its last SRAM write."""
    config = PRESETS["tiny"]
    rng = random.Random(f"engine-{stall}-{can_push_rate}")
    insns = _random_loads(config, rng, 14)
    data, events, _ = _load_engine_run(config, insns, stall, seed=11, can_push_rate=can_push_rate)

    # The two buffers' loaders overlap: follow each buffer's writes on its own.
    writes = {name: [e for e in events if e[1] == name] for name in ("inp", "wgt")}
    position = {"inp": 0, "wgt": 0}
    retires = [e[0] for e in events if e[1] == "retire"]
    pushes = [e[0] for e in events if e[1] == "push"]
    assert len(retires) == len(insns)
    assert len([e for e in events if e[1] == "pop"]) == sum(i.pop_next for i in insns)
    push_index = 0
    for insn, retire in zip(insns, retires):
        buffer, tile = _tile_of(data, config, insn)
        mine = []
        while sum(len(e[3]) for e in mine) < len(tile):
            mine.append(writes[buffer][position[buffer]])
            position[buffer] += 1
        assert [v for e in mine for v in e[3]] == tile
        if mine:
            assert retire > mine[-1][0], "retired before the tile was written"
        if insn.push_next:
            assert pushes[push_index] == retire, "push not in the retiring cycle"
            push_index += 1
    assert all(position[name] == len(writes[name]) for name in writes) and push_index == len(pushes)


def test_load_engine_overlaps_consecutive_loads():
    """Back-to-back short LOADs to one buffer: each LOAD's AR goes out before the previous
    LOAD's last R beat, and the R beats of the whole stream come nearly back to back."""
    config = PRESETS["tiny"]
    count, x = 6, 8
    insns = [Load(mem=MemType.INP, sram_base=8 * i, dram_base=40 * i, y_size=1, x_size=x, x_stride=x,
                  push_next=True) for i in range(count)]
    _, events, logs = _load_engine_run(config, insns, 0.0, seed=5)
    log = logs["inp"]
    beats = x * config.inp_entry_bytes // config.bus_bytes
    ars = [c for c, kind in log if kind == "ar"]
    rs = [c for c, kind in log if kind == "r"]
    assert len(ars) == count and len(rs) == count * beats
    for i in range(1, count):
        assert ars[i] < rs[i * beats - 1], f"LOAD {i}'s address went out after LOAD {i - 1}'s data"
    # At most one idle cycle between consecutive LOADs' data (the front end takes three
    # cycles per instruction: take, pop, launch).
    assert rs[-1] - rs[0] + 1 <= count * beats + count
    pushes = [e[0] for e in events if e[1] == "push"]
    assert len(pushes) == count


def test_reader_refuses_bad_depth():
    with pytest.raises(TypeError, match="Command depth must be a positive integer, not 0"):
        DmaReader(4, 8, depth=0)


def test_tile_loader_refuses_bad_depth():
    with pytest.raises(TypeError, match="Command depth must be a positive integer, not 'x'"):
        TileLoader(PRESETS["tiny"], "inp", depth="x")
