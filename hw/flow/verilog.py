"""The accelerator as Verilog (and RTLIL) text: its module name, how it is converted, and the
lint waivers its Verilog needs.

`verilog_top(config)` is the text `gemforge generate` writes and the co-simulations build;
`rtlil_top(config)` the netlist synthesis reads; `convert_verilog` any elaboratable by the same
Yosys passes (`VERILOG_PASSES`), which the board co-simulation uses for its board top.
"""

from __future__ import annotations

from ..config import AccelConfig

__all__ = ["verilog_top", "rtlil_top", "convert_verilog", "TOP_NAME", "LINT_WAIVERS", "VERILOG_PASSES",
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
