"""`gemforge demo`: the kit end to end on embedded defaults.

For each preset: compile a dense layer with a fused requantizing epilogue
(bias, shift, ReLU), show a few of its instructions, run it on the chosen
device, compare with numpy, and report the counters.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from gemforge.compiler import compile_dense, dense_reference
from gemforge.hw.asm import disassemble
from gemforge.hw.config import PRESETS

from .device import open_device

__all__ = ["run_demo"]

DEMO_SHAPE = (96, 200, 72)  # deliberately not block multiples
DEMO_SHIFT = 9


def run_demo(device_kind: str = "fsim", console: Console | None = None) -> bool:
    console = console or Console()
    if not console.is_terminal:
        console.width = max(console.width, 110)  # logs and CI: keep table rows unwrapped
    m, k, n = DEMO_SHAPE
    rng = np.random.default_rng(2026)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    bias = rng.integers(-20000, 20000, n, dtype=np.int32)
    expected = dense_reference(a, b, bias, shift=DEMO_SHIFT, relu=True)
    console.print(f"[bold]gemforge demo[/bold]: C = relu(clip((A @ B + bias) >> {DEMO_SHIFT})) with "
                  f"A {m}x{k}, B {k}x{n} (int8 -> int8) on device [cyan]{device_kind}[/cyan], "
                  "checked against numpy\n")
    table = Table("config", "core", "instructions", "GEMM uops", "ALU uops", "MACs", "DMA bytes", "= numpy")
    all_ok = True
    for name, config in PRESETS.items():
        op = compile_dense(config, m, k, n, bias=True, shift=DEMO_SHIFT, relu=True)
        if name == "tiny":
            listing = disassemble(op.program).splitlines()
            console.print(f"[dim]first instructions of the {name} program:[/dim]")
            for line in [ln for ln in listing if ln and not ln.startswith((".", "#", ";"))][:6]:
                console.print(f"  [green]{line}[/green]")
            console.print()
        with open_device(device_kind, config) as device:
            c, result = op.run(device, a=a, b=b, bias=bias)
        ok = bool(np.array_equal(c, expected))
        all_ok &= ok
        counters = result.counters
        dma = sum(v for key, v in counters.items() if key.startswith(("load_bytes", "store_bytes")))
        table.add_row(name, f"{config.batch}x{config.block_in}x{config.block_out}", str(counters["insns"]),
                      str(counters["gemm_uops"]), str(counters["alu_uops"]), f"{counters['macs']:,}", f"{dma:,}",
                      "[green]yes[/green]" if ok else "[red]NO[/red]")
    console.print(table)
    verdict = "[green]every result equals numpy[/green]" if all_ok else "[red]results differ from numpy[/red]"
    console.print(f"{len(PRESETS)} configs: {verdict}")
    return all_ok
