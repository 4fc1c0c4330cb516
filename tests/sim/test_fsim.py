"""fsim against the independent reference model, instruction by instruction,
plus the engine/token semantics, error reporting and counters."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from gemforge.hw.config import PRESETS, AccelConfig
from gemforge.hw.isa import Alu, AluOp, Finish, Gemm, Load, MemType, Store, Uop, encode_program, encode_uops
from gemforge.hw.regmap import Fault
from gemforge.sim import alu_batching, fsim
from gemforge.sim.fsim import DeadlockError, Fsim, FsimError, OutOfBoundsError
from gemforge.sim.trace import traced_fsim

from reference import ADDRESS_TOP, AddressSpaceFault, ReferenceModel, wrap

#: Presets plus design points that stress other shapes and widths.
CONFIGS = {
    **PRESETS,
    "nonsquare": AccelConfig(name="nonsquare", batch=2, block_in=8, block_out=16,
                             inp_buffer_bytes=4096, wgt_buffer_bytes=16384, acc_buffer_bytes=32768,
                             out_buffer_bytes=8192, uop_buffer_bytes=4096),
    "wide": AccelConfig(name="wide", batch=2, block_in=4, block_out=8, inp_width=16, wgt_width=16,
                        acc_width=32, out_width=16, inp_buffer_bytes=2048, wgt_buffer_bytes=4096,
                        acc_buffer_bytes=8192, out_buffer_bytes=4096, uop_buffer_bytes=1024),
    "acc16": AccelConfig(name="acc16", batch=1, block_in=8, block_out=8, acc_width=16, out_width=8,
                         inp_buffer_bytes=1024, wgt_buffer_bytes=4096, acc_buffer_bytes=2048,
                         out_buffer_bytes=1024, uop_buffer_bytes=1024),
}
DRAM_BYTES = 1 << 18


def make_pair(config: AccelConfig, seed: int) -> tuple[Fsim, ReferenceModel, np.random.Generator]:
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, DRAM_BYTES, dtype=np.uint8)
    sim = Fsim(config, dram.copy())
    ref = ReferenceModel(config, dram)
    return sim, ref, rng


def random_state(sim: Fsim, ref: ReferenceModel, rng: np.random.Generator, uop_limits=None) -> None:
    """Fill every buffer of both models with the same random contents."""
    c = sim.config
    for name, width in (("inp", c.inp_width), ("wgt", c.wgt_width), ("acc", c.acc_width)):
        buf = getattr(sim, name)
        values = rng.integers(-(1 << (width - 1)), 1 << (width - 1), buf.shape, dtype=np.int64)
        if name == "acc":
            sim._write_acc(slice(None), values)
            for i in range(values.shape[0]):
                ref.write_acc(i, values[i].tolist())
        else:
            buf[...] = values
            ref.sram[name] = values.tolist()
    limits = uop_limits or (c.acc_depth, max(c.inp_depth, c.acc_depth), c.wgt_depth)
    uops = np.stack([rng.integers(0, lim, c.uop_depth) for lim in limits], axis=1)
    sim.uop[...] = uops
    ref.uop = [tuple(int(v) for v in row) for row in uops]


def set_acc(sim: Fsim, ref: ReferenceModel, values: np.ndarray) -> None:
    """Give both models the same accumulator (and its output mirror)."""
    sim._write_acc(slice(None), values)
    ref.sram["acc"] = values.tolist()
    ref.sram["out"] = wrap(values, sim.config.out_width).tolist()


def set_uops(sim: Fsim, ref: ReferenceModel, bgn: int, uops: np.ndarray) -> None:
    sim.uop[bgn:bgn + len(uops)] = uops
    for k, row in enumerate(uops):
        ref.uop[bgn + k] = tuple(int(v) for v in row)


def assert_same_state(sim: Fsim, ref: ReferenceModel) -> None:
    for name in ("inp", "wgt", "acc", "out"):
        np.testing.assert_array_equal(getattr(sim, name).astype(np.int64), ref.buffer(name), err_msg=name)
    np.testing.assert_array_equal(sim.uop, ref.buffer("uop"))
    assert sim.dram.tobytes() == bytes(ref.dram)


# ---------------------------------------------------------------------------- DMA

@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("mem", [MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP])
def test_load_matches_reference(config_name, mem):
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=hash((config_name, mem)) % 2**32)
    random_state(sim, ref, rng)
    depth = config.depth(mem.buffer)
    entry = config.entry_bytes(mem.buffer)
    for _ in range(12):
        y, x = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        pads = [0] * 4 if mem == MemType.UOP else [int(v) for v in rng.integers(0, 4, 4)]
        # Strides below x_size (overlapping or repeated rows) are legal for loads.
        stride = int(rng.integers(0, x + 4))
        total = (y + pads[0] + pads[1]) * (x + pads[2] + pads[3])
        if total > depth:
            continue
        span = (y - 1) * stride + x
        insn = Load(mem=mem, sram_base=int(rng.integers(0, depth - total + 1)),
                    dram_base=int(rng.integers(0, DRAM_BYTES // entry - span)),
                    y_size=y, x_size=x, x_stride=stride,
                    y_pad0=pads[0], y_pad1=pads[1], x_pad0=pads[2], x_pad1=pads[3])
        sim.execute(insn)
        ref.execute(insn)
        assert_same_state(sim, ref)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("mem", [MemType.OUT, MemType.ACC])
def test_store_matches_reference(config_name, mem):
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=7 + int(mem))
    random_state(sim, ref, rng)
    depth = config.depth(mem.buffer)
    entry = config.entry_bytes(mem.buffer)
    for _ in range(12):
        y, x = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        stride = int(rng.integers(0, x + 4))  # overlapping rows: later rows win
        span = (y - 1) * stride + x
        requant, entry = {}, config.entry_bytes(mem.buffer)
        if mem == MemType.ACC and rng.random() < 0.6:
            requant = dict(requant=True, shift=int(rng.integers(0, config.acc_width)), relu=bool(rng.random() < 0.5))
            if rng.random() < 0.7:
                per_row = bool(rng.random() < 0.5)
                requant.update(bias=True, bias_per_row=per_row,
                               bias_base=int(rng.integers(0, config.acc_depth - (y if per_row else 1) + 1)))
            entry = config.out_entry_bytes
        insn = Store(mem=mem, sram_base=int(rng.integers(0, depth - y * x + 1)),
                     dram_base=int(rng.integers(0, DRAM_BYTES // entry - span)),
                     y_size=y, x_size=x, x_stride=stride, **requant)
        sim.execute(insn)
        ref.execute(insn)
        assert_same_state(sim, ref)


@pytest.mark.parametrize("config_name", CONFIGS)
def test_dram_tiles_past_the_address_top_are_refused_as_the_reference_says(config_name):
    """A LOAD or STORE whose DRAM tile touches byte 2^32 or beyond is refused at dispatch with
    `Fault.DRAM_RANGE` exactly when the reference model, walking the tile byte by byte, finds
    such a byte; tiles are drawn to end around the top (in entries of the buffer their DRAM
    side moves: a requantizing STORE's are output entries)."""
    config = CONFIGS[config_name]
    ref = ReferenceModel(config, np.zeros(8, np.uint8))
    rng = np.random.default_rng(len(config_name))
    outcomes = set()
    for _ in range(150):
        y, x = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        stride = int(rng.choice([0, x, x + int(rng.integers(1, 1000))]))
        if rng.random() < 0.5:
            mem = MemType(int(rng.choice([MemType.INP, MemType.WGT, MemType.ACC, MemType.UOP])))
            kind, extra, buffer = Load, {}, mem.buffer
        else:
            mem = MemType(int(rng.choice([MemType.OUT, MemType.ACC])))
            requant = mem == MemType.ACC and rng.random() < 0.5
            kind, extra, buffer = Store, {"requant": requant}, "out" if requant else mem.buffer
        end_entry = ADDRESS_TOP // config.entry_bytes(buffer) + int(rng.integers(-2, 3))
        dram_base = min(max(0, end_entry - (y - 1) * stride - x), (1 << 32) - 1)
        insn = kind(mem=mem, sram_base=0, dram_base=dram_base, y_size=y, x_size=x, x_stride=stride, **extra)
        refused = any(b >= ADDRESS_TOP for b in ref.dram_bytes(insn))
        try:
            fsim.check_dispatch([insn, Finish()], config)
            fault = Fault.NONE
        except FsimError as exc:
            fault = exc.fault
        assert fault == (Fault.DRAM_RANGE if refused else Fault.NONE), insn
        outcomes.add(fault)
    assert outcomes == {Fault.NONE, Fault.DRAM_RANGE}


def test_store_past_the_address_top_writes_nothing():
    """The store the hardware once wrapped to DRAM byte 0: fsim and the reference refuse it
    before writing anything."""
    config = CONFIGS["tiny"]
    entry = config.out_entry_bytes
    store = Store(mem=MemType.OUT, sram_base=0, dram_base=ADDRESS_TOP // entry - 1, y_size=1, x_size=2, x_stride=2)
    dram = np.zeros(4096, np.uint8)
    stream = np.frombuffer(encode_program([store, Finish()], config), np.uint8)
    dram[1024:1024 + stream.size] = stream
    sim = Fsim(config, dram)
    sim.out[...] = 7
    with pytest.raises(OutOfBoundsError) as err:
        sim.run(1024, 2)
    assert err.value.fault == Fault.DRAM_RANGE and "past the 0x100000000-byte address space" in str(err.value)
    assert not dram[:1024].any() and sim.counters["store_insns"] == 0
    ref = ReferenceModel(config, np.zeros(64, np.uint8))
    with pytest.raises(AddressSpaceFault):
        ref.execute(store)
    assert not any(ref.dram)


def test_program_past_the_address_top_is_refused_before_fetching():
    config = CONFIGS["tiny"]
    size = len(encode_program([Finish()], config))
    with pytest.raises(OutOfBoundsError) as err:
        Fsim(config, np.zeros(64, np.uint8)).run(ADDRESS_TOP - size, 2)
    assert err.value.fault == Fault.PROGRAM_RANGE
    with pytest.raises(OutOfBoundsError) as err:          # ends at the top: beyond this DRAM only
        Fsim(config, np.zeros(64, np.uint8)).run(ADDRESS_TOP - size, 1)
    assert err.value.fault == Fault.BUS_ERROR


def test_load_padding_layout_explicit():
    """All four paddings, checked against a hand-written expectation."""
    config = PRESETS["tiny"]  # inp entries are 1x4 int8
    dram = np.zeros(DRAM_BYTES, np.uint8)
    dram[:4 * 6] = np.arange(1, 25, dtype=np.uint8)  # entries 0..5 hold 1..24
    sim = Fsim(config, dram)
    sim.execute(Load(mem=MemType.INP, sram_base=3, dram_base=1, y_size=2, x_size=2, x_stride=3,
                     y_pad0=1, y_pad1=2, x_pad0=1, x_pad1=1))
    pitch, rows = 4, 5
    got = sim.inp[3:3 + pitch * rows, 0].reshape(rows, pitch, 4)
    expect = np.zeros((rows, pitch, 4), np.int8)
    entries = np.arange(1, 25).reshape(6, 4)
    expect[1, 1:3] = entries[[1, 2]]
    expect[2, 1:3] = entries[[4, 5]]
    np.testing.assert_array_equal(got, expect)
    assert not sim.inp[:3].any() and not sim.inp[3 + pitch * rows:].any()


def test_acc_load_mirrors_low_bits_to_output():
    config = PRESETS["tiny"]
    dram = np.zeros(DRAM_BYTES, np.uint8)
    values = np.array([[0x12345678, -1, 0x80, -129]], dtype="<i4")
    dram[:16] = values.view(np.uint8).reshape(-1)
    sim = Fsim(config, dram)
    sim.execute(Load(mem=MemType.ACC, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1))
    np.testing.assert_array_equal(sim.acc[0], values)
    np.testing.assert_array_equal(sim.out[0], [[0x78, -1, -128, 127]])


# ---------------------------------------------------------------------------- GEMM

def _random_loop(rng, config, depth_limits, uop_count):
    """A random loop nest whose indices stay inside half of each buffer."""
    io, ii = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    factors = {}
    for name, depth in depth_limits.items():
        span = depth // 2
        fo = int(rng.integers(0, max(1, span // max(1, io * 2))))
        fi = int(rng.integers(0, max(1, span // max(1, ii * 2 * max(1, io)))))
        factors[f"{name}_factor_out"], factors[f"{name}_factor_in"] = fo, fi
    bgn = int(rng.integers(0, config.uop_depth - uop_count))
    return dict(uop_bgn=bgn, uop_end=bgn + uop_count, iter_out=io, iter_in=ii, **factors)


@pytest.mark.parametrize("config_name", CONFIGS)
def test_gemm_matches_reference(config_name):
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=11)
    half = (config.acc_depth // 2, config.inp_depth // 2, config.wgt_depth // 2)
    random_state(sim, ref, rng, uop_limits=half)
    for trial in range(8):
        loop = _random_loop(rng, config, {"dst": config.acc_depth, "src": config.inp_depth,
                                          "wgt": config.wgt_depth}, int(rng.integers(1, 6)))
        insn = Gemm(reset=trial % 4 == 3, overwrite=trial % 3 == 1, **loop)
        sim.execute(insn)
        ref.execute(insn)
        assert_same_state(sim, ref)


def test_gemm_accumulates_repeated_destination_in_order():
    """Many micro-ops into one accumulator entry (a K reduction), with wrap-around."""
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(DRAM_BYTES, np.uint8))
    sim.inp[:] = 127
    sim.wgt[:] = 127
    sim._write_acc(slice(None), np.full(sim.acc.shape, 2**31 - 10, np.int64))
    sim.uop[:4] = [[5, k, k] for k in range(4)]
    sim.execute(Gemm(uop_bgn=0, uop_end=4, iter_out=2, iter_in=3))
    total = (2**31 - 10) + 4 * 2 * 3 * 4 * 127 * 127
    assert (sim.acc[5] == wrap(total, 32)).all()
    assert (sim.out[5] == wrap(total, 8)).all()
    assert sim.counters["gemm_uops"] == 24 and sim.counters["macs"] == 24 * 16


@pytest.mark.parametrize("config_name", ["tiny", "acc16", "nonsquare"])
@pytest.mark.parametrize("mode", ["accumulate", "overwrite", "reset"])
def test_gemm_in_small_chunks_matches_reference(config_name, mode):
    """fsim's GEMM, run in chunks of 5 micro-ops (each chunk's index arrays built on its own,
    repeated loop levels collapsed into multiples), equals the reference's loop on micro-ops
    whose destinations repeat within and across chunks."""
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=len(mode))
    sim._chunk_uops = 5
    for trial in range(6):
        random_state(sim, ref, rng, uop_limits=(4, 4, 4))
        factors = {f"{f}_factor_{level}": int(rng.choice([0, 0, 1])) for f in ("dst", "src", "wgt")
                   for level in ("out", "in")}
        bgn = int(rng.integers(0, config.uop_depth - 4))
        insn = Gemm(reset=mode == "reset", overwrite=mode == "overwrite", uop_bgn=bgn,
                    uop_end=bgn + int(rng.integers(1, 4)), iter_out=int(rng.integers(1, 7)),
                    iter_in=int(rng.integers(1, 7)), **factors)
        sim.execute(insn)
        ref.execute(insn)
        assert_same_state(sim, ref)


def test_gemm_long_repeated_loop_is_a_multiple():
    """2^28 accumulating micro-ops into one entry need no 2^28-long index arrays (6 GB) and run
    in a moment: the repeated loop levels are one chunk's sums times their count (wrapped)."""
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(4096, np.uint8))
    sim.inp[1] = np.arange(4).reshape(1, 4) - 2
    sim.wgt[2] = np.arange(16).reshape(4, 4) - 8
    sim.uop[0] = [3, 1, 2]
    n = 16383 * 16383
    start = time.perf_counter()
    sim.execute(Gemm(uop_bgn=0, uop_end=1, iter_out=16383, iter_in=16383))
    assert time.perf_counter() - start < 5
    product = (sim.inp[1].astype(np.int64) @ sim.wgt[2].astype(np.int64).T)[0]
    assert sim.acc[3, 0].tolist() == [wrap(n * int(p), 32) for p in product]
    assert sim.counters["gemm_uops"] == n and sim.counters["macs"] == n * config.macs_per_uop


def test_gemm_overwrite_starts_a_reduction_and_keeps_the_last_product():
    """overwrite: the product replaces the entry; a destination repeated in one overwriting
    GEMM keeps its last micro-op's product (micro-ops run in order)."""
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(DRAM_BYTES, np.uint8))
    sim.inp[:] = np.arange(config.inp_depth)[:, None, None] % 7 - 3
    sim.wgt[:] = 2
    sim._write_acc(slice(None), np.full(sim.acc.shape, 12345, np.int64))
    sim.uop[:3] = [[5, 1, 0], [6, 2, 0], [6, 3, 0]]
    sim.execute(Gemm(overwrite=True, uop_bgn=0, uop_end=3, iter_out=1, iter_in=1))
    k = config.block_in
    assert (sim.acc[5] == (1 % 7 - 3) * 2 * k).all()
    assert (sim.acc[6] == (3 % 7 - 3) * 2 * k).all()
    assert (sim.acc[7] == 12345).all()


def test_requantizing_store_documented_values():
    """clip(acc >> shift, clip_lo, clip_hi) as int8, DRAM addressed in output entries."""
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(DRAM_BYTES, np.uint8))
    values = np.array([-70000, -300, -1, 0, 255, 256, 40000, 2**31 - 1], np.int64)
    sim._write_acc(slice(0, 2), values.reshape(2, 1, 4))
    sim.execute(Store(mem=MemType.ACC, sram_base=0, dram_base=3, y_size=1, x_size=2, x_stride=2,
                      requant=True, shift=8, relu=True))
    got = sim.dram[3 * config.out_entry_bytes:5 * config.out_entry_bytes].view(np.int8)
    assert got.tolist() == [0, 0, 0, 0, 0, 1, 127, 127]
    assert sim.counters["store_bytes_out"] == 2 * config.out_entry_bytes
    # A bias per row (acc[10 + y]), no ReLU: the int8 range is the clamp.
    sim._write_acc(slice(10, 12), np.array([[[256] * 4], [[-512] * 4]], np.int64))
    sim.execute(Store(mem=MemType.ACC, sram_base=0, dram_base=8, y_size=2, x_size=1, x_stride=1,
                      requant=True, shift=8, bias=True, bias_per_row=True, bias_base=10))
    got = sim.dram[8 * config.out_entry_bytes:10 * config.out_entry_bytes].view(np.int8)
    assert got.tolist() == [-128, -1, 0, 1, -2, -1, 127, 127]
    with pytest.raises(OutOfBoundsError, match="bias from acc entries 255..256"):
        sim.execute(Store(mem=MemType.ACC, sram_base=0, dram_base=8, y_size=2, x_size=1, x_stride=1,
                          requant=True, bias=True, bias_per_row=True, bias_base=255))


# ---------------------------------------------------------------------------- ALU

@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("use_imm", [False, True])
def test_alu_matches_reference(config_name, op, use_imm):
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=int(op) * 2 + use_imm)
    half = (config.acc_depth // 2, config.acc_depth // 2, 1)
    random_state(sim, ref, rng, uop_limits=half)
    if op == AluOp.SHR:  # keep shift amounts in an interesting range, both signs
        amounts = rng.integers(-40, 40, sim.acc.shape)
        sim._write_acc(slice(None), amounts)
        for i in range(amounts.shape[0]):
            ref.write_acc(i, amounts[i].tolist())
    for _ in range(6):
        loop = _random_loop(rng, config, {"dst": config.acc_depth, "src": config.acc_depth},
                            int(rng.integers(1, 5)))
        imm = int(rng.integers(-2**15, 2**15)) if use_imm else None
        if use_imm and op == AluOp.SHR:
            imm = int(rng.choice([0, 1, 3, -2, 31, 32, 33, -31, -32, -40, 64]))
        insn = Alu(op=op, imm=imm, **loop)
        sim.execute(insn)
        ref.execute(insn)
        assert_same_state(sim, ref)


EDGE = [-2**31, -2**31 + 1, -129, -128, -1, 0, 1, 127, 128, 2**31 - 1]


@pytest.mark.parametrize("op", list(AluOp))
def test_alu_edge_values_register_operand(op):
    """Every pair of edge values, through the register operand, against Python integers."""
    config = PRESETS["tiny"]  # 1x4 accumulators
    sim = Fsim(config, np.zeros(DRAM_BYTES, np.uint8))
    pairs = [(a, b) for a in EDGE for b in EDGE + [-33, -32, -31, 31, 32, 33]]
    n = len(pairs)
    a_vals = np.array([p[0] for p in pairs], np.int64)
    b_vals = np.array([p[1] for p in pairs], np.int64)
    # Lay pairs out so entry 2t holds a's and entry 2t+1 holds b's (4 lanes each).
    lanes = 4
    entries = -(-n // lanes)
    acc = np.zeros((2 * entries, 1, lanes), np.int64)
    padded_a = np.zeros(entries * lanes, np.int64)
    padded_b = np.zeros(entries * lanes, np.int64)
    padded_a[:n], padded_b[:n] = a_vals, b_vals
    acc[0::2, 0, :] = padded_a.reshape(entries, lanes)
    acc[1::2, 0, :] = padded_b.reshape(entries, lanes)
    sim._write_acc(slice(0, 2 * entries), acc)
    sim.uop[0] = [0, 1, 0]
    sim.execute(Alu(op=op, uop_bgn=0, uop_end=1, iter_out=entries, iter_in=1,
                    dst_factor_out=2, src_factor_out=2))
    ref = ReferenceModel(config, np.zeros(8, np.uint8))
    expect = [ref.alu_scalar(op, a, b) for a, b in pairs]
    got = sim.acc[0:2 * entries:2, 0, :].reshape(-1)[:n]
    assert got.tolist() == expect
    assert sim.out[0:2 * entries:2, 0, :].reshape(-1)[:n].tolist() == [wrap(v, 8) for v in expect]


def test_alu_shift_semantics_documented_cases():
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(DRAM_BYTES, np.uint8))
    cases = [  # (value, amount, expected)
        (-8, 1, -4), (-1, 31, -1), (-5, 32, -1), (5, 32, 0), (5, 100, 0), (-5, 0, -5),
        (3, -1, 6), (1, -31, -2**31), (1, -32, 0), (-1, -40, 0), (0x40000000, -1, -2**31),
    ]
    for value, amount, expected in cases:
        sim._write_acc(slice(0, 1), np.full((1, 1, 4), value, np.int64))
        sim.uop[0] = [0, 0, 0]
        sim.execute(Alu(op=AluOp.SHR, imm=amount, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1))
        assert (sim.acc[0] == expected).all(), (value, amount)


def test_alu_in_order_semantics_with_overlapping_indices():
    """A running prefix sum: each micro-op reads the previous one's result."""
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(DRAM_BYTES, np.uint8))
    sim._write_acc(slice(0, 8), np.arange(8, dtype=np.int64)[:, None, None] * np.ones((1, 1, 4), np.int64))
    sim.uop[0] = [1, 0, 0]  # acc[1 + i] += acc[0 + i]
    sim.execute(Alu(op=AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=7, iter_in=1,
                    dst_factor_out=1, src_factor_out=1))
    assert sim.acc[:8, 0, 0].tolist() == [0, 1, 3, 6, 10, 15, 21, 28]
    # Repeated destination with an immediate: applied once per micro-op.
    sim.uop[1] = [9, 0, 0]
    sim._write_acc(slice(9, 10), np.zeros((1, 1, 4), np.int64))
    sim.execute(Alu(op=AluOp.ADD, imm=5, uop_bgn=1, uop_end=2, iter_out=3, iter_in=2))
    assert (sim.acc[9] == 30).all()


def _aliased_alu(rng, config, op, use_imm, entries):
    """A random ALU instruction whose micro-ops crowd into ``entries`` accumulator entries:
    destinations repeat, sources read entries written earlier (and later), runs of one micro-op
    repeat, so every batching rule of fsim's in-order ALU is exercised."""
    uop_count = int(rng.integers(1, 5))
    io, ii = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    factors = {f"{name}_factor_{level}": int(rng.choice([0, 0, 1, 2]))
               for name in ("dst", "src") for level in ("out", "in")}
    bgn = int(rng.integers(0, config.uop_depth - uop_count))
    limit = max(1, entries - (io - 1) * max(factors["dst_factor_out"], factors["src_factor_out"])
                - (ii - 1) * max(factors["dst_factor_in"], factors["src_factor_in"]))
    uops = rng.integers(0, limit, (uop_count, 3))
    if rng.random() < 0.3:
        uops[:, 1] = uops[:, 0]                     # acc[d] = op(acc[d], acc[d])
    imm = None
    if use_imm:
        imm = int(rng.choice([0, 1, 3, -2, 31, 33, -31, -40])) if op == AluOp.SHR else int(rng.integers(-2**15, 2**15))
    return uops, Alu(op=op, imm=imm, uop_bgn=bgn, uop_end=bgn + uop_count, iter_out=io, iter_in=ii, **factors)


@pytest.mark.parametrize("config_name", ["tiny", "acc16", "nonsquare"])
@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("use_imm", [False, True])
@pytest.mark.parametrize("batch_uops", [None, 5])
def test_alu_aliased_micro_ops_match_reference_in_order(config_name, op, use_imm, batch_uops):
    """fsim's batched ALU equals the reference's one-micro-op-at-a-time loop on programs whose
    destinations repeat and whose sources alias destinations (in small batches too)."""
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=int(op) * 4 + 2 * use_imm + bool(batch_uops))
    if batch_uops:
        sim._alu_chunk = batch_uops
    for trial in range(8):
        entries = int(rng.choice([1, 2, 4, 16]))
        if op == AluOp.SHR:
            values = rng.integers(-40, 40, sim.acc.shape)
        elif op == AluOp.MUL and trial % 2:
            values = rng.integers(-3, 4, sim.acc.shape)
        else:
            values = rng.integers(-(1 << (config.acc_width - 1)), 1 << (config.acc_width - 1), sim.acc.shape)
        set_acc(sim, ref, values)
        uops, insn = _aliased_alu(rng, config, op, use_imm, entries)
        set_uops(sim, ref, insn.uop_bgn, uops)
        sim.execute(insn)
        ref.execute(insn)
        np.testing.assert_array_equal(sim.acc, ref.buffer("acc"), err_msg=str(insn))
        np.testing.assert_array_equal(sim.out.astype(np.int64), ref.buffer("out"), err_msg=str(insn))


@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("times", [1, 2, 3, 5, 31, 32, 33, 70])
def test_alu_repeated_self_operand_matches_reference(op, times):
    """One micro-op acc[d] = op(acc[d], acc[d]) repeated (computed in closed form by fsim)."""
    config = PRESETS["tiny"]
    sim, ref, rng = make_pair(config, seed=times)
    edge = np.array(EDGE + [-3, -2, 2, 3, 5, 6], np.int64)
    values = np.zeros(sim.acc.shape, np.int64)
    values[:edge.size // 4 + 1].reshape(-1)[:edge.size] = edge
    values[edge.size // 4 + 1:] = rng.integers(-40, 40, values[edge.size // 4 + 1:].shape)
    for d in range(6):
        sim._write_acc(slice(None), values)
        for i in range(8):
            ref.write_acc(i, values[i].tolist())
        sim.uop[0] = ref.uop[0] = (d, d, 0)
        insn = Alu(op=op, uop_bgn=0, uop_end=1, iter_out=times, iter_in=1)
        sim.execute(insn)
        ref.execute(insn)
        np.testing.assert_array_equal(sim.acc[:8], ref.buffer("acc")[:8], err_msg=f"d={d}")


def test_alu_long_repeated_destination_runs_fast():
    """2^28 micro-ops into one entry (the hardware needs 2.7 s) run in well under a second: the
    batches are exact closed forms, not a Python loop per micro-op (which took about 35 min)."""
    config = PRESETS["default"]
    sim = Fsim(config, np.zeros(4096, np.uint8))
    values = np.arange(-8, 8, dtype=np.int64).reshape(1, 1, 16) * np.ones((4, 1, 1), np.int64)
    sim._write_acc(slice(0, 4), values)
    sim.uop[0:3] = [[0, 1, 0], [2, 2, 0], [3, 0, 0]]
    n = 16383 * 16383
    start = time.perf_counter()
    sim.execute(Alu(op=AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=16383, iter_in=16383))
    sim.execute(Alu(op=AluOp.MUL, uop_bgn=1, uop_end=2, iter_out=16383, iter_in=16383))
    sim.execute(Alu(op=AluOp.ADD, imm=-3, uop_bgn=2, uop_end=3, iter_out=16383, iter_in=16383))
    assert time.perf_counter() - start < 5
    assert sim.acc[0, 0].tolist() == [wrap(int(v) + n * int(w), 32) for v, w in zip(values[0, 0], values[1, 0])]
    # v^(2^n) modulo 2^32: 1 for odd v (v^(2^k) = 1 modulo 2^(k+2)), 0 for even v
    assert sim.acc[2, 0].tolist() == [int(v) % 2 for v in values[2, 0]]
    assert sim.acc[3, 0].tolist() == [wrap(int(v) - 3 * n, 32) for v in values[3, 0]]
    assert sim.counters["alu_uops"] == 3 * n


def _alu_values(rng, config, op, trial):
    """Accumulator values for an ALU test, by trial: the whole signed acc_width range; SHR
    amounts around ±acc_width, MUL small odd values (their products never die out); ADD
    multiples of 2^(acc_width-3) and MUL values whose squares are 1 (sums and products then
    return to earlier values within a few repetitions)."""
    shape = (config.acc_depth, config.batch, config.block_out)
    half = 1 << (config.acc_width - 1)
    if trial % 3 == 1 and op == AluOp.SHR:
        return rng.integers(-config.acc_width - 8, config.acc_width + 8, shape)
    if trial % 3 == 1 and op == AluOp.MUL:
        return 2 * rng.integers(-4, 4, shape) + 1
    if trial % 3 == 2 and op == AluOp.ADD:
        return rng.integers(-4, 4, shape) * (half >> 2)
    if trial % 3 == 2 and op == AluOp.MUL:
        return rng.choice([1, -1, 1 - half, half - 1], shape)
    return rng.integers(-half, half, shape)


def _periodic_alu(rng, config, op, use_imm, entries, iters):
    """A random ALU loop that repeats one body: outer factors 0, inner factors 0 or small (the
    body is the inner loop), a few micro-ops crowded into ``entries`` entries so that they
    chain (sources read what the body wrote), iteration counts drawn from ``iters``."""
    uop_count = int(rng.integers(1, 6))
    io, ii = int(rng.choice(iters)), int(rng.choice(iters))
    factors = {"dst_factor_in": 0, "src_factor_in": 0}
    if rng.random() < 0.4:
        factors = {"dst_factor_in": int(rng.choice([0, 1])), "src_factor_in": int(rng.choice([0, 1, 2]))}
        ii = min(ii, 8)
    uops = rng.integers(0, entries, (uop_count, 3))
    imm = None
    if use_imm:
        imm = int(rng.choice([0, 1, 3, -2, 31, 33, -31, -40])) if op == AluOp.SHR else int(rng.integers(-2**15, 2**15))
    bgn = int(rng.integers(0, config.uop_depth - uop_count))
    return uops, Alu(op=op, imm=imm, uop_bgn=bgn, uop_end=bgn + uop_count, iter_out=io, iter_in=ii, **factors)


def _check_periodic_against_reference(config, op, use_imm, seed, iters, trials):
    """``trials`` random loops of `_periodic_alu`, each on fresh `_alu_values`, in fsim and the
    reference."""
    sim, ref, rng = make_pair(config, seed)
    for trial in range(trials):
        set_acc(sim, ref, _alu_values(rng, config, op, trial))
        uops, insn = _periodic_alu(rng, config, op, use_imm, int(rng.choice([1, 2, 3, 6])), iters)
        set_uops(sim, ref, insn.uop_bgn, uops)
        sim.execute(insn)
        ref.execute(insn)
        np.testing.assert_array_equal(sim.acc, ref.buffer("acc"), err_msg=f"{insn} {uops.tolist()}")
        np.testing.assert_array_equal(sim.out.astype(np.int64), ref.buffer("out"), err_msg=str(insn))


@pytest.mark.parametrize("config_name", ["tiny", "acc16", "nonsquare", "wide"])
@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("use_imm", [False, True])
def test_alu_periodic_loops_match_reference(config_name, op, use_imm):
    """Loops that repeat one chained body (a matrix power for ADD and MUL, a fixed point or
    cycle for the others; with an immediate, per-entry reductions) equal the reference's
    one-micro-op-at-a-time loop, from 1 to 1,600 repetitions."""
    _check_periodic_against_reference(CONFIGS[config_name], op, use_imm, seed=int(op) * 2 + use_imm,
                                      iters=[1, 2, 3, 5, 17, 40], trials=8)


@pytest.mark.parametrize("config_name", ["tiny", "acc16"])
@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("search", [3, 1024])
def test_alu_periodic_loops_without_a_matrix_match_reference(config_name, op, search, monkeypatch):
    """With no matrix allowed, ADD and MUL bodies repeat one at a time too, skipping whole
    cycles of their values; with a cycle search of three repetitions, most repeated bodies run
    their remaining repetitions as an ordinary loop after the search. Both exact."""
    monkeypatch.setattr(alu_batching, "MATRIX_ENTRIES", 0)
    monkeypatch.setattr(alu_batching, "CYCLE_SEARCH", search)
    _check_periodic_against_reference(CONFIGS[config_name], op, False, seed=40 + int(op),
                                      iters=[2, 3, 5, 17, 40], trials=9)


@pytest.mark.parametrize("config_name", ["tiny", "acc16"])
def test_alu_periodic_loop_skips_whole_cycles(config_name, monkeypatch):
    """With no matrix allowed, acc[0] += acc[1]; acc[2] += acc[0]; acc[3] += acc[3] on
    multiples of 2^(acc_width-3): acc[3] is 0 from the third repetition on, and acc[0] and
    acc[2] return to earlier values every 16 (t·acc[1] and t(t+1)/2·acc[1] modulo 8·acc[1]),
    so repetitions past the first cycle are skipped, by any remainder."""
    monkeypatch.setattr(alu_batching, "MATRIX_ENTRIES", 0)
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=9)
    set_uops(sim, ref, 0, np.array([[0, 1, 0], [2, 0, 0], [3, 3, 0]]))
    step = 1 << (config.acc_width - 3)
    for times in [2, 3, 15, 16, 17, 33, 50, 101, 16383 * 16383]:
        set_acc(sim, ref, rng.integers(-4, 4, sim.acc.shape) * step)
        if times < 16383:
            insn = Alu(op=AluOp.ADD, uop_bgn=0, uop_end=3, iter_out=times, iter_in=1)
            ref.execute(insn)
            expect = ref.buffer("acc")
        else:
            insn = Alu(op=AluOp.ADD, uop_bgn=0, uop_end=3, iter_out=16383, iter_in=16383)
            expect = _reference_after(ref, dataclasses.replace(insn, iter_out=1, iter_in=1), times, [0, 1, 2, 3])
        sim.execute(insn)
        np.testing.assert_array_equal(sim.acc, expect, err_msg=f"{times} repetitions")


@pytest.mark.parametrize("config_name", ["tiny", "acc16"])
def test_alu_periodic_mul_powers_of_two_vanish_exactly_at_acc_width(config_name):
    """acc[0] ·= acc[1]; acc[2] ·= acc[0], n times: acc[0] gains a factor 2^n from an acc[1]
    of 2, which is 0 from n = acc_width on (the exponent is counted exactly up to there)."""
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=5)
    set_uops(sim, ref, 0, np.array([[0, 1, 0], [2, 0, 0]]))
    for n in range(config.acc_width - 3, config.acc_width + 3):
        values = 2 * rng.integers(-50, 50, sim.acc.shape) + 1
        values[1] = rng.choice([2, -2, 6], values[1].shape)
        set_acc(sim, ref, values)
        insn = Alu(op=AluOp.MUL, uop_bgn=0, uop_end=2, iter_out=n, iter_in=1)
        sim.execute(insn)
        ref.execute(insn)
        np.testing.assert_array_equal(sim.acc, ref.buffer("acc"), err_msg=f"n={n}")


@pytest.mark.parametrize("config_name", ["tiny", "acc16"])
@pytest.mark.parametrize("op", list(AluOp))
def test_alu_periodic_loops_of_thousands_of_repetitions_match_reference(config_name, op):
    """5,000 repetitions of a chained body (MUL exponents far past acc_width, ADD wrapping
    many times over) against the reference run in full."""
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=60 + int(op))
    for trial in range(2):
        set_acc(sim, ref, _alu_values(rng, config, op, trial))
        uops = rng.integers(0, 3, (int(rng.integers(2, 4)), 3))
        set_uops(sim, ref, 0, uops)
        insn = Alu(op=op, uop_bgn=0, uop_end=len(uops), iter_out=100, iter_in=50)
        sim.execute(insn)
        ref.execute(insn)
        np.testing.assert_array_equal(sim.acc, ref.buffer("acc"), err_msg=f"{insn} {uops.tolist()}")


def _reference_after(ref: ReferenceModel, body: Alu, times: int, entries: list[int]) -> np.ndarray:
    """The reference's accumulator after ``times`` repetitions of ``body``, ``times`` too many
    to run: ADD through the body's matrix, whose column j the reference gives from the state with
    entry j 1 and the others 0 (an ADD body is linear); the other ops by running the body until
    the touched entries repeat an earlier repetition's values (the body reads only those)."""
    width = ref.config.acc_width
    start = ref.buffer("acc")
    if body.op == AluOp.ADD:
        columns = []
        for j in entries:
            for e in entries:
                ref.write_acc(e, (np.zeros_like(start[e]) + (e == j)).tolist())
            ref.execute(body)
            columns.append([int(ref.buffer("acc")[e].reshape(-1)[0]) for e in entries])
        matrix = [list(row) for row in zip(*columns)]
        power = [[int(r == c) for c in range(len(entries))] for r in range(len(entries))]
        n = times
        while n:
            if n & 1:
                power = [[sum(a * b for a, b in zip(row, col)) % (1 << width) for col in zip(*matrix)]
                         for row in power]
            matrix = [[sum(a * b for a, b in zip(row, col)) % (1 << width) for col in zip(*matrix)]
                      for row in matrix]
            n >>= 1
        result = start.copy()
        for r, e in enumerate(entries):
            result[e] = wrap(sum(power[r][c] * start[f].astype(object) for c, f in enumerate(entries)), width)
        return result
    seen, states = {}, []
    while True:
        state = ref.buffer("acc")
        key = state[entries].tobytes()
        if key in seen:
            first = seen[key]
            return states[times if times < first else first + (times - first) % (len(states) - first)]
        assert len(states) < 5000, "no repeated state in 5,000 repetitions"
        seen[key] = len(states)
        states.append(state)
        ref.execute(body)


@pytest.mark.parametrize("config_name", ["tiny", "acc16"])
@pytest.mark.parametrize("op", [AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR])
@pytest.mark.parametrize("inner", ["repeated", "loop"])
def test_alu_periodic_loops_of_2_28_micro_ops_match_reduced_reference(config_name, op, inner):
    """16383 × 16383 repetitions of a random chained body (or 16383 of an inner loop of 3),
    against the reference's result for that many repetitions found without running them all
    (`_reference_after`; MUL: the Fibonacci loop below)."""
    config = CONFIGS[config_name]
    sim, ref, rng = make_pair(config, seed=80 + int(op) + 7 * (inner == "loop"))
    for trial in range(3):
        set_acc(sim, ref, _alu_values(rng, config, op, trial))
        uops = rng.integers(0, 4, (int(rng.integers(2, 5)), 3))
        set_uops(sim, ref, 0, uops)
        if inner == "loop":
            insn = Alu(op=op, uop_bgn=0, uop_end=len(uops), iter_out=16383, iter_in=3, dst_factor_in=1, src_factor_in=2)
            body, times = dataclasses.replace(insn, iter_out=1), 16383
        else:
            insn = Alu(op=op, uop_bgn=0, uop_end=len(uops), iter_out=16383, iter_in=16383)
            body, times = dataclasses.replace(insn, iter_out=1, iter_in=1), 16383 * 16383
        entries = sorted({int(u[c]) + j * f for u in uops for c, f in ((0, body.dst_factor_in), (1, body.src_factor_in))
                          for j in range(body.iter_in)})
        start = time.perf_counter()
        sim.execute(insn)
        assert time.perf_counter() - start < 5
        np.testing.assert_array_equal(sim.acc, _reference_after(ref, body, times, entries),
                                      err_msg=f"{insn} {uops.tolist()}")


def _fibonacci_pair(n: int, modulus: int) -> tuple[int, int]:
    """(F(n), F(n+1)) modulo ``modulus`` by fast doubling on Python integers."""
    if n == 0:
        return 0, 1
    a, b = _fibonacci_pair(n // 2, modulus)
    c = a * (2 * b - a) % modulus
    d = (a * a + b * b) % modulus
    return (d, (c + d) % modulus) if n % 2 else (c, d)


def test_alu_fibonacci_loop_of_2_29_micro_ops_runs_fast():
    """acc[1] += acc[0]; acc[0] += acc[1], 16383 × 16383 times (2^29 micro-ops, about 5 s on
    the hardware, over an hour one micro-op at a time): each repetition is the Fibonacci step
    squared, so (acc[0], acc[1]) becomes (F(2n+1)·a + F(2n)·b, F(2n)·a + F(2n−1)·b). The MUL
    loop's values are powers with those exponents: modulo 2^32 an odd value's powers repeat
    every 2^30 (its order divides it) and an even value's are 0 from the 32nd on."""
    config = PRESETS["tiny"]
    n = 16383 * 16383
    f0, f1 = _fibonacci_pair(2 * n - 1, 1 << 32)
    f2 = (f0 + f1) % (1 << 32)                        # F(2n-1), F(2n), F(2n+1)
    e0, e1 = _fibonacci_pair(2 * n - 1, 1 << 30)
    e2 = (e0 + e1) % (1 << 30)
    a = np.array([1, -7, 2**31 - 1, 12345], np.int64)
    b = np.array([1, 3, -2**31, 2**20 + 1], np.int64)
    for op in (AluOp.ADD, AluOp.MUL):
        sim = Fsim(config, np.zeros(4096, np.uint8))
        sim._write_acc(slice(0, 2), np.stack([a, b]).reshape(2, 1, 4))
        sim.uop[0:2] = [[1, 0, 0], [0, 1, 0]]
        start = time.perf_counter()
        sim.execute(Alu(op=op, uop_bgn=0, uop_end=2, iter_out=16383, iter_in=16383))
        assert time.perf_counter() - start < 2
        assert sim.counters["alu_uops"] == 2 * n
        for x, y, got in zip(a.tolist(), b.tolist(), sim.acc[:2, 0].T.tolist()):
            if op == AluOp.ADD:
                expect = [f2 * x + f1 * y, f1 * x + f0 * y]
            else:
                odd = x % 2 and y % 2
                expect = [pow(x, e2, 1 << 32) * pow(y, e1, 1 << 32) * odd,
                          pow(x, e1, 1 << 32) * pow(y, e0, 1 << 32) * odd]
            assert got == [wrap(v, 32) for v in expect], (op, x, y)


@pytest.mark.parametrize("op", [AluOp.ADD, AluOp.MIN, AluOp.SHR])
@pytest.mark.parametrize("iter_in", [4, 8])
def test_alu_periodic_loop_records_its_accesses_for_the_race_detector(op, iter_in):
    """A repeated body's reads and writes (12 or 24 micro-ops: run one by one, or in batches),
    as the race detector records them, are the entries the loop addresses; its micro-ops are
    all counted."""
    config = PRESETS["tiny"]
    sim, trace = traced_fsim(config, np.zeros(4096, np.uint8))
    sim.acc[...] = np.random.default_rng(1).integers(-40, 40, sim.acc.shape)    # before any instruction
    sim.uop[3:6] = [[20, 21, 0], [21, 20, 0], [30, 20, 0]]
    insn = Alu(op=op, uop_bgn=3, uop_end=6, iter_out=5000, iter_in=iter_in, dst_factor_in=1, src_factor_in=2)
    sim.execute(insn, index=7)
    dst = {d + j for d in (20, 21, 30) for j in range(iter_in)}
    src = {s + 2 * j for s in (21, 20, 20) for j in range(iter_in)}
    accesses = trace.accesses[7]
    assert accesses[("acc", "w")].tolist() == accesses[("out", "w")].tolist() == sorted(dst)
    assert accesses[("acc", "r")].tolist() == sorted(dst | src)
    assert accesses[("uop", "r")].tolist() == [3, 4, 5]
    assert sim.counters["alu_uops"] == 5000 * iter_in * 3


def test_alu_periodic_loop_out_of_range_changes_nothing():
    """The loop's indices are checked before any repetition runs."""
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(4096, np.uint8))
    sim._write_acc(slice(None), np.arange(config.acc_depth)[:, None, None] * np.ones((1, 1, 4), np.int64))
    before = sim.acc.copy()
    sim.uop[0:2] = [[1, 0, 0], [0, 250, 0]]
    with pytest.raises(OutOfBoundsError, match=r"src index 256 is outside the 256-entry acc buffer \(at i=0, j=3"):
        sim.execute(Alu(op=AluOp.ADD, uop_bgn=0, uop_end=2, iter_out=16383, iter_in=4, src_factor_in=2))
    np.testing.assert_array_equal(sim.acc, before)


# ---------------------------------------------------------------------------- engines and tokens

def run_program(config, insns, uops=(), dram_bytes=DRAM_BYTES):
    dram = np.zeros(dram_bytes, np.uint8)
    sim = Fsim(config, dram)
    stream = encode_program(insns, config)
    base = 4096
    dram[base:base + len(stream)] = np.frombuffer(stream, np.uint8)
    if uops:
        raw = encode_uops(uops, config)
        dram[:len(raw)] = np.frombuffer(raw, np.uint8)
    return sim, sim.run(base, len(insns))


def test_balanced_program_runs_and_counts():
    config = PRESETS["tiny"]
    insns = [
        Load(mem=MemType.UOP, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1),
        Load(mem=MemType.INP, sram_base=0, dram_base=8, y_size=1, x_size=2, x_stride=2),
        Load(mem=MemType.WGT, sram_base=0, dram_base=8, y_size=1, x_size=1, x_stride=1, push_next=True),
        Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, pop_prev=True, push_next=True),
        Store(mem=MemType.OUT, sram_base=0, dram_base=64, y_size=1, x_size=1, x_stride=1,
              pop_prev=True, push_prev=True),
        Finish(pop_next=True),
    ]
    _, counters = run_program(config, insns, [Uop(0, 0, 0)])
    assert counters["insns"] == 6
    assert counters["load_bytes_inp"] == 8 and counters["load_bytes_wgt"] == 16
    assert counters["load_bytes_uop"] == 4 and counters["store_bytes_out"] == 4
    assert counters["gemm_uops"] == 1 and counters["macs"] == 16 and counters["finish_insns"] == 1


def test_missing_token_reports_deadlock_with_state():
    config = PRESETS["tiny"]
    insns = [
        Load(mem=MemType.INP, sram_base=0, dram_base=8, y_size=1, x_size=1, x_stride=1),  # no push
        Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, pop_prev=True),
        Finish(),
    ]
    with pytest.raises(DeadlockError) as info:
        run_program(config, insns)
    text = str(info.value)
    assert "deadlock" in text
    assert "next instruction 1 (gemm), waiting on pop_prev (load->compute)" in text
    assert "load->compute=0" in text and "store->compute=0" in text
    assert "3 of 3 instructions dispatched" in text


def test_extra_token_reports_unbalanced_end():
    config = PRESETS["tiny"]
    insns = [Load(mem=MemType.INP, sram_base=0, dram_base=8, y_size=1, x_size=1, x_stride=1,
                  push_next=True), Finish()]
    with pytest.raises(DeadlockError, match=r"unbalanced(.|\n)*load->compute=1"):
        run_program(config, insns)


def test_store_left_waiting_at_finish_is_reported():
    config = PRESETS["tiny"]
    insns = [Store(mem=MemType.OUT, sram_base=0, dram_base=64, y_size=1, x_size=1, x_stride=1, pop_prev=True),
             Finish()]
    with pytest.raises(DeadlockError, match=r"store +next instruction 0 \(store.out\), waiting on pop_prev"):
        run_program(config, insns)


def test_finish_must_be_last():
    config = PRESETS["tiny"]
    insns = [Finish(), Load(mem=MemType.INP, sram_base=0, dram_base=8, y_size=1, x_size=1, x_stride=1)]
    with pytest.raises(FsimError, match="FINISH is instruction 0 but must be the last one"):
        run_program(config, insns)


def test_program_without_finish_is_reported_as_such():
    config = PRESETS["tiny"]
    insns = [Load(mem=MemType.INP, sram_base=0, dram_base=8, y_size=1, x_size=1, x_stride=1)]
    with pytest.raises(DeadlockError, match="none was FINISH") as info:
        run_program(config, insns)
    assert info.value.fault == Fault.NO_FINISH


def test_full_token_queue_blocks_the_pusher_until_consumed():
    """More tokens in flight than the queue holds: the producer waits, nothing is lost."""
    config = PRESETS["tiny"].replace(token_queue_depth=2)
    loads = [Load(mem=MemType.INP, sram_base=i, dram_base=8 + i, y_size=1, x_size=1, x_stride=1,
                  push_next=True) for i in range(5)]
    gemms = [Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, pop_prev=True) for _ in range(5)]
    _, counters = run_program(config, loads + gemms + [Finish()])
    assert counters["gemm_insns"] == 5
    # Five pushes with nobody popping: the third cannot enter the full queue.
    with pytest.raises(DeadlockError, match="cannot push to full queue load->compute"):
        run_program(config, loads + [Finish()])


def test_full_command_queue_stalls_fetch_into_deadlock():
    """Fetch dispatches in order: a full store queue blocks a later compute instruction."""
    config = PRESETS["tiny"].replace(cmd_queue_depth=2)
    stores = [Store(mem=MemType.OUT, sram_base=0, dram_base=64, y_size=1, x_size=1, x_stride=1,
                    pop_prev=True, push_prev=True) for _ in range(3)]
    computes = [Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, push_next=True, pop_next=True) for _ in range(3)]
    # Stores first: 2 fit the store queue, the third blocks fetch before any GEMM is dispatched.
    with pytest.raises(DeadlockError, match="2 of 7 instructions dispatched"):
        run_program(config, stores + computes + [Finish()])


# ---------------------------------------------------------------------------- bounds and bad programs

def test_dram_out_of_bounds_names_instruction_and_address():
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(4096, np.uint8))
    with pytest.raises(OutOfBoundsError, match=r"instruction 3 \(load.wgt\): DRAM bytes up to 0x1010"):
        sim.execute(Load(mem=MemType.WGT, sram_base=0, dram_base=256, y_size=1, x_size=1, x_stride=1), 3)
    with pytest.raises(OutOfBoundsError, match=r"store.acc\): DRAM bytes up to"):
        sim.execute(Store(mem=MemType.ACC, sram_base=0, dram_base=200, y_size=2, x_size=1, x_stride=100))


def test_sram_out_of_bounds_names_buffer_and_range():
    config = PRESETS["tiny"]
    sim = Fsim(config, np.zeros(4096, np.uint8))
    with pytest.raises(OutOfBoundsError, match=r"writes inp entries 250..257 but the inp buffer has 256"):
        sim.execute(Load(mem=MemType.INP, sram_base=250, dram_base=0, y_size=2, x_size=2, x_stride=2,
                         x_pad1=2))
    with pytest.raises(OutOfBoundsError, match=r"reads out entries 255..256"):
        sim.execute(Store(mem=MemType.OUT, sram_base=255, dram_base=0, y_size=1, x_size=2, x_stride=2))
    sim.uop[0] = [200, 0, 0]
    with pytest.raises(OutOfBoundsError, match=r"dst index 260 is outside the 256-entry acc buffer \(at i=3"):
        sim.execute(Gemm(uop_bgn=0, uop_end=1, iter_out=4, iter_in=1, dst_factor_out=20))
    with pytest.raises(OutOfBoundsError, match=r"micro-op range \[5, 300\)"):
        sim.execute(Alu(op=AluOp.ADD, imm=1, uop_bgn=5, uop_end=300, iter_out=1, iter_in=1))


def test_zero_sizes_are_refused():
    sim = Fsim(PRESETS["tiny"], np.zeros(4096, np.uint8))
    with pytest.raises(FsimError, match="x_size must be at least 1"):
        sim.execute(Load(mem=MemType.INP, sram_base=0, dram_base=0, y_size=1, x_size=0, x_stride=0))
    with pytest.raises(FsimError, match="iter_in must be at least 1"):
        sim.execute(Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=0))


def test_undecodable_instruction_is_reported():
    config = PRESETS["tiny"]
    dram = np.zeros(8192, np.uint8)
    dram[4096] = 7  # opcode 7 does not exist
    with pytest.raises(FsimError, match=r"instruction 0 \(at 0x1000\) is invalid: unknown opcode 7"):
        Fsim(config, dram).run(4096, 1)
    with pytest.raises(OutOfBoundsError, match="instruction stream"):
        Fsim(config, dram).run(8000, 100)


# ---------------------------------------------------------------------------- whole programs

@pytest.mark.parametrize("config_name", ["tiny", "nonsquare", "acc16"])
@pytest.mark.parametrize("seed", range(3))
def test_random_token_balanced_programs_match_in_order_reference(config_name, seed):
    """fsim interleaves the three engines under the token rules; a race-free program must
    leave DRAM exactly as the reference executing it in program order does."""
    from gemforge.sim.cosim.random_program import random_program
    config = CONFIGS[config_name]
    rng = np.random.default_rng(seed)
    base = 4096
    prog = random_program(config, rng, base, groups=2)
    dram = np.zeros(1 << 18, np.uint8)
    prog.install(dram)
    ref = ReferenceModel(config, dram)
    sim = Fsim(config, dram)
    counters = sim.run(prog.insn_address, len(prog.instructions))
    for insn in prog.instructions:
        ref.execute(insn)
    assert counters["insns"] == len(prog.instructions)
    assert sim.dram.tobytes() == bytes(ref.dram)
    for name in ("acc", "out"):
        np.testing.assert_array_equal(getattr(sim, name).astype(np.int64), ref.buffer(name))
