"""The `uart` device without a board: its spec string, its errors, and its run protocol against
a fake board in Python (the real board top is co-simulated in tests/sim/test_board_cosim.py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from gemforge.driver.runtime.device import DeviceError, available_backends, open_device
from gemforge.driver.runtime.device import parse_uart_spec
from gemforge.driver.runtime.uart_device import BoardFaultError, UartDevice
from gemforge.hw.board.protocol import BRIDGE_MAGIC, HEADER_BYTES, Opcode, Status
from gemforge.hw.config import PRESETS
from gemforge.hw.regmap import CTRL_BITS, ID_MAGIC, STATUS_BITS, Fault, by_name


def test_uart_backend_is_registered():
    assert "uart" in available_backends()


@pytest.mark.parametrize("spec, expected", [
    ("uart:/dev/ttyUSB1", ("/dev/ttyUSB1", 115200)),
    ("uart:/dev/ttyUSB1@3000000", ("/dev/ttyUSB1", 3000000)),
    ("uart:socket://localhost:7777@9600", ("socket://localhost:7777", 9600)),
    ("COM3@57600", ("COM3", 57600)),
])
def test_spec_strings(spec, expected):
    assert parse_uart_spec(spec) == expected


@pytest.mark.parametrize("spec, message", [
    ("uart:", "needs a port"),
    ("uart:@9600", "needs a port"),
    ("uart:/dev/ttyUSB0@fast", "baud rate must be a positive integer, not 'fast'"),
    ("uart:/dev/ttyUSB0@0", "baud rate must be a positive integer"),
])
def test_bad_spec_strings_are_refused(spec, message):
    with pytest.raises(DeviceError, match=message):
        open_device(spec, "tiny")


def test_a_port_that_does_not_exist_is_named():
    with pytest.raises(DeviceError, match="cannot open serial port '/nonexistent/tty'"):
        open_device("uart:/nonexistent/tty", "tiny")


def test_a_port_without_a_bridge_is_refused():
    """pyserial's loop:// echoes every byte: no status byte ever comes back."""
    with pytest.raises(DeviceError, match="no gemforge board bridge on loop://"):
        open_device("uart:loop://", "tiny", timeout_s=0.2)


# ---------------------------------------------------------------------------- against a fake board


class FakeBoard:
    """A pyserial stand-in answering the bridge protocol from Python: memory, and registers
    whose STATUS after START is ``status_after_start`` (a test's scenario). Not a model of the
    accelerator: it runs nothing."""

    def __init__(self, mem_bytes=16 << 10, ident=ID_MAGIC, status_after_start=0, error=0, error_info=0):
        self.mem = bytearray(mem_bytes)
        self.regs = {by_name("ID").offset: ident, by_name("STATUS").offset: 0,
                     by_name("ERROR").offset: error, by_name("ERROR_INFO").offset: error_info}
        self.status_after_start = status_after_start
        self.ctrl_writes = []
        self.out = bytearray()
        self.timeout = None
        self.is_open = True

    def write(self, frame):
        frame = bytes(frame)
        while frame:
            op, address, argument = struct.unpack("<BII", frame[:HEADER_BYTES])
            frame = frame[HEADER_BYTES:]
            ok = bytes([Status.OK])
            if op == Opcode.PING:
                self.out += ok + struct.pack("<II", BRIDGE_MAGIC, len(self.mem))
            elif op == Opcode.WRITE_MEM:
                self.mem[address:address + argument] = frame[:argument]
                frame = frame[argument:]
                self.out += ok
            elif op == Opcode.ZERO_MEM:
                self.mem[address:address + argument] = bytes(argument)
                self.out += ok
            elif op == Opcode.READ_MEM:
                self.out += ok + self.mem[address:address + argument]
            elif op == Opcode.WRITE_REG:
                if address == by_name("CTRL").offset:
                    self.ctrl_writes.append(argument)
                    if argument >> CTRL_BITS["START"] & 1:
                        self.regs[by_name("STATUS").offset] = self.status_after_start
                else:
                    self.regs[address] = argument
                self.out += ok
            elif op == Opcode.READ_REG:
                self.out += ok + struct.pack("<I", self.regs.get(address, 0))

    def read(self, n):
        data, self.out = bytes(self.out[:n]), self.out[n:]
        return data

    def reset_input_buffer(self):
        self.out.clear()

    def close(self):
        self.is_open = False


def _device(board, **options):
    return UartDevice(PRESETS["tiny"], "fake", serial=board, **options)


def test_fake_board_done_reads_counters_and_write_through():
    board = FakeBoard(status_after_start=1 << STATUS_BITS["DONE"])
    dev = _device(board)
    assert dev.dram_bytes == len(board.mem)
    buf = dev.alloc(100)
    dev.write(buf, np.arange(100, dtype=np.uint8))
    assert board.mem[buf.address:buf.address + 100] == bytes(range(100))      # written through
    board.mem[buf.address + 50] = 0xEE                                         # "the accelerator" changes memory
    result = dev._execute(buf.address, 1)
    assert result.cycles == 0 and "gemm_active" in result.hw_counters
    assert dev.read(buf)[50] == 0xEE                                           # fetched after the run
    assert board.ctrl_writes == [1 << CTRL_BITS["START"]]


def test_fake_board_fault_is_named():
    board = FakeBoard(status_after_start=1 << STATUS_BITS["ERROR"], error=Fault.DEADLOCK, error_info=0)
    dev = _device(board)
    buf = dev.alloc(64)
    with pytest.raises(BoardFaultError, match="fault DEADLOCK") as err:
        dev._execute(buf.address, 1)
    assert err.value.fault == Fault.DEADLOCK


def test_fake_board_run_that_never_ends_is_aborted():
    board = FakeBoard(status_after_start=1 << STATUS_BITS["BUSY"])
    dev = _device(board, run_timeout_s=0.05)
    buf = dev.alloc(64)
    with pytest.raises(DeviceError, match="did not end within 0.05 s; it was aborted"):
        dev._execute(buf.address, 1)
    assert board.ctrl_writes == [1 << CTRL_BITS["START"], 1 << CTRL_BITS["ABORT"]]


def test_fake_board_with_a_wrong_id_is_refused():
    with pytest.raises(DeviceError, match="ID register reads 0x12345678"):
        _device(FakeBoard(ident=0x12345678))


def test_dram_beyond_the_board_memory_is_refused():
    with pytest.raises(DeviceError, match="more than the board's 16384-byte memory"):
        _device(FakeBoard(), dram_bytes=32 << 10)
    dev = _device(FakeBoard())
    with pytest.raises(DeviceError, match="the board memory \\(16384 bytes\\) is the uart device's DRAM"):
        dev.alloc(16 << 10)


def test_never_written_live_bytes_are_zeroed_before_a_run():
    board = FakeBoard(status_after_start=1 << STATUS_BITS["DONE"])
    board.mem[:] = b"\xAA" * len(board.mem)            # left over from an earlier session
    dev = _device(board)
    buf = dev.alloc(256)
    dev.write(buf, b"\x01" * 16, offset=64)
    dev._execute(buf.address, 1)
    assert board.mem[buf.address:buf.address + 64] == bytes(64)
    assert board.mem[buf.address + 64:buf.address + 80] == b"\x01" * 16
    assert board.mem[buf.address + 80:buf.address + 256] == bytes(176)


def test_link_out_of_step_resyncs_before_the_next_command():
    """An answer that comes too late (here: never, then stale bytes) puts the link out of step;
    the next command first resyncs, so a stale byte is never read as a status."""
    from gemforge.driver.runtime.uart_link import BridgeLink, LinkError

    class LateBoard(FakeBoard):
        swallow = True

        def write(self, frame):
            super().write(frame)
            if self.swallow:                  # the answer is lost in flight...
                self.swallow = False
                self.out.clear()
                self.late = b"\xa0\x00\x00\x00"   # ...and stale bytes show up later

        @property
        def in_waiting(self):             # the stale bytes arrive while the host waits for quiet
            if getattr(self, "late", None):
                self.out += self.late
                self.late = None
            return len(self.out)

    board = LateBoard()
    link = BridgeLink(board, timeout_s=0.05)
    with pytest.raises(LinkError, match="did not answer"):
        link.read_reg(by_name("ID").offset)
    assert link.out_of_step
    assert link.read_reg(by_name("ID").offset) == ID_MAGIC      # resynced first, then the real answer
    assert not link.out_of_step and board.late is None          # the stale bytes were dropped, not read


def test_a_run_waits_until_the_accelerator_is_idle_before_start():
    """START is ignored while BUSY: a run after an abort that is still draining waits for it."""
    class DrainingBoard(FakeBoard):
        busy_reads = 3

        def write(self, frame):
            op, address, _ = struct.unpack("<BII", bytes(frame)[:HEADER_BYTES])
            if op == Opcode.READ_REG and address == by_name("STATUS").offset and self.busy_reads:
                self.busy_reads -= 1
                if not self.busy_reads:
                    self.regs[address] = 0
            super().write(frame)

    board = DrainingBoard(status_after_start=1 << STATUS_BITS["DONE"])
    dev = _device(board, poll_interval_s=0)
    board.regs[by_name("STATUS").offset] = 1 << STATUS_BITS["BUSY"] | 1 << STATUS_BITS["ABORTING"]
    buf = dev.alloc(64)
    dev._execute(buf.address, 1)
    assert board.busy_reads == 0 and board.ctrl_writes == [1 << CTRL_BITS["START"]]
