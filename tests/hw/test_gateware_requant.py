"""The store engine's requantizer (`store.requant_stage`, `store.shift_and_clamp`) against numpy,
in Amaranth's simulator: every shift amount the field holds, with and without ReLU, on the values
where saturation starts and ends and on random ones, for several accumulator and output widths.

The co-simulation tests reach the requantizer only through whole programs; this one aims at its
saturation bounds, which the gateware derives from the shift instead of comparing the shifted value.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from amaranth import Module, Signal

from gemforge.hw.gateware.store import requant_stage, requant_stage_layout, shift_and_clamp
from gemforge.hw.gateware.testbench import simulate
from gemforge.hw.isa import requant_shift_bits

# (acc_width, out_width): the configs' acc widths (16, 32) with output widths from 4 to 16 bits.
WIDTHS = [(32, 8), (16, 8), (32, 16), (16, 4)]
LANES = 4


def reference(values, shift, relu, acc_width, out_width):
    """The ISA's requantization of already-biased lanes: clamp(v >> shift), as unsigned bits."""
    low = 0 if relu else -(1 << (out_width - 1))
    out = np.clip(np.asarray(values, np.int64) >> shift, low, (1 << (out_width - 1)) - 1)
    return [int(v) & ((1 << out_width) - 1) for v in out]


def probe_values(shift, acc_width, out_width, rng):
    """Values at each edge of saturation for ``shift`` (and its neighbours), the range's ends,
    and random ones, all within acc_width bits."""
    v_min, v_max = -(1 << (acc_width - 1)), (1 << (acc_width - 1)) - 1
    low, high = -(1 << (out_width - 1)), (1 << (out_width - 1)) - 1
    edges = [low << shift, (high + 1) << shift, 0]
    values = {v_min, v_max, v_min + 1, v_max - 1, -1, 0, 1}
    for edge in edges:
        values.update(edge + d for d in (-2, -1, 0, 1))
    values.update(int(v) for v in rng.integers(v_min, v_max, 16, endpoint=True))
    return sorted(v for v in values if v_min <= v <= v_max)


@pytest.mark.parametrize("acc_width, out_width", WIDTHS)
def test_requantizer_saturates_exactly_where_numpy_does(acc_width, out_width):
    config = SimpleNamespace(acc_width=acc_width, out_width=out_width, batch=1, block_out=LANES)
    rng = np.random.default_rng(acc_width * 100 + out_width)
    m = Module()
    entry = Signal(acc_width * LANES)
    shift = Signal(requant_shift_bits(config))
    relu = Signal()
    stage = Signal(requant_stage_layout(config))
    out = Signal(out_width * LANES)
    # Registered like the store engine's stage: the bounds follow the shift a cycle later.
    m.d.sync += stage.eq(requant_stage(config, shift, relu))
    m.d.comb += out.eq(shift_and_clamp(config, entry, stage))
    mismatches = []

    async def tb(ctx):
        for amount in range(1 << len(shift)):
            for use_relu in (0, 1):
                ctx.set(shift, amount)
                ctx.set(relu, use_relu)
                await ctx.tick()
                values = probe_values(amount, acc_width, out_width, rng)
                values += [0] * (-len(values) % LANES)
                for k in range(0, len(values), LANES):
                    group = values[k:k + LANES]
                    ctx.set(entry, sum((v & ((1 << acc_width) - 1)) << (acc_width * i) for i, v in enumerate(group)))
                    got = ctx.get(out)
                    lanes = [(got >> (out_width * i)) & ((1 << out_width) - 1) for i in range(LANES)]
                    want = reference(group, amount, use_relu, acc_width, out_width)
                    if lanes != want:
                        mismatches.append((amount, use_relu, group, lanes, want))

    simulate(m, tb)
    assert not mismatches, f"{len(mismatches)} groups differ, first (shift, relu, in, got, want): {mismatches[0]}"
