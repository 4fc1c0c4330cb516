"""The GEMM/ALU pipeline on its own (plain memories around it) against fsim's execution of
the same instruction, in Amaranth's simulator: random micro-ops that reuse accumulator entries
back to back (the forwarding path), overwriting and resetting GEMMs, every ALU op with an
immediate or an accumulator operand, and micro-ops beyond a buffer (fault, no write)."""

import dataclasses

import numpy as np
import pytest
from amaranth import Elaboratable, Module, unsigned
from amaranth.lib import memory

from gemforge.hw.config import PRESETS, AccelConfig
from gemforge.hw.gateware.pipeline import ComputePipeline
from gemforge.hw.gateware.testbench import simulate
from gemforge.hw.isa import Alu, AluOp, Gemm, Uop, encode, encode_uops
from gemforge.hw.timing import issues_at_half_rate
from gemforge.sim.fsim import Fsim

NONSQUARE = AccelConfig(name="pipeline-test", batch=2, block_in=4, block_out=2, inp_buffer_bytes=128,
                        wgt_buffer_bytes=128, acc_buffer_bytes=512, out_buffer_bytes=128, uop_buffer_bytes=128)
CONFIGS = [PRESETS["tiny"], NONSQUARE]


def entry_word(values, width):
    """An entry as the integer its memory holds: its elements in their DRAM byte layout."""
    return int.from_bytes(np.asarray(values, f"<i{width // 8}").tobytes(), "little")


def entry_values(word, shape, width):
    count = int(np.prod(shape))
    return np.frombuffer(word.to_bytes(count * width // 8, "little"), f"<i{width // 8}").astype(np.int64).reshape(shape)


class Harness(Elaboratable):
    """The pipeline with one memory per buffer; the accumulator's read ports are transparent
    to its write port, as in the accelerator."""

    def __init__(self, config, init):
        c = config
        self.pipe = ComputePipeline(c)
        widths = {"uop": c.uop_bits, "inp": c.inp_entry_bytes * 8, "wgt": c.wgt_entry_bytes * 8,
                  "acc": c.acc_entry_bytes * 8}
        self.mems = {name: memory.Memory(shape=unsigned(widths[name]), depth=len(init[name]), init=init[name])
                     for name in widths}

    def elaborate(self, platform):
        m = Module()
        m.submodules.pipe = pipe = self.pipe
        for name, mem in self.mems.items():
            m.submodules[name] = mem
        wr = self.mems["acc"].write_port()
        m.d.comb += [wr.addr.eq(pipe.wb.addr), wr.data.eq(pipe.wb.data[0]), wr.en.eq(pipe.wb.en)]
        ports = {"uop_rd": ("uop", ()), "inp_rd": ("inp", ()), "wgt_rd": ("wgt", ()),
                 "acc_rda": ("acc", (wr,)), "acc_rdb": ("acc", (wr,))}
        for name, (buffer, transparent) in ports.items():
            rd = self.mems[buffer].read_port(transparent_for=transparent)
            client = getattr(pipe, name)
            m.d.comb += [rd.addr.eq(client.addr), client.data[0].eq(rd.data)]
        return m


def random_state(c, rng):
    return {
        "inp": rng.integers(-128, 128, (c.inp_depth, c.batch, c.block_in)),
        "wgt": rng.integers(-128, 128, (c.wgt_depth, c.block_out, c.block_in)),
        "acc": rng.integers(-(1 << 20), 1 << 20, (c.acc_depth, c.batch, c.block_out)),
    }


def random_insn(c, rng, kind):
    """A GEMM or ALU instruction over few accumulator entries (so micro-ops reuse them back to
    back), and its micro-ops; ``beyond`` puts one micro-op past the accumulator."""
    n_uops = int(rng.integers(1, 6))
    acc_span = int(rng.integers(1, 4))
    uops = [Uop(dst=int(rng.integers(0, acc_span)), src=int(rng.integers(0, 4)), wgt=int(rng.integers(0, 4)))
            for _ in range(n_uops)]
    loops = dict(uop_bgn=0, uop_end=n_uops, iter_out=int(rng.integers(1, 4)), iter_in=int(rng.integers(1, 4)),
                 dst_factor_out=int(rng.integers(0, 3)), dst_factor_in=int(rng.integers(0, 2)),
                 src_factor_out=int(rng.integers(0, 3)), src_factor_in=int(rng.integers(0, 3)))
    if kind == "gemm":
        flag = rng.choice(["accumulate", "overwrite", "reset"])
        insn = Gemm(reset=flag == "reset", overwrite=flag == "overwrite", wgt_factor_out=int(rng.integers(0, 3)),
                    wgt_factor_in=int(rng.integers(0, 3)), **loops)
    else:
        op = AluOp(int(rng.integers(0, len(AluOp))))
        imm = None
        if rng.random() < 0.5:
            imm = int(rng.integers(-40, 40)) if op == AluOp.SHR else int(rng.integers(-(1 << 15), 1 << 15))
        insn = Alu(op=op, imm=imm, **loops)
    return insn, uops


def run_pipeline(c, insn, uops, state):
    uop_bytes = c.uop_bits // 8
    encoded = encode_uops(uops, c)          # the micro-op buffer's entries, as a LOAD writes them
    uop_words = [int.from_bytes(encoded[i:i + uop_bytes], "little") for i in range(0, len(encoded), uop_bytes)]
    init = {
        "uop": uop_words + [0] * (c.uop_depth - len(uops)),
        "inp": [entry_word(e, c.inp_width) for e in state["inp"]],
        "wgt": [entry_word(e, c.wgt_width) for e in state["wgt"]],
        "acc": [entry_word(e, c.acc_width) for e in state["acc"]],
    }
    dut = Harness(c, init)
    result = {}

    async def tb(ctx):
        ctx.set(dut.pipe.insn, encode(insn, c))        # held from the cycle before start
        await ctx.tick()
        ctx.set(dut.pipe.start, 1)
        await ctx.tick()
        ctx.set(dut.pipe.start, 0)
        faults, cycles = 0, 0
        while ctx.get(dut.pipe.busy):
            faults += ctx.get(dut.pipe.index_fault)
            await ctx.tick()
            cycles += 1
        for _ in range(2):                  # a fault is raised the cycle after S2, before the drain
            faults += ctx.get(dut.pipe.index_fault)
            await ctx.tick()
        result["faults"], result["cycles"] = faults, cycles
        acc = dut.mems["acc"].data
        result["acc"] = np.stack([entry_values(ctx.get(acc[i]), (c.batch, c.block_out), c.acc_width)
                                  for i in range(c.acc_depth)])

    simulate(dut, tb)
    return result


def fsim_reference(c, insn, uops, state):
    fsim = Fsim(c, np.zeros(64, np.uint8))
    fsim.inp[...], fsim.wgt[...], fsim.acc[...] = state["inp"], state["wgt"], state["acc"]
    fsim.uop[:len(uops)] = [(u.dst, u.src, u.wgt) for u in uops]
    fsim.execute(insn)
    return fsim.acc


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("kind", ["gemm", "alu"])
@pytest.mark.parametrize("seed", range(4))
def test_pipeline_equals_fsim_one_micro_op_per_cycle(config, kind, seed):
    rng = np.random.default_rng([seed, config.batch, config.block_out, kind == "gemm"])
    state = random_state(config, rng)
    insn, uops = random_insn(config, rng, kind)
    result = run_pipeline(config, insn, uops, state)
    np.testing.assert_array_equal(result["acc"], fsim_reference(config, insn, uops, state))
    issued = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
    assert result["faults"] == 0
    # One micro-op per cycle (a MUL's and a register SHR's every second cycle), then the drain of S1–S6.
    interval = 2 if issues_at_half_rate(insn) else 1
    assert result["cycles"] == (issued - 1) * interval + 7


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("operand", ["imm", "acc"])
@pytest.mark.parametrize("op", list(AluOp), ids=lambda op: op.name)
def test_back_to_back_results_see_each_other(config, operand, op):
    """Micro-ops read the entries written by the ones just before them: each forward (R6's
    into S5, the write-back's into S4 and S3) and the half rate of a MUL (its product is added
    in S6) and of a register SHR (its amount is decoded in S4) show when wrong."""
    rng = np.random.default_rng([config.block_out, operand == "imm", int(op)])
    state = random_state(config, rng)
    # Each of dst and src reads the entry written one, two and three micro-ops before (and not
    # in between): R6's forward, the write-back's into S4, and into S3's data registers.
    # Then a run into one entry (as max pooling does), with dst and src both the entry written
    # just before: each case of the compare MIN and MAX take a cycle ahead.
    pairs = [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2), (1, 0), (2, 3), (2, 1), (1, 2), (2, 0),
             (0, 3), (0, 0), (0, 1), (0, 2), (0, 0), (3, 0), (0, 3)]
    uops = [Uop(dst=d, src=s) for d, s in pairs]
    imm = None
    if operand == "imm":
        imm = int(rng.integers(-40, 40)) if op == AluOp.SHR else int(rng.integers(-(1 << 15), 1 << 15))
    insn = Alu(op=op, imm=imm, uop_bgn=0, uop_end=len(uops), iter_out=2, iter_in=3)
    result = run_pipeline(config, insn, uops, state)
    np.testing.assert_array_equal(result["acc"], fsim_reference(config, insn, uops, state))
    interval = 2 if issues_at_half_rate(insn) else 1
    assert result["cycles"] == interval * (2 * 3 * len(uops) - 1) + 7


@pytest.mark.parametrize("op", [AluOp.MIN, AluOp.MAX], ids=lambda op: op.name)
@pytest.mark.parametrize("seed", range(3))
def test_min_max_chains_compare_the_forwarded_value(op, seed):
    """MIN and MAX take their compare from a cycle ahead, where an operand forwarded from the
    micro-op before is one of that micro-op's operands: runs whose dst or src (or both) is the
    entry just written, over entries that stay distinct (a value between the previous pair's
    operands is what tells a compare of the wrong one)."""
    config = PRESETS["tiny"]
    rng = np.random.default_rng([seed, int(op)])
    state = random_state(config, rng)
    uops, dst = [], 0
    for _ in range(40):
        kind = rng.integers(0, 4)           # dst and/or src the entry just written, or neither
        src = dst if kind in (1, 2) else int(rng.integers(0, 16))
        dst = dst if kind in (0, 1) else int(rng.integers(0, 16))
        uops.append(Uop(dst=dst, src=src))
    insn = Alu(op=op, uop_bgn=0, uop_end=len(uops), iter_out=1, iter_in=1)
    result = run_pipeline(config, insn, uops, state)
    np.testing.assert_array_equal(result["acc"], fsim_reference(config, insn, uops, state))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("flag", ["accumulate", "overwrite", "reset"])
def test_back_to_back_gemms_see_each_other(config, flag):
    """GEMM micro-ops accumulating into the entries the ones one, two and three before wrote."""
    rng = np.random.default_rng([config.block_out, len(flag)])
    state = random_state(config, rng)
    # dst as the one, two and three micro-ops before wrote it
    dsts = [0, 0, 1, 0, 2, 3, 0]
    uops = [Uop(dst=d, src=int(rng.integers(0, 4)), wgt=int(rng.integers(0, 4))) for d in dsts]
    insn = Gemm(reset=flag == "reset", overwrite=flag == "overwrite", uop_bgn=0, uop_end=len(uops),
                iter_out=2, iter_in=2)
    result = run_pipeline(config, insn, uops, state)
    np.testing.assert_array_equal(result["acc"], fsim_reference(config, insn, uops, state))
    assert result["cycles"] == 2 * 2 * len(uops) - 1 + 7


def test_pipeline_reports_a_micro_op_beyond_the_accumulator_and_skips_its_write():
    c = PRESETS["tiny"]
    rng = np.random.default_rng(7)
    state = random_state(c, rng)
    uops = [Uop(dst=1, src=2, wgt=3), Uop(dst=c.acc_depth - 1, src=0, wgt=0)]
    insn = Gemm(uop_bgn=0, uop_end=2, iter_out=1, iter_in=2, dst_factor_in=1)   # dst depth-1+1: beyond
    result = run_pipeline(c, insn, uops, state)
    assert result["faults"] == 1
    # Every write within range happened as fsim does it; the one beyond (which would wrap to
    # entry 0) did not touch entry 0.
    within = dataclasses.replace(insn, iter_in=1)
    expected = fsim_reference(c, within, uops, state)
    expected[2] = fsim_reference(c, Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), [Uop(2, 2, 3)], state)[2]
    np.testing.assert_array_equal(result["acc"], expected)
