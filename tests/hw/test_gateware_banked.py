# amaranth: UnusedElaboratable=no
"""Banked buffers (group writes and reads of consecutive entries) against a Python list, in
Amaranth's simulator."""

import random

import pytest

from gemforge.hw.config import PRESETS, AccelConfig
from gemforge.hw.gateware.banked import BankedMemory, GroupReadSignature, GroupWriteSignature
from gemforge.hw.microarch import buffer_lanes
from gemforge.hw.gateware.testbench import simulate

# (depth, banks, write lanes, read lanes): one bank (a plain memory), banks == depth,
# ports narrower than the banks.
GEOMETRIES = [(16, 1, 1, 1), (16, 2, 2, 2), (32, 4, 4, 4), (64, 8, 8, 8), (8, 8, 8, 8), (4, 4, 4, 2),
              (32, 8, 2, 8), (32, 8, 8, 1), (64, 16, 4, 16)]


@pytest.mark.parametrize("depth,banks,write_lanes,read_lanes", GEOMETRIES,
                         ids=[f"d{d}-b{b}-w{w}-r{r}" for d, b, w, r in GEOMETRIES])
def test_group_writes_and_reads_match_a_list(depth, banks, write_lanes, read_lanes):
    """Random group writes (any start, any count, wrapping at the depth) and, every cycle, a
    group read on a plain port and on a port transparent to the writes."""
    width = 12
    dut = BankedMemory(width=width, depth=depth, banks=banks)
    wp = dut.write_port(lanes=write_lanes)
    plain = dut.read_port(lanes=read_lanes)
    transparent = dut.read_port(lanes=read_lanes, transparent_for=(wp,))
    rng = random.Random(f"{depth}-{banks}-{write_lanes}-{read_lanes}")
    model = [0] * depth
    checked = [0]

    async def tb(ctx):
        for _ in range(400):
            en = rng.random() < 0.7
            addr, count = rng.randrange(depth), rng.randint(0 if rng.random() < 0.1 else 1, write_lanes)
            values = [rng.getrandbits(width) for _ in range(write_lanes)]
            ctx.set(wp.en, en)
            ctx.set(wp.addr, addr)
            ctx.set(wp.count, count)
            for i, v in enumerate(values):
                ctx.set(wp.data[i], v)
            # Read near the write often, so same-cycle collisions happen.
            raddr = (addr + rng.randint(-read_lanes, write_lanes)) % depth if rng.random() < 0.6 \
                else rng.randrange(depth)
            ctx.set(plain.addr, raddr)
            ctx.set(transparent.addr, raddr)
            before = list(model)
            if en:
                for i in range(count):
                    model[(addr + i) % depth] = values[i]
            await ctx.tick()
            got_plain = [ctx.get(plain.data[i]) for i in range(read_lanes)]
            got_transparent = [ctx.get(transparent.data[i]) for i in range(read_lanes)]
            assert got_plain == [before[(raddr + i) % depth] for i in range(read_lanes)]
            assert got_transparent == [model[(raddr + i) % depth] for i in range(read_lanes)]
            checked[0] += 1

    simulate(dut, tb)
    assert checked[0] == 400


def test_one_lane_port_reads_every_entry():
    """A one-lane read port of an 8-bank memory sees each entry where a group wrote it."""
    dut = BankedMemory(width=8, depth=32, banks=8)
    wp = dut.write_port(lanes=8)
    rp = dut.read_port()

    async def tb(ctx):
        ctx.set(wp.en, 1)
        for start in range(3, 35, 8):   # groups of 8 from 3, wrapping past 31
            ctx.set(wp.addr, start % 32)
            ctx.set(wp.count, 8)
            for i in range(8):
                ctx.set(wp.data[i], (start + i) % 32 + 100)
            await ctx.tick()
        ctx.set(wp.en, 0)
        for index in range(32):
            ctx.set(rp.addr, index)
            await ctx.tick()
            assert ctx.get(rp.data[0]) == index + 100

    simulate(dut, tb)


def test_port_signatures():
    dut = BankedMemory(width=16, depth=64, banks=4)
    wp = dut.write_port(lanes=4)
    rp = dut.read_port(lanes=2)
    assert wp.signature == GroupWriteSignature(16, 4, 6).flip()
    assert rp.signature == GroupReadSignature(16, 2, 6).flip()
    assert GroupWriteSignature(16, 4, 6).members["count"].init == 1
    assert dut.banks == 4 and dut.depth == 64 and dut.width == 16 and dut.addr_width == 6


def test_buffer_lanes_of_the_presets():
    tiny, default, large = PRESETS["tiny"], PRESETS["default"], PRESETS["large"]
    assert [buffer_lanes(tiny, b) for b in ("inp", "wgt", "acc", "out", "uop")] == [2, 1, 1, 2, 2]
    assert [buffer_lanes(default, b) for b in ("inp", "wgt", "acc", "out", "uop")] == [1, 1, 1, 1, 2]
    assert [buffer_lanes(large, b) for b in ("inp", "wgt", "acc", "out", "uop")] == [1, 1, 1, 1, 8]
    shallow = AccelConfig(name="shallow", batch=1, block_in=4, block_out=4, inp_buffer_bytes=8,
                          wgt_buffer_bytes=1024, acc_buffer_bytes=1024, out_buffer_bytes=256,
                          uop_buffer_bytes=512, bus_width=256)
    assert buffer_lanes(shallow, "inp") == 2      # 8 per beat, but only 2 entries deep


def test_rejects_bad_width():
    with pytest.raises(TypeError, match="Entry width must be a positive integer, not 0"):
        BankedMemory(width=0, depth=4, banks=1)


def test_rejects_bad_depth():
    with pytest.raises(TypeError, match="Depth must be a positive power of two, not 12"):
        BankedMemory(width=8, depth=12, banks=1)


def test_rejects_more_banks_than_entries():
    with pytest.raises(TypeError, match=r"no larger than the depth \(4\), not 8"):
        BankedMemory(width=8, depth=4, banks=8)


def test_rejects_bank_count_not_power_of_two():
    with pytest.raises(TypeError, match="Bank count must be a power of two"):
        BankedMemory(width=8, depth=16, banks=3)


def test_rejects_ports_wider_than_the_banks():
    dut = BankedMemory(width=8, depth=16, banks=2)
    with pytest.raises(TypeError, match=r"no larger than the bank count \(2\), not 4"):
        dut.write_port(lanes=4)
    with pytest.raises(TypeError, match=r"no larger than the bank count \(2\), not 4"):
        dut.read_port(lanes=4)


def test_rejects_transparency_to_another_memorys_port():
    memories = [BankedMemory(width=8, depth=16, banks=2) for _ in range(2)]
    other = memories[0].write_port(lanes=2)
    with pytest.raises(ValueError, match="write ports of this memory"):
        memories[1].read_port(transparent_for=(other,))
