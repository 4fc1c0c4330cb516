"""The whole board top in co-simulation, driven through a pseudo-terminal by the `uart` device.

`gemforge.sim.cosim.board` runs `BoardTop` (tiny accelerator, 64 KiB block RAM,
8 clock cycles per bit) under Verilator with its UART pins bridged to a
pseudo-terminal; the host side is the real `UartDevice` on pyserial, so these
tests run what a host runs against a board: compiled operators through the
Device API (equal to numpy, counters equal to fsim's), the bridge's error
statuses, faults named through the registers, and recovery afterwards.
"""

from __future__ import annotations

import struct
import time
from dataclasses import replace

import numpy as np
import pytest

from gemforge.compiler import compile_dense, dense_reference, run_dense
from gemforge.driver.runtime.device import AcceleratorFaultError, DeviceError, LoadedProgram, open_device
from gemforge.driver.runtime.uart_device import BoardFaultError
from gemforge.driver.runtime.uart_link import LinkError
from gemforge.hw.board.protocol import BRIDGE_MAGIC, Opcode, Status, header
from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Finish, Load, MemType, encode_program
from gemforge.hw.regmap import Fault
from gemforge.sim.cosim import harness

pytestmark = pytest.mark.skipif(not harness.simulator_available("verilator"), reason="needs verilator")

CONFIG = PRESETS["tiny"]
MEM_BYTES = 64 << 10
CYCLES_PER_BIT = 8


@pytest.fixture(scope="module")
def board():
    from gemforge.sim.cosim.board import build_board, serve_board
    built = build_board(CONFIG, MEM_BYTES, CYCLES_PER_BIT)
    with serve_board(built) as pty:
        # A pseudo-terminal to a simulation is far slower than its nominal 115200 baud.
        device = open_device(f"uart:{pty}@115200", CONFIG, timeout_s=30, run_timeout_s=300)
        try:
            yield device
        finally:
            device.close()


def test_device_learns_the_board_memory(board):
    assert board.kind == "uart"
    assert board.board_mem_bytes == board.dram_bytes == MEM_BYTES


def test_dense_through_the_uart_equals_numpy(board):
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, (5, 9), dtype=np.int8)
    b = rng.integers(-128, 128, (9, 7), dtype=np.int8)
    sent, received = board.link.bytes_sent, board.link.bytes_received
    t0 = time.perf_counter()
    c, result = run_dense(board, a, b)
    wall = time.perf_counter() - t0
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))
    _, reference = run_dense(open_device("fsim", CONFIG), a, b)
    assert result.cycles > 0
    assert result.hw_counters["gemm_active"] == reference.counters["gemm_uops"] > 0
    assert result.counters["insns"] == reference.counters["insns"]
    moved = board.link.bytes_sent - sent + board.link.bytes_received - received
    print(f"dense 5x9x7 over the simulated UART: {wall:.2f} s, {moved} bytes, {moved / wall:.0f} bytes/s")


def test_fused_epilogue_through_the_uart_equals_numpy(board):
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 128, (4, 12), dtype=np.int8)
    b = rng.integers(-128, 128, (12, 8), dtype=np.int8)
    bias = rng.integers(-2000, 2000, 8, dtype=np.int32)
    op = compile_dense(CONFIG, 4, 12, 8, bias=True, shift=5, relu=True)
    out, _ = op.run(board, a=a, b=b, bias=bias)
    np.testing.assert_array_equal(out, dense_reference(a, b, bias, 5, True))


def test_memory_round_trip_across_chunks(board):
    """WRITE_MEM and READ_MEM of more than one chunk; prints the link's rate."""
    data = np.random.default_rng(11).integers(0, 256, 2500, dtype=np.uint8).tobytes()
    t0 = time.perf_counter()
    board.link.write_mem(0x4000 + 3, data)
    t1 = time.perf_counter()
    back = board.link.read_mem(0x4000 + 3, len(data))
    t2 = time.perf_counter()
    assert back == data
    board.link.write_mem(0x4000 + 3, board.dram[0x4003:0x4003 + len(data)].tobytes())  # what the device holds
    print(f"simulated UART: write {len(data) / (t1 - t0):.0f} bytes/s, read {len(data) / (t2 - t1):.0f} bytes/s")


def test_bridge_answers_errors_and_stays_in_step(board):
    link = board.link
    with pytest.raises(LinkError) as err:
        link.read_mem(MEM_BYTES - 4, 8)                     # runs past the memory
    assert err.value.status == Status.RANGE
    with pytest.raises(LinkError) as err:
        link.write_mem(MEM_BYTES, b"\x01\x02\x03")           # payload consumed, nothing written
    assert err.value.status == Status.RANGE
    with pytest.raises(LinkError) as err:
        link.read_mem(0xFFFF_FFFF, 2)                        # address + count wraps 32 bits
    assert err.value.status == Status.RANGE
    for offset in (0x1000, 0x2):                              # beyond the register map; unaligned
        with pytest.raises(LinkError) as err:
            link.write_reg(offset, 1)
        assert err.value.status == Status.RANGE
        with pytest.raises(LinkError) as err:
            link.read_reg(offset)
        assert err.value.status == Status.RANGE
    # An unknown opcode, with NOP padding around it.
    link.port.write(b"\x00\x00" + bytes([0x7F]) + header(Opcode.NOP)[1:] + b"\x00")
    assert link._read(1, "bad opcode") == bytes([Status.BAD_OPCODE])
    assert link.ping() == MEM_BYTES
    link.write_mem(0x2000, b"gemforge")
    assert link.read_mem(0x2000, 8) == b"gemforge"
    link.write_mem(0x2000, board.dram[0x2000:0x2008].tobytes())      # back to what the device holds


def test_partial_command_times_out_and_the_host_resyncs(board):
    link = board.link
    link.port.write(header(Opcode.WRITE_MEM, 0x3000, 100)[:5])       # a header cut short
    t0 = time.perf_counter()
    assert link._read(1, "the abandoned command", wire_bytes=0) == bytes([Status.TIMEOUT])
    print(f"idle timeout: {time.perf_counter() - t0:.2f} s of wall time")
    assert link.resync(idle_s=0.0) == MEM_BYTES
    mem = link._command(Opcode.PING, 0, 0, answer=8)
    assert struct.unpack("<II", mem) == (BRIDGE_MAGIC, MEM_BYTES)


def test_faults_are_named_and_the_board_recovers(board):
    rng = np.random.default_rng(9)
    a = rng.integers(-128, 128, (3, 4), dtype=np.int8)
    b = rng.integers(-128, 128, (4, 4), dtype=np.int8)
    op = compile_dense(CONFIG, 3, 4, 4)
    loaded = board.load_program(op.program)
    try:
        with pytest.raises(BoardFaultError, match="EMPTY_PROGRAM") as err:
            board.run(replace(loaded, insn_count=0))
        assert err.value.fault == Fault.EMPTY_PROGRAM
    finally:
        board.unload_program(loaded)

    # A LOAD from beyond the board memory: the memory answers SLVERR, the accelerator BUS_ERROR.
    entry = CONFIG.entry_bytes("inp")
    stream = encode_program([Load(mem=MemType.INP, sram_base=0, dram_base=(MEM_BYTES + 4096) // entry, y_size=1,
                                  x_size=1, x_stride=1), Finish()], CONFIG)
    buf = board.alloc(len(stream), align=64)
    try:
        board.write(buf, stream)
        with pytest.raises(AcceleratorFaultError, match="BUS_ERROR") as err:
            board.run(LoadedProgram(None, buf, buf, 2))
        assert err.value.fault == Fault.BUS_ERROR
    finally:
        board.free(buf)

    c, _ = run_dense(board, a, b)                # the accelerator is ready for the next program
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))


def test_operator_too_large_for_the_board_memory_is_refused(board):
    with pytest.raises(DeviceError, match="board memory"):
        board.alloc(MEM_BYTES)


def test_cli_run_op_on_the_uart_device(board, tmp_path, capsys):
    """`gemforge run-op gemm --device uart:PORT` (the CLI opens its own link to the same terminal)."""
    import json

    from gemforge.driver.tools.cli import main
    rng = np.random.default_rng(10)
    a = rng.integers(-128, 128, (3, 6), dtype=np.int8)
    b = rng.integers(-128, 128, (6, 5), dtype=np.int8)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    code = main(["run-op", "gemm", "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"), "-o",
                 str(tmp_path / "c.npy"), "--config", "tiny", "--device", f"uart:{board.port_name}@115200",
                 "--stats"])
    out, err = capsys.readouterr()
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), a.astype(np.int32) @ b.astype(np.int32))
    assert json.loads(out)["cycles"] > 0


def test_int8_network_through_the_uart_equals_fsim(board):
    """A whole quantized network (its accelerator layers on the board, the rest on the cpu),
    as `gemforge run model.gfm --device uart:PORT` runs it."""
    from gemforge.driver.runtime.model import compile_model
    from onnx_models import small_cnn
    rng = np.random.default_rng(11)
    m = small_cnn(rng, channels=4, image=6, batch="N", residual=False)
    calib = rng.normal(size=(3, 1, 3, 6, 6)).astype(np.float32)
    model = compile_model(m, quantize="int8", calibrate=calib, config=CONFIG, batch=1)
    x = rng.normal(size=(1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(model.run(x, board), model.run(x, "fsim"))
