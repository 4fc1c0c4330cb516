"""`SkidBuffer` and `RegisteredStage` in Amaranth's simulator: under random producer and consumer
stalls every payload arrives once and in order; the skid buffer passes a payload through in the
very cycle the producer offers it while it is empty (no added latency), the registered stage a
cycle later at full rate; and the producer's ready is the stage's state alone."""

import random

import pytest

from gemforge.hw.gateware.skid import RegisteredStage, SkidBuffer
from gemforge.hw.gateware.testbench import simulate


@pytest.mark.parametrize("seed", range(4))
def test_skid_buffer_delivers_every_payload_in_order_without_latency(seed):
    rng = random.Random(seed)
    dut = SkidBuffer(16)
    sent = list(rng.sample(range(1 << 16), 200))
    received = []

    async def tb(ctx):
        pending = list(sent)
        for _ in range(2000):
            offer = bool(pending) and rng.random() < 0.7
            take = rng.random() < 0.6
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.payload, pending[0] if pending else 0)
            ctx.set(dut.o.ready, take)
            holding = ctx.get(dut.holding)
            assert ctx.get(dut.i.ready) == (not holding)
            if offer and not holding:
                # Passed through in the same cycle: the consumer sees this very payload.
                assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload) == pending[0]
            if ctx.get(dut.o.valid) and take:
                received.append(ctx.get(dut.o.payload))
            if offer and ctx.get(dut.i.ready):
                pending.pop(0)
            await ctx.tick()
            if not pending and not ctx.get(dut.holding):
                break
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.o.ready, 1)
        if ctx.get(dut.o.valid):
            received.append(ctx.get(dut.o.payload))
            await ctx.tick()
        assert not ctx.get(dut.o.valid)

    simulate(dut, tb)
    assert received == sent


@pytest.mark.parametrize("seed", range(4))
def test_registered_stage_delivers_every_payload_in_order_a_cycle_later_at_full_rate(seed):
    rng = random.Random(seed)
    dut = RegisteredStage(16)
    sent = list(rng.sample(range(1 << 16), 300))
    received = []

    async def tb(ctx):
        pending = list(sent)
        offered_last = None         # the payload taken in the previous cycle, if any
        for cycle in range(3000):
            # Long runs of a ready consumer and an eager producer check the full rate.
            streaming = cycle < 100
            offer = bool(pending) and (streaming or rng.random() < 0.7)
            take = streaming or rng.random() < 0.6
            ctx.set(dut.i.valid, offer)
            ctx.set(dut.i.payload, pending[0] if pending else 0)
            ctx.set(dut.o.ready, take)
            full_before = ctx.get(dut.holding) and ctx.get(dut.o.valid) and not ctx.get(dut.i.ready)
            if offered_last is not None and not full_before:
                # A payload taken last cycle with the stage free is offered now.
                assert ctx.get(dut.o.valid) and ctx.get(dut.o.payload) == offered_last
            if ctx.get(dut.o.valid) and take:
                received.append(ctx.get(dut.o.payload))
            accepted = offer and ctx.get(dut.i.ready)
            # The stage was empty or drained this cycle: what it accepts comes out next cycle.
            offered_last = pending[0] if accepted and (not ctx.get(dut.o.valid) or take) else None
            if accepted:
                pending.pop(0)
            if streaming and cycle > 2 and pending:
                assert ctx.get(dut.i.ready) and ctx.get(dut.o.valid), "the stage stalls a streaming pair"
            await ctx.tick()
            if not pending and not ctx.get(dut.holding):
                break
        assert not pending and not ctx.get(dut.holding)

    simulate(dut, tb)
    assert received == sent
