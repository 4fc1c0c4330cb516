"""The board top: the accelerator, block RAM standing in for its DRAM, and a UART bridge.

::

    uart_rx ─► UartRx ─► FIFO ─► Bridge ─► UartTx ─► uart_tx
                                  │   │
                  AXI4-Lite ◄─────┘   └────► byte port ─┐
                      │                                 ▼
                 Accelerator ── m_axi (AXI4) ──────► AxiMemory (block RAM)

The host (`gemforge.driver.runtime.uart_device`, device ``uart:PORT``) writes programs
and data into the memory and pokes the registers through the bridge's protocol
(`gemforge.hw.board.bridge`). Memory addresses are the accelerator's DRAM
addresses, from 0 to ``mem_bytes``; anything beyond answers SLVERR (the
accelerator's BUS_ERROR fault).

``led``: bit 0 the accelerator's interrupt line (DONE or ERROR with
IRQ_ENABLE set), bit 1 a bridge command in progress, bit 2 the bridge's last
status was an error.

Platform wrappers for boards from amaranth-boards are in `gemforge.hw.board.platforms`.
"""

from amaranth import *
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ..config import AccelConfig
from ..gateware.checked import CheckedComponent
from ..gateware.top import Accelerator
from .bridge import Bridge
from .memory import AxiMemory
from .protocol import IDLE_TIMEOUT_BYTES
from .uart import UartRx, UartTx

__all__ = ["BoardTop", "LEDS"]

#: What the LEDs show, by bit.
LEDS = ("irq", "bridge_busy", "bridge_error")


class BoardTop(CheckedComponent):
    """Parameters
    ----------
    config : AccelConfig
    mem_bytes : int
        Board memory size (a power of two, at least 4 KiB).
    clk_hz : int
        Clock frequency.
    baud : int
        UART baud rate; ``clk_hz // baud`` (the clock cycles per bit) must be at least 4.

    Attributes
    ----------
    uart_rx : In(1)
    uart_tx : Out(1)
    led : Out(3)
    """

    @classmethod
    def check_arguments(cls, config, mem_bytes, clk_hz, baud):
        if not isinstance(config, AccelConfig):
            raise TypeError(f"Config must be an AccelConfig, not {config!r}")
        if not isinstance(mem_bytes, int) or mem_bytes < 4096 or mem_bytes & (mem_bytes - 1):
            raise ValueError(f"Memory size must be a power of two of at least 4096 bytes, not {mem_bytes!r}")
        if not isinstance(clk_hz, int) or not isinstance(baud, int) or baud <= 0 or clk_hz // baud < 4:
            raise ValueError(f"The clock ({clk_hz!r} Hz) must be at least 4 times the baud rate ({baud!r})")

    def __init__(self, config, mem_bytes, clk_hz, baud):
        self._config = config
        self._mem_bytes = mem_bytes
        self._clk_hz = clk_hz
        self._baud = baud
        super().__init__({"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1), "led": Out(len(LEDS))})

    @property
    def config(self):
        return self._config

    @property
    def mem_bytes(self):
        return self._mem_bytes

    @property
    def cycles_per_bit(self):
        return self._clk_hz // self._baud

    def elaborate(self, platform):
        m = Module()
        cpb = self.cycles_per_bit
        m.submodules.accel = accel = Accelerator(self._config)
        m.submodules.memory = memory = AxiMemory(self._config.bus_width, self._mem_bytes, len(accel.m_axi.arid))
        m.submodules.bridge = bridge = Bridge(self._mem_bytes, len(accel.s_axil.awaddr),
                                              timeout_cycles=IDLE_TIMEOUT_BYTES * 10 * cpb)
        m.submodules.rx = rx = UartRx(cpb)
        m.submodules.tx = tx = UartTx(cpb)
        # A few bytes of slack, so a byte arriving while the bridge answers is not lost.
        m.submodules.rx_fifo = rx_fifo = fifo.SyncFIFOBuffered(width=8, depth=16)

        wiring.connect(m, accel.m_axi, memory.axi)
        wiring.connect(m, bridge.axil, accel.s_axil)
        wiring.connect(m, bridge.mem, memory.bytes)
        wiring.connect(m, bridge.tx, tx.sink)
        wiring.connect(m, rx.source, rx_fifo.w_stream)
        wiring.connect(m, rx_fifo.r_stream, bridge.rx)
        m.d.comb += [
            rx.rx.eq(self.uart_rx), self.uart_tx.eq(tx.tx),
            self.led.eq(Cat(accel.irq, bridge.busy, bridge.error)),
        ]
        return m
