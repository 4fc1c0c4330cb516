"""The Device API: allocation, copies, program loading and relocation."""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.compiler import compile_dense
from gemforge.driver.runtime.device import DeviceError, available_backends, open_device
from gemforge.hw.program import Program, ProgramError, arena_alignment
from gemforge.hw.config import PRESETS
from gemforge.sim.cosim import harness


def test_alloc_is_aligned_disjoint_and_reusable():
    dev = open_device("fsim", "tiny", dram_bytes=1 << 20)
    bufs = [dev.alloc(n, align=a) for n, a in [(100, 64), (5000, 4096), (1, 1), (300, 256)]]
    for buf, align in zip(bufs, [64, 4096, 1, 256]):
        assert buf.address % align == 0 and buf.address > 0
    spans = sorted((b.address, b.address + b.nbytes) for b in bufs)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    for buf in bufs:
        dev.free(buf)
    big = dev.alloc((1 << 20) - 4096, align=4096)  # everything coalesced back
    assert big.address == 4096


def test_alloc_errors():
    dev = open_device("fsim", "tiny", dram_bytes=1 << 16)
    with pytest.raises(DeviceError, match="out of device DRAM"):
        dev.alloc(1 << 17)
    with pytest.raises(DeviceError, match="power of two"):
        dev.alloc(16, align=3)
    buf = dev.alloc(64)
    dev.free(buf)
    with pytest.raises(DeviceError, match="not an allocation"):
        dev.free(buf)


def test_write_read_roundtrip_and_bounds():
    dev = open_device("fsim", "tiny", dram_bytes=1 << 16)
    buf = dev.alloc(64)
    data = np.arange(16, dtype=np.int32)
    dev.write(buf, data)
    np.testing.assert_array_equal(dev.read(buf, np.int32, (16,)), data)
    np.testing.assert_array_equal(dev.read(buf, np.int32, (4,), offset=8), data[2:6])
    with pytest.raises(DeviceError, match="overruns"):
        dev.write(buf, np.zeros(65, np.uint8))
    with pytest.raises(DeviceError, match="overruns"):
        dev.read(buf, np.int32, (17,))


def test_unknown_backend_is_named():
    with pytest.raises(DeviceError, match="unknown device 'nope'; available: .*fsim"):
        open_device("nope", "tiny")
    assert "fsim" in available_backends()


def test_program_config_must_match_device():
    program = compile_dense(PRESETS["tiny"], 4, 4, 4).program
    with pytest.raises(ProgramError, match="built for config 'tiny'"):
        open_device("fsim", "default").load_program(program)


def test_relocation_runs_anywhere_and_survives_save_load(tmp_path):
    """The same saved program runs at two different arena bases with the same result."""
    config = PRESETS["tiny"]
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (9, 13), dtype=np.int8)
    b = rng.integers(-128, 128, (13, 6), dtype=np.int8)
    path = tmp_path / "gemm.gfp"
    op = compile_dense(config, 9, 13, 6)
    op.program.save(path)
    program = Program.load(path)
    dev = open_device("fsim", config, dram_bytes=1 << 20)
    first = dev.alloc(3 * arena_alignment(config))  # shifts the next arena
    results = []
    for _ in range(2):
        out, _ = dev.run_program(program, op.pack_inputs(a=a, b=b), ["out"])
        results.append(op.unpack_output(out["out"]))
        dev.free(first) if first else None
        first = None
    for c in results:
        np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))


def test_run_program_checks_inputs():
    config = PRESETS["tiny"]
    program = compile_dense(config, 4, 4, 4).program
    dev = open_device("fsim", config)
    expected = program.tensors["a"]
    with pytest.raises(DeviceError, match=rf"input 'a' must be int8\[{', '.join(map(str, expected.shape))}\]"):
        dev.run_program(program, {"a": np.zeros((4, 4, 4), np.int8)}, ["out"])
    with pytest.raises(DeviceError, match="no input tensor 'z'"):
        dev.run_program(program, {"z": np.zeros(1)}, ["out"])


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
def test_a_verilator_device_serves_its_runs_from_one_session():
    """The simulator starts once per device: runs with different windows (another buffer
    widens the window) all equal fsim, each from a fresh state; a closed device's simulator
    is gone."""
    config = PRESETS["tiny"]
    rng = np.random.default_rng(19)
    rtl, ref = open_device("verilator", config), open_device("fsim", config)
    try:
        for m, k, n, pad in ((5, 9, 7, 0), (8, 20, 12, 3 << 20), (3, 4, 5, 64)):
            extra = rtl.alloc(pad) if pad else None      # a later allocation widens the window
            op = compile_dense(config, m, k, n)
            a = rng.integers(-128, 128, (m, k), dtype=np.int8)
            b = rng.integers(-128, 128, (k, n), dtype=np.int8)
            got, result = op.run(rtl, a=a, b=b)
            np.testing.assert_array_equal(got, op.run(ref, a=a, b=b)[0])
            assert result.cycles > 0
            if extra:
                rtl.free(extra)
        session = rtl._session
        assert session is not None and session.count == 3
    finally:
        rtl.close()
    assert not session._thread.is_alive() and not session.folder.exists()


def test_loading_refuses_overlapping_regions_and_transfers_past_the_arena():
    """Found by an audit: a constant over the micro-ops was written over them, and a STORE
    4 MB past a 4 KiB arena ran (in a network, over another layer's tensors)."""
    from gemforge.hw.asm import assemble
    dev = open_device("fsim", "tiny")
    base = ".uop_offset 0\n.arena_bytes 4096\n.uop dst=0 src=0 wgt=0\n"
    overlap = assemble(base + ".tensor w offset=0 shape=16 dtype=int8\nfinish\n", "tiny", runnable=True)
    overlap.constants["w"] = np.zeros(16, np.int8)
    with pytest.raises(ProgramError, match="the micro-ops and tensor w overlap in the arena"):
        dev.load_program(overlap)
    far = assemble(base + "store.out sram_base=0 dram_base=1048576 y_size=1 x_size=1 x_stride=1\nfinish\n", "tiny",
                   runnable=True)
    with pytest.raises(ProgramError, match=r"instruction 0 \(store.out\) reaches byte 4194308 of its arena, past "
                                           "the 4096 bytes"):
        dev.load_program(far)
