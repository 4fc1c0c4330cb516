"""Pipelined STOREs, in Amaranth's simulator: a command's AW and W go out while the previous
command's write responses are outstanding, and a STORE's token push never comes before its
last write response.
"""

import random

import numpy as np
import pytest

from gemforge.hw.config import PRESETS
from gemforge.hw.gateware.dma_write import DmaWriter
from gemforge.hw.gateware.store import StoreEngine
from gemforge.hw.gateware.testbench import AxiWriteMemory, issue_words, simulate, stream_put, wait_until_low
from gemforge.hw.isa import MemType, Store, encode
from gemforge.hw.timing import timing_of

from test_gateware_dma import put_groups, random_commands, wait_idle, write_plan


def write_log(bus, log):
    """A process recording (cycle, "aw" | "w" | "b") for every AW, W and B handshake of ``bus``."""
    async def process(ctx):
        cycle = 0
        async for _clk, _rst, awvalid, awready, wvalid, wready, bvalid, bready in ctx.tick().sample(
                bus.awvalid, bus.awready, bus.wvalid, bus.wready, bus.bvalid, bus.bready):
            for kind, fired in (("aw", awvalid and awready), ("w", wvalid and wready), ("b", bvalid and bready)):
                if fired:
                    log.append((cycle, kind))
            cycle += 1
    return process


def pulse_log(signal, log):
    async def process(ctx):
        cycle = 0
        async for _clk, _rst, value in ctx.tick().sample(signal):
            if value:
                log.append(cycle)
            cycle += 1
    return process


@pytest.mark.parametrize("entry,bus,lanes", [(16, 8, None), (8, 8, None), (4, 8, None), (4, 32, 2), (1, 8, 1)],
                         ids=["wide", "beat", "narrow", "narrow-l2", "bytes-l1"])
@pytest.mark.parametrize("stall,b_latency", [(0.0, 0), (0.4, 0), (0.3, 12)])
def test_writer_chained_commands_and_done(entry, bus, lanes, stall, b_latency):
    """Commands offered back to back (no wait for the responses) under random backpressure
    and slow responses: DRAM ends as written in order, ``done`` pulses once per command, each
    in the cycle of its command's last response."""
    dut = DmaWriter(entry, bus, lanes, responses=4)
    k = max(1, bus // entry)
    rng = random.Random(f"wchain-{entry}-{bus}-{lanes}-{stall}-{b_latency}")
    commands = random_commands(rng, k, count=8)
    dram = bytearray(np.random.default_rng(3).integers(0, 256, 8192, dtype=np.uint8).tobytes())
    plan, expected = write_plan(commands, entry, bus, lanes, rng, dram)
    mem = AxiWriteMemory(dut.bus, dram, bus, stall=stall, seed=4, b_latency=b_latency)
    log, dones = [], []

    async def tb(ctx):
        for cmd, groups in plan:
            await stream_put(ctx, dut.cmd, cmd)
            await put_groups(ctx, dut.inp, groups, rng, stall)
        await wait_idle(ctx, dut, cycles=5000)

    simulate(dut, tb, processes=[mem.run, write_log(dut.bus, log), pulse_log(dut.done, dones)])
    assert dram == expected
    b_cycles = [c for c, kind in log if kind == "b"]
    assert len(b_cycles) == len(mem.writes)
    assert len(dones) == len(commands)
    assert set(dones) <= set(b_cycles)
    assert dones[-1] == b_cycles[-1]


def test_writer_overlaps_next_command_with_responses():
    """With slow write responses, the second command's AW and W go out before the first's
    response, and its data follows the first's without a gap."""
    entry, bus = 16, 8
    dut = DmaWriter(entry, bus)
    rng = random.Random(0)
    commands = [dict(base=0, y_size=1, x_size=4, x_stride=4), dict(base=64, y_size=1, x_size=4, x_stride=4)]
    dram = bytearray(4096)
    plan, expected = write_plan(commands, entry, bus, None, rng, dram)
    mem = AxiWriteMemory(dut.bus, dram, bus, b_latency=20)
    log, dones = [], []

    async def feed(ctx):
        for _cmd, groups in plan:
            for group in groups:
                await stream_put(ctx, dut.inp, dict(entries=group, count=len(group)))

    async def tb(ctx):
        for cmd, _groups in plan:
            await stream_put(ctx, dut.cmd, cmd)
        await wait_idle(ctx, dut)

    simulate(dut, tb, processes=[mem.run, feed, write_log(dut.bus, log), pulse_log(dut.done, dones)])
    assert dram == expected
    aws = [c for c, kind in log if kind == "aw"]
    ws = [c for c, kind in log if kind == "w"]
    bs = [c for c, kind in log if kind == "b"]
    assert len(aws) == 2 and len(bs) == 2 and len(ws) == 16
    assert aws[1] < bs[0] and ws[-1] < bs[0], "the second command waited for the first's response"
    assert dones == bs


def _store_engine_run(config, insns, sram, stall, b_latency, seed, can_push_rate=1.0):
    """Run `StoreEngine` on STOREs over emulated SRAM read ports (``sram``: name → list of
    entries); returns (DRAM, event log)."""
    dut = StoreEngine(config)
    rng = random.Random(seed)
    dram = bytearray(8192)
    mem = AxiWriteMemory(dut.bus, dram, config.bus_bytes, stall=stall, seed=seed, b_latency=b_latency)
    events = []
    finished = []

    async def tb(ctx):
        ctx.set(dut.prev_pop.can_pop, 1)
        await issue_words(ctx, dut.cmd, [encode(insn, config) for insn in insns])
        if await wait_until_low(ctx, dut.busy):
            finished.append(True)

    async def tokens(ctx):
        while True:
            ctx.set(dut.prev_push.can_push, int(rng.random() < can_push_rate))
            await ctx.tick()

    def sram_port(name):
        port = getattr(dut, f"{name}_rd")
        entries = sram[name]

        async def process(ctx):
            async for _clk, _rst, addr in ctx.tick().sample(port.addr):
                for i in range(len(port.data)):
                    ctx.set(port.data[i], entries[(addr + i) % len(entries)])
        return process

    async def monitor(ctx):
        cycle = 0
        async for _clk, _rst, push, can_push, retire, bvalid, bready in ctx.tick().sample(
                dut.prev_push.push, dut.prev_push.can_push, dut.retire, dut.bus.bvalid, dut.bus.bready):
            if push:
                assert can_push, "pushed into a full queue"
                events.append((cycle, "push"))
            if retire:
                events.append((cycle, "retire"))
            if bvalid and bready:
                events.append((cycle, "b"))
            cycle += 1

    simulate(dut, tb, processes=[mem.run, tokens, sram_port("out"), sram_port("acc"), monitor])
    assert finished, "the engine did not finish"
    return dram, mem, events


def _expected_dram(config, insns, sram):
    dram = bytearray(8192)
    for insn in insns:
        name = "acc" if insn.mem == MemType.ACC else "out"
        entry, entries = config.entry_bytes(name), sram[name]
        for y in range(insn.y_size):
            for x in range(insn.x_size):
                e = insn.dram_base + y * insn.x_stride + x
                value = entries[(insn.sram_base + y * insn.x_size + x) % len(entries)]
                dram[e * entry:(e + 1) * entry] = value.to_bytes(entry, "little")
    return dram


@pytest.mark.parametrize("stall,b_latency,can_push_rate", [(0.0, 0, 1.0), (0.3, 6, 1.0), (0.3, 15, 0.4)],
                         ids=["free", "stall-slow-b", "stall-slow-b-token-stall"])
def test_store_engine_pushes_after_last_response(stall, b_latency, can_push_rate):
    """Random STOREs from both buffers (rows overlapping in DRAM; fetch never dispatches one of
    zero size, see `InsnChecker`): DRAM ends
    as written in program order; every STORE retires once, in order, never before the write
    response that completes it."""
    config = PRESETS["tiny"]
    rng = random.Random(f"store-{stall}-{b_latency}-{can_push_rate}")
    sram = {name: [rng.getrandbits(config.entry_bytes(name) * 8) for _ in range(64)] for name in ("out", "acc")}
    insns = []
    for i in range(14):
        mem = rng.choice([MemType.OUT, MemType.OUT, MemType.ACC])
        x_size = rng.randint(1, 6)
        insns.append(Store(mem=mem, sram_base=rng.randrange(40), dram_base=rng.randrange(0, 40),
                           y_size=rng.randint(1, 2), x_size=x_size,
                           x_stride=x_size + rng.randrange(0, 3),
                           pop_prev=rng.random() < 0.5, push_prev=rng.random() < 0.6))
    dram, mem, events = _store_engine_run(config, insns, sram, stall, b_latency, seed=9, can_push_rate=can_push_rate)
    assert dram == _expected_dram(config, insns, sram)
    retires = [c for c, kind in events if kind == "retire"]
    pushes = [c for c, kind in events if kind == "push"]
    b_cycles = [c for c, kind in events if kind == "b"]
    assert len(retires) == len(insns) and len(b_cycles) == len(mem.writes)
    assert pushes == [r for insn, r in zip(insns, retires) if insn.push_prev]
    # STORE k completes with the response of its last burst: count bursts per STORE in order.
    bursts = 0
    for insn, retire in zip(insns, retires):
        bursts += _bursts(config, insn)
        if bursts:
            assert retire > b_cycles[bursts - 1], "retired before its last write response"


def _bursts(config, insn):
    """Bursts of one STORE (tiny's rows are short: one burst per row)."""
    if insn.y_size == 0 or insn.x_size == 0:
        return 0
    return insn.y_size


def test_store_engine_overlaps_consecutive_stores():
    """Back-to-back short STOREs with slow responses: each STORE's first AW goes out before
    the previous STORE's write response, and the W beats of the stream come nearly back to back."""
    config = PRESETS["tiny"]
    count, x = 6, 8
    sram = {name: list(range(1, 65)) for name in ("out", "acc")}
    insns = [Store(mem=MemType.OUT, sram_base=8 * i, dram_base=16 * i, y_size=1, x_size=x, x_stride=x,
                   push_prev=True) for i in range(count)]
    dram, mem, events = _store_engine_run(config, insns, sram, 0.0, 10, seed=1)
    assert dram == _expected_dram(config, insns, sram)
    b_cycles = [c for c, kind in events if kind == "b"]
    retires = [c for c, kind in events if kind == "retire"]
    assert len(b_cycles) == count and len(retires) == count
    # All six STOREs' responses arrive within a few cycles per STORE after the first:
    # without overlap each STORE would add the 10-cycle response latency.
    # (A STORE is launched once the one before has issued its reads: a beat's worth of entries
    # each cycle, and its first W beat `Timing.store_issue` cycles after its launch.)
    beats = x * config.out_entry_bytes // config.bus_bytes
    assert b_cycles[-1] - b_cycles[0] <= (count - 1) * (beats + timing_of(config).store_issue)


def test_writer_refuses_bad_response_count():
    with pytest.raises(TypeError, match="Outstanding responses must be a positive integer, not 0"):
        DmaWriter(4, 8, responses=0)
