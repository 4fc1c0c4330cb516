"""The UART bridge's wire protocol: opcodes, status codes and sizes (the one definition).

Shared by the gateware (`gemforge.hw.board.bridge`, whose docstring has the
protocol table) and the host (`gemforge.driver.runtime.uart_device`). Pure Python, no
Amaranth, so the host side imports it without the HDL.
"""

from __future__ import annotations

import enum
import struct

__all__ = ["Opcode", "Status", "BRIDGE_MAGIC", "HEADER_BYTES", "header", "IDLE_TIMEOUT_BYTES"]

#: Returned by PING (little-endian u32, reads "GFB1" as bytes), so a host can tell it talks to the bridge.
BRIDGE_MAGIC = 0x31424647
#: Every command but NOP is this many bytes: opcode, address (u32 LE), argument (u32 LE).
HEADER_BYTES = 9
#: A command left incomplete for this many byte times (at the board's baud rate) is abandoned:
#: the bridge answers `Status.TIMEOUT` and waits for a new opcode. Hosts resynchronize by
#: staying silent longer than this (see `gemforge.hw.board.bridge`).
IDLE_TIMEOUT_BYTES = 2048


class Opcode(enum.IntEnum):
    """The first byte of a command."""

    NOP = 0x00        #: one byte, no answer: padding, ignored between commands
    PING = 0x01       #: answer: status, BRIDGE_MAGIC (u32), memory size in bytes (u32)
    WRITE_MEM = 0x02  #: address, count, then count payload bytes; answer: status
    READ_MEM = 0x03   #: address, count; answer: status, then count bytes if OK
    WRITE_REG = 0x04  #: register offset, value; answer: status
    READ_REG = 0x05   #: register offset; answer: status, then the value (u32) if OK
    ZERO_MEM = 0x06   #: address, count: write count zero bytes (at one byte per clock); answer: status


class Status(enum.IntEnum):
    """The answer's first byte. None is zero, so NOP padding never reads as a status."""

    OK = 0xA0         #: done
    BAD_OPCODE = 0xE1  #: unknown opcode (its 8 header bytes were consumed)
    RANGE = 0xE2      #: memory range beyond the board memory, or a register offset beyond the map or unaligned
    BUS_ERROR = 0xE3  #: the AXI4-Lite register slave answered SLVERR or DECERR
    TIMEOUT = 0xE4    #: the command was abandoned: no byte for IDLE_TIMEOUT_BYTES byte times


def header(opcode: Opcode, address: int = 0, argument: int = 0) -> bytes:
    """The 9-byte header of a command."""
    return struct.pack("<BII", int(opcode), address & 0xFFFF_FFFF, argument & 0xFFFF_FFFF)
