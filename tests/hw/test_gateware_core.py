"""GEMM core and tensor ALU arithmetic against numpy, in Amaranth's simulator."""

import numpy as np
import pytest
from amaranth import Cat, Elaboratable, Module

from gemforge.hw.config import AccelConfig
from gemforge.hw.gateware.alu import TensorAlu, shr_decode
from gemforge.hw.gateware.gemm import GemmCore, lanes
from gemforge.hw.gateware.testbench import simulate
from gemforge.hw.isa import AluOp

SMALL = AccelConfig(name="core-test", batch=2, block_in=4, block_out=4, inp_buffer_bytes=64,
                    wgt_buffer_bytes=256, acc_buffer_bytes=512, out_buffer_bytes=128, uop_buffer_bytes=64)
NARROW = AccelConfig(name="core-test-acc16", batch=1, block_in=4, block_out=4, acc_width=16, inp_buffer_bytes=64,
                     wgt_buffer_bytes=256, acc_buffer_bytes=256, out_buffer_bytes=128, uop_buffer_bytes=64)


def pack(values, width):
    word = 0
    for i, v in enumerate(np.asarray(values).reshape(-1)):
        word |= (int(v) & ((1 << width) - 1)) << (i * width)
    return word


def unpack(word, count, width):
    out = []
    for i in range(count):
        v = word >> (i * width) & ((1 << width) - 1)
        out.append(v - (1 << width) if v >> (width - 1) else v)
    return np.array(out, dtype=np.int64)


def wrap(values, width):
    half = 1 << (width - 1)
    return ((np.asarray(values, dtype=np.int64) + half) & ((1 << width) - 1)) - half


def test_gemm_core_dot_products():
    c = SMALL
    dut = GemmCore(c)
    rng = np.random.default_rng(1)
    cases = [(np.full((c.batch, c.block_in), -128), np.full((c.block_out, c.block_in), -128))]
    cases += [(rng.integers(-128, 128, (c.batch, c.block_in)), rng.integers(-128, 128, (c.block_out, c.block_in)))
              for _ in range(20)]

    async def tb(ctx):
        # A new pair every cycle; each pair's dot products appear LATENCY cycles later.
        expected = [wrap(x @ w.T, c.acc_width).reshape(-1) for x, w in cases]
        for cycle in range(len(cases) + GemmCore.LATENCY - 1):
            if cycle < len(cases):
                x, w = cases[cycle]
                ctx.set(dut.inp, pack(x, c.inp_width))
                ctx.set(dut.wgt, pack(w, c.wgt_width))
            await ctx.tick()
            done = cycle + 1 - GemmCore.LATENCY
            if done >= 0:
                got = unpack(ctx.get(dut.dot), c.batch * c.block_out, c.acc_width)
                np.testing.assert_array_equal(got, expected[done])

    simulate(dut, tb)


def alu_reference(op, a, b, width):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if op == AluOp.MIN:
        return np.minimum(a, b)
    if op == AluOp.MAX:
        return np.maximum(a, b)
    if op == AluOp.ADD:
        return wrap(a + b, width)
    if op == AluOp.MUL:
        return wrap(a * b, width)
    out = []
    for x, s in zip(a, b):
        if s >= 0:
            out.append(x >> min(int(s), width - 1))
        else:
            out.append(0 if -s >= width else wrap(int(x) << int(-s), width))
    return np.array(out, np.int64)


class DecodedAlu(Elaboratable):
    """`TensorAlu` with SHR's amount decoded from ``b`` in the same cycle (the pipeline
    decodes it a cycle ahead, from the operand it registers into ``b``)."""

    def __init__(self, config):
        self.config = config
        self.alu = TensorAlu(config)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.alu = alu = self.alu
        m.d.comb += alu.shr.eq(Cat(*(shr_decode(lane.as_signed(), c.acc_width)
                                     for lane in lanes(alu.b, c.batch * c.block_out, c.acc_width))))
        return m


@pytest.mark.parametrize("config", [SMALL, NARROW], ids=lambda c: f"acc{c.acc_width}")
@pytest.mark.parametrize("op", list(AluOp), ids=lambda op: op.name)
def test_tensor_alu(op, config):
    c = config
    n, w = c.batch * c.block_out, c.acc_width
    wrapper = DecodedAlu(c)
    dut = wrapper.alu
    rng = np.random.default_rng([int(op), w])
    lo, hi = -(1 << (w - 1)), 1 << (w - 1)
    edge = [lo, hi - 1, 0, -1, 1, w, -w, w - 1, -(w - 1), 40, -40, 1 << (w - 12)]
    cases = [(rng.choice(edge, n), rng.choice(edge, n)) for _ in range(10)]
    cases += [(rng.integers(lo, hi, n), rng.integers(-40, 40, n)) for _ in range(10)]
    # Every operand from -2w-2 to 2w+2 (SHR's amounts around both ends of its range) and
    # powers of two around the sign bit, against random values.
    around = np.concatenate([np.arange(-2 * w - 2, 2 * w + 3), [lo, lo + 1, hi - 1],
                             [sign * (1 << k) + d for k in range(4, w - 1) for sign in (1, -1) for d in (-1, 0, 1)]])
    cases += [(rng.integers(lo, hi, n), around[k:k + n]) for k in range(0, len(around) - n + 1, n)]

    async def tb(ctx):
        ctx.set(dut.op, int(op))
        await ctx.tick()                    # the op's decode is registered
        for a, b in cases:
            if op == AluOp.MUL:             # the product is registered: it comes a cycle later
                ctx.set(dut.mul_a, pack(a, w))
                ctx.set(dut.mul_b, pack(b, w))
                await ctx.tick()
                ctx.set(dut.mul_a, 0)
                ctx.set(dut.mul_b, 0)
                got = unpack(ctx.get(dut.product), n, w)
            else:
                ctx.set(dut.a, pack(a, w))
                ctx.set(dut.b, pack(b, w))
                ctx.set(dut.lt, sum(1 << i for i in range(n) if a[i] < b[i]))   # the pipeline's compare
                got = unpack(ctx.get(dut.result), n, w)
            np.testing.assert_array_equal(got, alu_reference(op, a, b, w), err_msg=f"a={a} b={b}")

    simulate(wrapper, tb)
