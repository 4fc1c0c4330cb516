"""cocotb testbench of the board top: a pseudo-terminal bridged to its UART pins.

Loaded by the simulator through `gemforge.sim.cosim.board`, never imported by
users. The testbench opens a pseudo-terminal, writes the path of its slave
side to ``$GEMFORGE_BOARD_PTY`` and then, until ``$GEMFORGE_BOARD_STOP``
exists: bytes the host writes are bit-banged onto ``uart_rx`` (8N1, one
timer per bit), and ``uart_tx`` is sampled at the middle of each bit and the
bytes written back to the host. Python runs per bit, never per clock cycle;
between bytes the simulation runs freely, so the accelerator computes while
the host waits.
"""

import os
import time
import tty

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge, Timer

PERIOD_NS = 10
#: Simulated time between looks at the terminal while nothing arrives, in bit times.
IDLE_BITS = 20


@cocotb.test()
async def serve(dut):
    cpb = int(os.environ["GEMFORGE_BOARD_CPB"])
    stop_file = os.environ["GEMFORGE_BOARD_STOP"]
    wall_limit = time.monotonic() + float(os.environ.get("GEMFORGE_BOARD_MAX_S", "1800"))
    bit_ns = cpb * PERIOD_NS
    Clock(dut.clk, PERIOD_NS, unit="ns").start(start_high=False)
    dut.uart_rx.value = 1
    dut.rst.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    master, slave = os.openpty()
    tty.setraw(slave)
    os.set_blocking(master, False)
    tmp = os.environ["GEMFORGE_BOARD_PTY"] + ".tmp"
    with open(tmp, "w") as f:
        f.write(os.ttyname(slave) + "\n")
    os.replace(tmp, os.environ["GEMFORGE_BOARD_PTY"])
    cocotb.start_soon(_transmit_to_host(dut, master, bit_ns))

    pending = b""
    looks = 0
    while True:
        if not pending:
            try:
                pending = os.read(master, 4096)
            except (BlockingIOError, OSError):   # nothing yet (EIO: no host has the terminal open)
                pending = b""
        if pending:
            byte, pending = pending[0], pending[1:]
            for level in (0, *((byte >> i) & 1 for i in range(8)), 1):
                dut.uart_rx.value = level
                await Timer(bit_ns, unit="ns")
            continue
        await Timer(IDLE_BITS * bit_ns, unit="ns")
        looks += 1
        if looks % 64 == 0 and (os.path.exists(stop_file) or time.monotonic() > wall_limit):
            break
    os.close(master)
    os.close(slave)


async def _transmit_to_host(dut, master, bit_ns):
    """Sample ``uart_tx`` at the middle of each bit (a quarter clock off the edges) and
    write each byte to the terminal."""
    while True:
        await FallingEdge(dut.uart_tx)
        await Timer(bit_ns // 2 + PERIOD_NS // 4, unit="ns")
        if int(dut.uart_tx.value):
            continue                 # not a start bit
        byte = 0
        for i in range(8):
            await Timer(bit_ns, unit="ns")
            byte |= int(dut.uart_tx.value) << i
        await Timer(bit_ns, unit="ns")          # the middle of the stop bit
        try:
            os.write(master, bytes([byte]))
        except OSError:
            pass
