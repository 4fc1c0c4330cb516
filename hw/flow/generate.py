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

The Verilog comes from `gemforge.hw.flow.verilog`, which also lists its lint waivers
(Amaranth's generated Verilog, not design issues) with the reason for each.
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
from .verilog import TOP_NAME, verilog_top

__all__ = ["generate"]

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
