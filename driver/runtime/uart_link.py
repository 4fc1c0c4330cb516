"""The host side of the board's UART bridge protocol (`gemforge.hw.board.bridge`).

`BridgeLink` wraps a pyserial port (any object with ``read``, ``write``,
``reset_input_buffer`` and a ``timeout`` attribute) and offers memory and
register access, each command checked against its status byte. Long
transfers are split into chunks of `CHUNK_BYTES`, so one frame's timeout
stays short and a lost byte costs one chunk.
"""

from __future__ import annotations

import struct
import time

from gemforge.hw.board.protocol import BRIDGE_MAGIC, IDLE_TIMEOUT_BYTES, Opcode, Status, header

__all__ = ["BridgeLink", "LinkError", "CHUNK_BYTES"]

#: The largest payload of one WRITE_MEM or READ_MEM frame (pseudo-terminals buffer about 4 KiB).
CHUNK_BYTES = 1024


class LinkError(RuntimeError):
    """The bridge answered with an error status, or not at all."""

    def __init__(self, message: str, status: Status | None = None):
        super().__init__(message)
        self.status = status


class BridgeLink:
    """Commands to the bridge over ``port``.

    ``timeout_s`` bounds the wait for each answer beyond the time its bytes take
    on the wire at ``baud`` (pseudo-terminals to a simulation are far slower than
    their nominal rate: give them a generous timeout)."""

    def __init__(self, port, baud: int = 115200, timeout_s: float = 2.0):
        self.port = port
        self.baud = baud
        self.timeout_s = timeout_s
        self.bytes_sent = 0
        self.bytes_received = 0
        # Set when an answer was missing or out of step: late bytes may still arrive, so
        # the next command first brings the link back into step (`resync`).
        self.out_of_step = False

    def _wire_s(self, nbytes: int) -> float:
        return nbytes * 10 / self.baud

    def _read(self, nbytes: int, what: str, wire_bytes: int = 0) -> bytes:
        deadline = time.monotonic() + self.timeout_s + 2 * self._wire_s(nbytes + wire_bytes)
        data = b""
        while len(data) < nbytes:
            self.port.timeout = max(0.01, min(0.5, deadline - time.monotonic()))
            data += self.port.read(nbytes - len(data))
            if len(data) < nbytes and time.monotonic() > deadline:
                self.out_of_step = True
                raise LinkError(f"the board did not answer {what}: {len(data)} of {nbytes} bytes after "
                                f"{self.timeout_s + 2 * self._wire_s(nbytes + wire_bytes):.1f} s; check the port "
                                "and the baud rate, and that the board is programmed")
        self.bytes_received += len(data)
        return data

    def _command(self, opcode: Opcode, address: int, argument: int, payload: bytes = b"",
                 answer: int = 0) -> bytes:
        """Send one command; check its status; return its answer's data bytes (``answer`` many)."""
        what = f"{opcode.name} at {address:#x}"
        if self.out_of_step:
            self.out_of_step = False
            self.resync()
        frame = header(opcode, address, argument) + payload
        self.port.write(frame)
        self.bytes_sent += len(frame)
        raw = self._read(1, what, wire_bytes=len(frame))[0]
        try:
            status = Status(raw)
        except ValueError:
            self.out_of_step = True
            raise LinkError(f"{what}: the board answered {raw:#04x}, which is no status; the link is out of "
                            "step (call resync())") from None
        if status != Status.OK:
            raise LinkError(f"{what}{f' ({argument} bytes)' if opcode in (Opcode.WRITE_MEM, Opcode.READ_MEM) else ''}"
                            f": the board answered {status.name}", status)
        return self._read(answer, what) if answer else b""

    # ------------------------------------------------------------------ commands

    def ping(self) -> int:
        """Check the bridge answers with its magic; returns the board memory size in bytes."""
        magic, mem_bytes = struct.unpack("<II", self._command(Opcode.PING, 0, 0, answer=8))
        if magic != BRIDGE_MAGIC:
            raise LinkError(f"PING answered magic {magic:#010x}, expected {BRIDGE_MAGIC:#010x}: not a gemforge "
                            "board bridge")
        return mem_bytes

    def resync(self, idle_s: float | None = None, attempts: int = 3) -> int:
        """Bring the link back into step (see the bridge's protocol): stay silent past the
        bridge's idle timeout and until the line has been quiet for that long (a long READ_MEM
        may still be streaming), drop what has arrived, then PING (up to ``attempts`` times)."""
        quiet = idle_s if idle_s is not None else 2 * self._wire_s(IDLE_TIMEOUT_BYTES) + 0.05
        for attempt in range(attempts):
            time.sleep(quiet)
            while getattr(self.port, "in_waiting", 0):
                self.port.reset_input_buffer()
                time.sleep(quiet)
            self.port.reset_input_buffer()
            self.out_of_step = False
            try:
                return self.ping()
            except LinkError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def write_mem(self, address: int, data: bytes) -> None:
        data = bytes(data)
        for offset in range(0, len(data), CHUNK_BYTES):
            chunk = data[offset:offset + CHUNK_BYTES]
            self._command(Opcode.WRITE_MEM, address + offset, len(chunk), chunk)

    def read_mem(self, address: int, nbytes: int) -> bytes:
        out = bytearray()
        for offset in range(0, nbytes, CHUNK_BYTES):
            n = min(CHUNK_BYTES, nbytes - offset)
            out += self._command(Opcode.READ_MEM, address + offset, n, answer=n)
        return bytes(out)

    def zero_mem(self, address: int, nbytes: int) -> None:
        """Zero ``nbytes`` of board memory (one short command however many bytes)."""
        self._command(Opcode.ZERO_MEM, address, nbytes)

    def write_reg(self, offset: int, value: int) -> None:
        self._command(Opcode.WRITE_REG, offset, value)

    def read_reg(self, offset: int) -> int:
        return struct.unpack("<I", self._command(Opcode.READ_REG, offset, 0, answer=4))[0]
