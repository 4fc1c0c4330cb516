"""`gemforge generate`: the Verilog top and its companion files for one config.

`generate(config, out_dir)` writes:

* ``gemforge_top.v``  – the accelerator (module ``gemforge_top``; ports ``clk``,
  ``rst`` (synchronous, active high), ``m_axi__*``, ``s_axil__*``, ``irq``);
* ``config.json``     – the `AccelConfig` and its derived parameters;
* ``regmap.md`` and ``gemforge_regs.h`` – the register map (`gemforge.hw.regmap`);
* ``datasheet.md``    – the integration datasheet (`gemforge.hw.datasheet`): ports, clock
  and reset, AXI behaviour, registers, counters, program format, Verilator flags;
* ``files.f``         – the file list for simulators and synthesis tools.

Lint waivers (Amaranth's generated Verilog, not design issues) are listed in
`LINT_WAIVERS` with the reason for each.
"""

from __future__ import annotations

import json
from pathlib import Path

from gemforge.files import write_text_atomic

from .config import AccelConfig
from .datasheet import datasheet
from .isa import derived
from .regmap import to_c_header, to_markdown

__all__ = ["generate", "verilog_top", "rtlil_top", "TOP_NAME", "LINT_WAIVERS", "GENERIC_SYNTH_PASSES",
           "GENERIC_SYNTH_SCRIPT"]

TOP_NAME = "gemforge_top"

#: verilator --lint-only -Wall waivers for Amaranth output, each with its reason.
LINT_WAIVERS: dict[str, str] = {
    "WIDTHEXPAND": "Amaranth widens operands implicitly by its own (well-defined) rules; "
                   "the emitted Verilog leaves the extension to the Verilog rules, which agree",
    "WIDTHTRUNC": "assignments truncate by Amaranth's rules, e.g. wrap-around accumulator sums",
    "UNUSEDSIGNAL": "Amaranth names intermediate signals and keeps unused bits of buses "
                    "(e.g. the high bits of a product that wraps)",
    "CASEINCOMPLETE": "FSM and switch lowering relies on default assignments before the case",
    "PROCASSINIT": "Amaranth emits an initial value and a process assignment for registers",
    "DECLFILENAME": "submodules share one file",
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


def verilog_top(config: AccelConfig) -> str:
    """The accelerator for ``config`` as Verilog text (module `TOP_NAME`)."""
    from amaranth.back import verilog

    from .gateware.top import Accelerator
    return verilog.convert(Accelerator(config), name=TOP_NAME, emit_src=False)


def rtlil_top(config: AccelConfig) -> str:
    """The accelerator for ``config`` as Yosys RTLIL text (module `TOP_NAME`): the netlist the
    Verilog is written from, and what Amaranth's own build flow feeds Yosys. Synthesis reads
    it instead of the Verilog: for `default`, Yosys parses the 2 MB of Verilog in 80 of the
    flow's 230 s, and writing that Verilog takes another 20 s, against 10 s for the RTLIL."""
    from amaranth.back import rtlil

    from .gateware.top import Accelerator
    return rtlil.convert(Accelerator(config), name=TOP_NAME, emit_src=False)


def generate(config: AccelConfig, out_dir: str | Path) -> list[Path]:
    """Write the Verilog top, config JSON, register map (Markdown, C header), datasheet and
    file list to ``out_dir`` (created if needed); returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        f"{TOP_NAME}.v": verilog_top(config),
        "config.json": json.dumps({"config": config.to_dict(), "derived": derived(config)}, indent=2) + "\n",
        "regmap.md": to_markdown(f"gemforge register map ({config.name})"),
        "gemforge_regs.h": to_c_header(),
        "datasheet.md": datasheet(config),
        "files.f": f"{TOP_NAME}.v\n",
    }
    written = []
    for name, text in files.items():
        path = out / name
        write_text_atomic(path, text)
        written.append(path)
    return written
