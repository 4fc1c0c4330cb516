"""DMA address generation, grouping, padding and data movement, in Amaranth's simulator.

Entries narrower than a beat travel in groups (the entries of one beat that belong to one
row); every test checks the groups against `dma_groups` and the data against DRAM.
"""

import random

import numpy as np
import pytest

from gemforge.hw.gateware.testbench import (
    AxiReadMemory, AxiWriteMemory, group_entries, simulate, stream_get, stream_put,
)

from gemforge.hw.config import PRESETS, AccelConfig
from gemforge.hw.gateware.arbiter import ReadArbiter
from gemforge.hw.gateware.dma import BurstGenerator
from gemforge.hw.microarch import buffer_lanes, dma_groups, max_burst_beats
from gemforge.hw.gateware.dma_read import DmaReader
from gemforge.hw.gateware.dma_write import DmaWriter
from gemforge.hw.gateware.tile_load import TileLoader
from gemforge.hw.gateware.tokens import TokenQueue

# (entry bytes, bus bytes, lanes): entries wider than, as wide as and narrower than a beat,
# k = 2, 4, 8 and 16 entries per beat, and groups narrower than a beat (lanes < k).
SIZES = [(16, 8, None), (64, 8, None), (8, 8, None), (4, 8, None), (4, 16, None), (4, 32, None),
         (1, 8, None), (2, 32, None), (4, 32, 2), (1, 8, 1)]
SIZE_IDS = [f"e{e}-b{b}-l{l or 'k'}" for e, b, l in SIZES]

#: A 256-bit bus with 4-byte inp/out/uop entries (8 per beat) and 16-byte acc/wgt entries (2 per beat).
WIDE_BUS = AccelConfig(
    name="widebus", batch=1, block_in=4, block_out=4,
    inp_buffer_bytes=512, wgt_buffer_bytes=1024, acc_buffer_bytes=1024, out_buffer_bytes=256,
    uop_buffer_bytes=512, bus_width=256, cmd_queue_depth=16, token_queue_depth=8)
#: Buffers shallower than a beat's entries: uop (2 entries) and inp (4) get groups of 2 and 4, not 8.
SHALLOW = WIDE_BUS.replace(name="shallow", uop_buffer_bytes=8, inp_buffer_bytes=16)


def random_commands(rng, k, count=4):
    """DMA commands whose rows start and end anywhere in a beat, rows overlapping or apart."""
    commands = []
    for _ in range(count):
        x_size = rng.randint(1, 3 * k + 2)
        commands.append(dict(base=rng.randrange(0, 4 * k + 5), y_size=rng.randint(1, 4), x_size=x_size,
                             x_stride=rng.randrange(0, x_size + 2 * k + 2)))
    return commands


def expected_entries(data, entry, cmd):
    out = []
    for y in range(cmd["y_size"]):
        for x in range(cmd["x_size"]):
            e = cmd["base"] + y * cmd["x_stride"] + x
            out.append(int.from_bytes(data[e * entry:(e + 1) * entry], "little"))
    return out


def write_plan(commands, entry, bus, lanes, rng, dram):
    """Random values for ``commands``: (command, groups) pairs and the DRAM they should leave."""
    expected = bytearray(dram)
    plan = []
    for cmd in commands:
        values = [rng.getrandbits(entry * 8) for _ in range(cmd["y_size"] * cmd["x_size"])]
        for y in range(cmd["y_size"]):      # later rows win where rows overlap, as in DRAM
            for x in range(cmd["x_size"]):
                e = cmd["base"] + y * cmd["x_stride"] + x
                expected[e * entry:(e + 1) * entry] = values[y * cmd["x_size"] + x].to_bytes(entry, "little")
        groups, pos = [], 0
        for n in dma_groups(**cmd, entry_bytes=entry, bus_bytes=bus, lanes=lanes):
            groups.append(values[pos:pos + n])
            pos += n
        plan.append((cmd, groups))
    return plan, expected


async def put_groups(ctx, stream, groups, rng, stall):
    """Offer entry groups on ``stream``, pausing a random number of cycles before each."""
    for group in groups:
        while rng.random() < stall:
            await ctx.tick()
        await stream_put(ctx, stream, dict(entries=group, count=len(group)))


async def wait_idle(ctx, dut, cycles=2000):
    for _ in range(cycles):
        await ctx.tick()
        if not ctx.get(dut.busy):
            return
    raise AssertionError(f"still busy after {cycles} cycles")


@pytest.mark.parametrize("entry,bus,lanes", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_reader_moves_strided_tiles_in_groups(entry, bus, lanes, stall):
    """Random commands under random AXI and consumer backpressure: the groups are the walk's,
    the entries DRAM's, in order."""
    dut = DmaReader(entry, bus, lanes)
    k = max(1, bus // entry)
    rng = random.Random(f"{entry}-{bus}-{lanes}-{stall}")
    commands = random_commands(rng, k)
    data = bytes(np.random.default_rng(entry * bus).integers(0, 256, 8192, dtype=np.uint8))
    mem = AxiReadMemory(dut.bus, data, bus, stall=stall, seed=entry)
    groups = []

    async def tb(ctx):
        for cmd in commands:
            await stream_put(ctx, dut.cmd, cmd)
            await wait_idle(ctx, dut)

    async def sink(ctx):
        while True:
            if rng.random() < stall:
                await ctx.tick()
            else:
                group = await stream_get(ctx, dut.out)
                groups.append(group_entries(group))

    simulate(dut, tb, processes=[mem.run, sink])
    assert [len(g) for g in groups] == [n for cmd in commands for n in dma_groups(**cmd, entry_bytes=entry,
                                                                                   bus_bytes=bus, lanes=lanes)]
    assert [v for g in groups for v in g] == [v for cmd in commands for v in expected_entries(data, entry, cmd)]


def test_reader_streams_a_beat_per_cycle():
    """A long row of 4-byte entries on a 256-bit bus: 8 entries per cycle once data flows."""
    dut = DmaReader(4, 32)
    data = bytes(range(256)) * 32
    mem = AxiReadMemory(dut.bus, data, 32)
    transfers = []

    async def tb(ctx):
        await stream_put(ctx, dut.cmd, dict(base=3, y_size=1, x_size=8 * 40, x_stride=0))
        ctx.set(dut.out.ready, 1)
        for cycle in range(120):
            _, _, valid, count = await ctx.tick().sample(dut.out.valid, dut.out.p.count)
            if valid:
                transfers.append((cycle, count))

    simulate(dut, tb, processes=[mem.run])
    counts = [n for _, n in transfers]
    assert counts == dma_groups(3, 1, 320, 0, 4, 32) == [5] + [8] * 39 + [3]
    cycles = [c for c, _ in transfers]
    assert cycles[-1] - cycles[0] == len(cycles) - 1, "the groups did not stream back to back"


def expected_bursts(cmd, entry, bus):
    """The bursts a command splits into: each row from its first beat to its last, cut at every
    max-burst boundary (hence never across 4 KiB), as (byte address, beats, last)."""
    maxb = max_burst_beats(bus)
    bursts = []
    for row in range(cmd["y_size"]):
        first = (cmd["base"] + row * cmd["x_stride"]) * entry
        beat, end = first // bus, -(-(first + cmd["x_size"] * entry) // bus)
        while beat < end:
            n = min(end - beat, maxb - beat % maxb)
            bursts.append((beat * bus, n, row == cmd["y_size"] - 1 and beat + n == end))
            beat += n
    return bursts


@pytest.mark.parametrize("entry,bus", [(256, 8), (4, 8), (1, 32), (64, 64), (16, 16)])
def test_bursts_split_at_boundaries(entry, bus):
    """Rows from one beat to several maximal bursts long, starting anywhere, split at
    max-burst (hence 4 KiB) boundaries into the longest bursts allowed, in order, with the
    command's last burst marked; the AXI side stalls at random."""
    rng = random.Random(entry * 1000 + bus)
    dut = BurstGenerator(entry, bus)
    maxb = max_burst_beats(bus)
    row_entries = maxb * bus // entry       # entries in one maximal burst (at least one)
    cmds = [dict(base=rng.randrange(4 * row_entries + 8), y_size=rng.randint(1, 3),
                 x_size=rng.randint(1, max(1, 3 * row_entries + 5)), x_stride=rng.randint(1, 5 * row_entries + 9))
            for _ in range(6)]
    cmds.append(dict(base=row_entries - 1, y_size=2, x_size=2 * row_entries + 1, x_stride=4 * row_entries))
    expected = [b for cmd in cmds for b in expected_bursts(cmd, entry, bus)]
    assert max(n for _, n, _ in expected) == maxb and sum(n == maxb for _, n, _ in expected) >= 3
    bursts = []

    async def feed(ctx):
        for cmd in cmds:
            await stream_put(ctx, dut.cmd, cmd)
        ctx.set(dut.cmd.valid, 0)

    async def take(ctx):
        for _ in range(50 * len(expected) + 100):      # bounded: a stuck generator fails, not hangs
            if len(bursts) == len(expected):
                break
            ready = rng.random() < 0.7
            ctx.set(dut.burst.ready, ready)
            _, _, valid, addr, length, last = await ctx.tick().sample(
                dut.burst.valid, dut.burst.p.addr, dut.burst.p.len, dut.burst.p.last)
            if valid and ready:
                bursts.append((addr, length + 1, bool(last)))

    simulate(dut, feed, take)
    assert bursts == expected
    for addr, n, _ in bursts:
        assert addr // 4096 == (addr + n * bus - 1) // 4096


@pytest.mark.parametrize("entry,bus,lanes", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_writer_writes_strided_tiles_with_strobes(entry, bus, lanes, stall):
    """Groups of the walk, offered with random gaps, land in DRAM under random backpressure;
    nothing outside the tile changes."""
    dut = DmaWriter(entry, bus, lanes)
    k = max(1, bus // entry)
    rng = random.Random(f"w{entry}-{bus}-{lanes}-{stall}")
    commands = random_commands(rng, k, count=3)
    dram = bytearray(np.random.default_rng(1).integers(0, 256, 8192, dtype=np.uint8).tobytes())
    plan, expected = write_plan(commands, entry, bus, lanes, rng, dram)
    mem = AxiWriteMemory(dut.bus, dram, bus, stall=stall, seed=2)

    async def tb(ctx):
        for cmd, groups in plan:
            await stream_put(ctx, dut.cmd, cmd)
            await put_groups(ctx, dut.inp, groups, rng, stall)
            await wait_idle(ctx, dut)

    simulate(dut, tb, processes=[mem.run])
    assert dram == expected


def test_writer_packs_a_beat_per_cycle():
    """A long row of 4-byte entries on a 256-bit bus leaves as whole beats, one per cycle."""
    dut = DmaWriter(4, 32)
    dram = bytearray(32 * 32)
    mem = AxiWriteMemory(dut.bus, dram, 32)
    groups = dma_groups(0, 1, 8 * 32, 0, 4, 32)
    beats = []

    async def tb(ctx):
        await stream_put(ctx, dut.cmd, dict(base=0, y_size=1, x_size=8 * 32, x_stride=0))
        ctx.set(dut.inp.valid, 1)
        ctx.set(dut.inp.p.count, 8)
        for i in range(8):
            ctx.set(dut.inp.p.entries[i], i)
        sent = 0
        for cycle in range(100):
            _, _, ready, wvalid, wready, wstrb = await ctx.tick().sample(
                dut.inp.ready, dut.bus.wvalid, dut.bus.wready, dut.bus.wstrb)
            sent += ready
            if sent == len(groups):
                ctx.set(dut.inp.valid, 0)
            if wvalid and wready:
                beats.append((cycle, wstrb))

    simulate(dut, tb, processes=[mem.run])
    assert len(beats) == 32 and all(strb == (1 << 32) - 1 for _, strb in beats)
    assert beats[-1][0] - beats[0][0] == 31, "the beats did not leave back to back"
    assert dram == bytes(b for _ in range(32) for i in range(8) for b in i.to_bytes(4, "little"))


def tile_writes(config, buffer, commands, stall, seed):
    """Run `TileLoader` on ``commands``; returns (DRAM data, list of (addr, entries) group writes)."""
    dut = TileLoader(config, buffer)
    data = bytes(np.random.default_rng(seed).integers(1, 256, 8192, dtype=np.uint8))
    mem = AxiReadMemory(dut.bus, data, config.bus_bytes, stall=stall, seed=seed)
    writes = []

    async def tb(ctx):
        for cmd in commands:
            await stream_put(ctx, dut.cmd, cmd)
            await wait_idle(ctx, dut)

    async def monitor(ctx):
        async for _clk, _rst, en, addr, count, values in ctx.tick().sample(
                dut.wr.en, dut.wr.addr, dut.wr.count, dut.wr.data):
            if en:
                assert 1 <= count <= len(dut.wr.data)
                writes.append((addr, [values[i] for i in range(count)]))

    simulate(dut, tb, processes=[mem.run, monitor])
    return data, writes


def padded_tile(data, entry, cmd):
    """The padded tile of a LOAD, row-major, from DRAM bytes."""
    rows = cmd["y_pad0"] + cmd["y_size"] + cmd["y_pad1"]
    pitch = cmd["x_pad0"] + cmd["x_size"] + cmd["x_pad1"]
    tile = []
    for r in range(rows):
        for c in range(pitch):
            value = 0
            y, x = r - cmd["y_pad0"], c - cmd["x_pad0"]
            if 0 <= y < cmd["y_size"] and 0 <= x < cmd["x_size"]:
                e = cmd["dram_base"] + y * cmd["x_stride"] + x
                value = int.from_bytes(data[e * entry:(e + 1) * entry], "little")
            tile.append(value)
    return tile


def expected_write_cycles(cmd, lanes, entry, bus):
    """Group writes of a padded tile: one per DMA group, padding runs in groups of ``lanes``."""
    groups = dma_groups(cmd["dram_base"], cmd["y_size"], cmd["x_size"], cmd["x_stride"], entry, bus, lanes)
    pitch = cmd["x_pad0"] + cmd["x_size"] + cmd["x_pad1"]
    runs = [pitch] * (cmd["y_pad0"] + cmd["y_pad1"])
    for _ in range(cmd["y_size"]):
        runs += [n for n in (cmd["x_pad0"], cmd["x_pad1"]) if n]
    return len(groups) + sum(-(-n // lanes) for n in runs)


@pytest.mark.parametrize("config,buffer", [(PRESETS["tiny"], "inp"), (PRESETS["tiny"], "wgt"),
                                           (PRESETS["tiny"], "uop"), (WIDE_BUS, "inp"), (WIDE_BUS, "acc"),
                                           (SHALLOW, "uop"), (SHALLOW, "inp")],
                         ids=["tiny-inp", "tiny-wgt", "tiny-uop", "wide-inp", "wide-acc", "shallow-uop",
                              "shallow-inp"])
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_tile_loader_writes_padded_groups(config, buffer, stall):
    """Random tiles with padding (none for micro-ops): every position written once with its
    DRAM entry or zero, in as few group writes as the walk allows, indices wrapping at the depth."""
    entry, lanes, depth = config.entry_bytes(buffer), buffer_lanes(config, buffer), config.depth(buffer)
    rng = random.Random(f"{config.name}-{buffer}-{stall}")
    commands = []
    for _ in range(3):
        k = max(1, config.bus_bytes // entry)
        x_size = rng.randint(1, 2 * k + 3)
        pads = [0] * 4 if buffer == "uop" else [rng.randint(0, min(15, 2 * k + 1)) if i >= 2 else rng.randint(0, 2)
                                                for i in range(4)]
        commands.append(dict(sram_base=rng.randrange(depth), dram_base=rng.randrange(0, 3 * k + 3),
                             y_size=rng.randint(1, 3), x_size=x_size, x_stride=x_size + rng.randrange(0, 2 * k),
                             y_pad0=pads[0], y_pad1=pads[1], x_pad0=pads[2], x_pad1=pads[3]))
    data, writes = tile_writes(config, buffer, commands, stall, seed=len(buffer))
    for cmd in commands:
        tile = padded_tile(data, entry, cmd)
        n = expected_write_cycles(cmd, lanes, entry, config.bus_bytes)
        mine, writes = writes[:n], writes[n:]
        assert all(len(values) <= lanes for _, values in mine)
        got = [v for _, values in mine for v in values]
        addrs = [(a + i) % depth for a, values in mine for i in range(len(values))]
        assert addrs == [(cmd["sram_base"] + i) % depth for i in range(len(tile))], "positions not written in order"
        assert got == tile
    assert writes == []


def test_token_queue_counts_and_blocks():
    dut = TokenQueue(3)

    async def tb(ctx):
        assert ctx.get(dut.pusher.can_push) and not ctx.get(dut.popper.can_pop)
        ctx.set(dut.pusher.push, 1)
        for _ in range(5):          # two pushes into a full queue are ignored
            await ctx.tick()
        assert ctx.get(dut.count) == 3 and not ctx.get(dut.pusher.can_push)
        ctx.set(dut.popper.pop, 1)
        await ctx.tick()            # push and pop together while full: pop only
        assert ctx.get(dut.count) == 2
        ctx.set(dut.pusher.push, 0)
        for _ in range(4):
            await ctx.tick()
        assert ctx.get(dut.count) == 0 and not ctx.get(dut.popper.can_pop)

    simulate(dut, tb)


def test_token_queue_rejects_bad_capacity():
    with pytest.raises(TypeError, match="positive integer"):
        TokenQueue(0)


class RoundRobinModel:
    """The read arbiter's contract in Python: grants start from the requests of the cycle
    before, go to the first requester after the last owner (cyclically, the owner itself last),
    and stay while the holder asks."""

    def __init__(self, count):
        self.count, self.owner, self.holder, self.requests = count, 0, None, [0] * count

    def step(self, asking):
        if self.holder is None:
            for offset in range(1, self.count + 1):
                chosen = (self.owner + offset) % self.count
                if self.requests[chosen]:
                    self.owner = self.holder = chosen
                    break
        elif not asking[self.holder]:
            self.holder = None
        self.requests = list(asking)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_read_arbiter_grants_round_robin(count):
    """Random requests, held or dropped at random, against `RoundRobinModel`: the grants, the
    bus owner (ARID) and each client's ``contended`` every cycle."""
    dut = ReadArbiter(64, count)
    rng = random.Random(count)
    model = RoundRobinModel(count)

    async def tb(ctx):
        asking = [0] * count
        for cycle in range(400):
            grants = [ctx.get(client.gnt) for client in dut.clients]
            assert grants == [int(i == model.holder) for i in range(count)], f"cycle {cycle}"
            if model.holder is not None:
                assert ctx.get(dut.grant_id) == model.holder
            for i, client in enumerate(dut.clients):
                others = any(model.requests[j] for j in range(count) if j != i)
                assert ctx.get(client.contended) == others, f"cycle {cycle}, client {i}"
            # Mostly keep asking; a holder sometimes lets go (after its last beat).
            asking = [int(rng.random() < (0.85 if a else 0.3)) for a in asking]
            for client, a in zip(dut.clients, asking):
                ctx.set(client.req, a)
            await ctx.tick()
            model.step(asking)

    simulate(dut, tb)
