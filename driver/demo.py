"""`gemforge demo`: the kit end to end on embedded defaults.

For each preset: build the GEMM program, show a few of its instructions,
run it on the chosen device, compare with numpy, and report the counters.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from gemforge.compiler.hand_gemm import build_gemm_program, pack_a, pack_b, unpack_c
from gemforge.hw.asm import disassemble
from gemforge.hw.config import PRESETS

from .device import open_device

__all__ = ["run_demo"]

DEMO_SHAPE = (96, 200, 72)  # deliberately not block multiples


def run_demo(device_kind: str = "fsim", console: Console | None = None) -> bool:
    console = console or Console()
    m, k, n = DEMO_SHAPE
    rng = np.random.default_rng(2026)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    expected = a.astype(np.int32) @ b.astype(np.int32)
    console.print(f"[bold]gemforge demo[/bold]: C = A @ B with A {m}x{k}, B {k}x{n} (int8 -> int32) "
                  f"on device [cyan]{device_kind}[/cyan], checked against numpy\n")
    table = Table("config", "core", "instructions", "GEMM uops", "MACs", "DMA bytes", "= numpy")
    all_ok = True
    for name, config in PRESETS.items():
        program = build_gemm_program(config, m, k, n)
        if name == "tiny":
            listing = disassemble(program).splitlines()
            console.print(f"[dim]first instructions of the {name} program:[/dim]")
            for line in [ln for ln in listing if ln and not ln.startswith((".", "#", ";"))][:6]:
                console.print(f"  [green]{line}[/green]")
            console.print()
        with open_device(device_kind, config) as device:
            out, result = device.run_program(
                program, {"a": pack_a(config, a), "b": pack_b(config, b)}, ["c"])
        c = unpack_c(config, out["c"], m, n)
        ok = bool(np.array_equal(c, expected))
        all_ok &= ok
        counters = result.counters
        dma = sum(v for key, v in counters.items() if key.startswith(("load_bytes", "store_bytes")))
        table.add_row(name, f"{config.batch}x{config.block_in}x{config.block_out}", str(counters["insns"]),
                      str(counters["gemm_uops"]), f"{counters['macs']:,}", f"{dma:,}",
                      "[green]yes[/green]" if ok else "[red]NO[/red]")
    console.print(table)
    verdict = "[green]every result equals numpy[/green]" if all_ok else "[red]results differ from numpy[/red]"
    console.print(f"{len(PRESETS)} configs: {verdict}")
    return all_ok
