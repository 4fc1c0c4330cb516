"""`gemforge generate`: the Verilog top and its companion files for one config.

`generate(config, out_dir)` writes:

* ``gemforge_top.v``  – the accelerator (module ``gemforge_top``; ports ``clk``,
  ``rst`` (synchronous, active high), ``m_axi__*``, ``s_axil__*``, ``irq``);
* ``config.json``     – the `AccelConfig` and its derived parameters;
* ``regmap.md`` and ``gemforge_regs.h`` – the register map (`gemforge.hw.regmap`);
* ``gemforge_params.h`` – the config, its derived parameters and the instruction and micro-op
  field layout as C macros (`gemforge.hw.params_header`);
* ``datasheet.md``    – the integration datasheet (`gemforge.hw.flow.datasheet`): ports, clock
  and reset, AXI behaviour, registers, counters, program format, Verilator flags;
* ``files.f``         – the file list for simulators and synthesis tools.

Lint waivers (Amaranth's generated Verilog, not design issues) are listed in
`LINT_WAIVERS` with the reason for each.
"""

from __future__ import annotations

import json
from pathlib import Path

from gemforge.files import write_text_atomic

from ..config import AccelConfig
from .datasheet import datasheet
from ..isa import derived
from ..params_header import config_header
from ..regmap import to_c_header, to_markdown

__all__ = ["generate", "verilog_top", "convert_verilog", "rtlil_top", "TOP_NAME", "LINT_WAIVERS",
           "GENERIC_SYNTH_PASSES", "GENERIC_SYNTH_SCRIPT", "MAX_GENERATED_MACS"]

TOP_NAME = "gemforge_top"

#: verilator --lint-only -Wall waivers for Amaranth output, each with its reason.
LINT_WAIVERS: dict[str, str] = {
    "WIDTHEXPAND": "Amaranth widens operands implicitly by its own (well-defined) rules; "
                   "the emitted Verilog leaves the extension to the Verilog rules, which agree",
    "WIDTHTRUNC": "assignments truncate by Amaranth's rules, e.g. wrap-around accumulator sums",
    "UNUSEDSIGNAL": "Amaranth names intermediate signals and keeps unused bits of buses "
                    "(e.g. the high bits of a product that wraps)",
    "PROCASSINIT": "Amaranth emits an initial value and a process assignment for registers",
    "DECLFILENAME": "submodules share one file",
    "ASCRANGE": "with a command queue of depth 2, Amaranth's buffered FIFO holds a one-entry FIFO whose "
                "unused zero-width address wires Yosys writes as `[-1:0]`",
}


#: Target-independent Yosys synthesis of the generated top: the whole `synth` flow (coarse
#: optimisation, memory inference, fine techmap) except `memory_map`, so the buffers stay
#: `$mem` cells (block RAM or SRAM macros on a real target) instead of becoming hundreds of
#: thousands of flip-flops, and except ABC, whose run on the GEMM array's generic gates
#: takes hours; `check -assert` fails on any problem. `gemforge synth` runs these passes on
#: the RTLIL netlist (`rtlil_top`); `GENERIC_SYNTH_SCRIPT` runs them on the generated Verilog.
GENERIC_SYNTH_PASSES = (f"synth -top {TOP_NAME} -run :fine; opt -fast -full; "
                        "techmap; opt -fast; hierarchy -check; stat; check -assert")
GENERIC_SYNTH_SCRIPT = f"read_verilog {TOP_NAME}.v; {GENERIC_SYNTH_PASSES}"


#: Yosys passes from the RTLIL netlist to the Verilog text. Amaranth's own `verilog.convert`
#: keeps its combinational processes as ``always @*`` blocks (``proc -nomux``), each woken at
#: time 0 only by a dummy ``reg ... = 0`` initializer's update event. Verilog-2005 gives that
#: event; SystemVerilog does not (a variable's initializer runs before time 0, silently), so a
#: simulator compiling the file as SystemVerilog, as cocotb's Icarus flow does with ``-g2012``,
#: leaves every such block unevaluated until an input changes: after reset the AXI valids and
#: BREADY read X and the first handshake never completes. Lowering the processes fully
#: (``proc``) leaves only continuous assignments, which every simulator evaluates at time 0,
#: and clocked ``always`` blocks, so the one file behaves the same under either standard.
#: Without ``-norename``: the multiplexers' functions get Yosys's ``_N_`` names (``$procmux$N``
#: is no legal Verilog identifier); the design's own signal names are kept. ``-noparallelcase``
#: writes each one-hot multiplexer's cases as exact one-hot patterns (``2'b01``, ``2'b10``),
#: which do not overlap (Verilator's CASEOVERLAP). Verilator also runs this form about twice as
#: fast as the ``always @*`` one and builds it in half the time (with the -O2 build of
#: `gemforge.sim.cosim.harness`: 241,181 simulated cycles/s on `default`'s GEMM-bound run in
#: BENCHMARKS.md, 107,676 before both).
VERILOG_PASSES = ("proc -norom", "memory_collect", "write_verilog -noparallelcase")


def convert_verilog(design, name: str) -> str:
    """``design`` (an Amaranth elaboratable) as Verilog text, module ``name``, by
    `VERILOG_PASSES` with the Yosys Amaranth itself uses (`verilog.convert` takes options for
    ``write_verilog`` only, not the passes before it, hence Amaranth's toolchain lookup)."""
    from amaranth._toolchain.yosys import find_yosys
    from amaranth.back import rtlil

    text = rtlil.convert(design, name=name, emit_src=False)
    yosys = find_yosys(lambda version: version >= (0, 40))   # Amaranth's own requirement
    script = "\n".join([f"read_rtlil <<rtlil\n{text}\nrtlil", *VERILOG_PASSES])
    return yosys.run(["-q", "-"], script, ignore_warnings=True)


#: The largest GEMM core (multipliers per micro-op) generated as gateware: elaboration and
#: conversion grow with the core (`large`, 1,024, takes about 30 s; this, some 10 minutes). fsim
#: and the compiler take any valid config.
MAX_GENERATED_MACS = 16_384


def _check_generatable(config: AccelConfig) -> None:
    from ..config import ConfigError
    if config.macs_per_uop > MAX_GENERATED_MACS:
        raise ConfigError(f"config {config.name!r} has a {config.batch}×{config.block_in}×{config.block_out} core "
                          f"({config.macs_per_uop:,} multipliers); gemforge generates gateware for cores of up to "
                          f"{MAX_GENERATED_MACS:,}")


def verilog_top(config: AccelConfig) -> str:
    """The accelerator for ``config`` as Verilog text (module `TOP_NAME`)."""
    from ..gateware.top import Accelerator
    _check_generatable(config)
    return convert_verilog(Accelerator(config), TOP_NAME)


def rtlil_top(config: AccelConfig) -> str:
    """The accelerator for ``config`` as Yosys RTLIL text (module `TOP_NAME`): the netlist the
    Verilog is written from, and what Amaranth's own build flow feeds Yosys. Synthesis reads
    it instead of the Verilog: for `default`, Yosys parses the 2 MB of Verilog in 80 of the
    flow's 230 s, and writing that Verilog takes another 20 s, against 10 s for the RTLIL."""
    from amaranth.back import rtlil

    from ..gateware.top import Accelerator
    _check_generatable(config)
    return rtlil.convert(Accelerator(config), name=TOP_NAME, emit_src=False)


def generate(config: AccelConfig, out_dir: str | Path) -> list[Path]:
    """Write the Verilog top, config JSON, register map (Markdown, C header), parameter C
    header, datasheet and file list to ``out_dir`` (created if needed); returns the paths
    written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        f"{TOP_NAME}.v": verilog_top(config),
        "config.json": json.dumps({"config": config.to_dict(), "derived": derived(config)}, indent=2) + "\n",
        "regmap.md": to_markdown(f"gemforge register map ({config.name})"),
        "gemforge_regs.h": to_c_header(),
        "gemforge_params.h": config_header(config),
        "datasheet.md": datasheet(config),
        "files.f": f"{TOP_NAME}.v\n",
    }
    # All or nothing: a path that cannot take its file is found before any is replaced, so a
    # failure never leaves new Verilog beside an old datasheet.
    for name in files:
        if (out / name).is_dir():
            raise IsADirectoryError(21, "is a directory, not a file to write", str(out / name))
    written = []
    for name, text in files.items():
        path = out / name
        write_text_atomic(path, text)
        written.append(path)
    return written
