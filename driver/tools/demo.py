"""`gemforge demo`: the kit end to end on embedded defaults.

0. A trained network end to end (`demo_network`): Verilog for `default`, the
   digits CNN compiled to int8 for it and run on fsim, Verilator and the CPU,
   accuracy and a per-layer profile.
1. For each preset: compile a dense layer with a fused requantizing epilogue
   (bias, shift, ReLU), show a few of its instructions, run it on the chosen
   device, compare with numpy, and report the counters.
2. Compile a 3x3 convolution for `default`, run it on the chosen device and,
   when Verilator is installed, on the generated RTL with and without latency
   hiding: bit-identical outputs, cycle counts and GEMM-core utilization.
3. Compile the same convolution with the LLVM back ends: run it on this CPU
   (int8, bit-identical to the accelerator, and float32), and generate PTX for
   the GPU, run there when one is present.

With ``--device cpu`` or ``gpu`` only the third part runs.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from gemforge.compiler import compile_dense, dense_reference
from gemforge.hw.asm import disassemble
from gemforge.hw.config import PRESETS

from ..runtime.device import HOST_DEVICES, open_device
from gemforge.compiler import compile_conv2d, conv2d_reference

__all__ = ["run_demo"]

DEMO_SHAPE = (96, 200, 72)  # deliberately not block multiples
DEMO_SHIFT = 9


def run_demo(device_kind: str = "fsim", console: Console | None = None, out_dir=None) -> bool:
    console = console or Console()
    if not console.is_terminal:
        console.width = max(console.width, 110)  # logs and CI: keep table rows unwrapped
    if device_kind in HOST_DEVICES:
        return _demo_llvm(console)
    from .demo_network import DEMO_DIR, demo_network
    network_ok = demo_network(console, device_kind, out_dir or DEMO_DIR)
    console.print("[bold]5. single operators on every preset[/bold]")
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
        dma = sum(v for key, v in counters.items() if key.startswith(("load_bytes", "store_bytes", "dma_bytes")))
        table.add_row(name, f"{config.batch}x{config.block_in}x{config.block_out}", str(counters["insns"]),
                      str(counters["gemm_uops"]), str(counters["alu_uops"]),
                      f"{counters['gemm_uops'] * config.macs_per_uop:,}", f"{dma:,}",
                      "[green]yes[/green]" if ok else "[red]NO[/red]")
    console.print(table)
    verdict = "[green]every result equals numpy[/green]" if all_ok else "[red]results differ from numpy[/red]"
    console.print(f"{len(PRESETS)} configs: {verdict}\n")
    return _demo_conv2d(device_kind, console) and all_ok and network_ok


CONV_SHAPES = ((1, 64, 28, 28), (64, 64, 3, 3))  # NCHW input, OIHW weight; padding 1


def _conv_operands() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The demo convolution's int8 input and weight, int32 bias, and numpy's result
    (padding 1, bias, >> 10, ReLU): the same for every device and back end."""
    x_shape, w_shape = CONV_SHAPES
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, x_shape, dtype=np.int8)
    w = rng.integers(-128, 128, w_shape, dtype=np.int8)
    bias = rng.integers(-5000, 5000, w_shape[0], dtype=np.int32)
    expected = conv2d_reference(x, w, bias, padding=1, shift=10, relu=True)
    return x, w, bias, expected


def _demo_conv2d(device_kind: str, console: Console) -> bool:
    from gemforge.sim.cosim.harness import simulator_available

    config = PRESETS["default"]
    x_shape, w_shape = CONV_SHAPES
    x, w, bias, expected = _conv_operands()
    console.print(f"[bold]conv2d[/bold] {x_shape} * {w_shape}, padding 1, bias, >> 10, ReLU on "
                  f"[cyan]{config.name}[/cyan]")
    devices = [device_kind]
    if device_kind == "fsim" and simulator_available("verilator"):
        devices.append("verilator")
        console.print("[dim]also on the generated Verilog under Verilator (the first run builds "
                      "and caches the simulator, about a minute)[/dim]")
    table = Table("device", "latency hiding", "instructions", "cycles", "GEMM-core utilization", "= numpy")
    ok = True
    for kind in devices:
        with open_device(kind, config) as device:
            for hiding in (True, False):
                op = compile_conv2d(config, x_shape, w_shape, padding=1, bias=True, shift=10, relu=True,
                                    latency_hiding=hiding)
                y, result = op.run(device, x=x, w=w, bias=bias)
                same = bool(np.array_equal(y, expected))
                ok &= same
                cycles = f"{result.cycles:,}" if result.cycles else "-"
                util = "-"
                if result.cycles:  # RTL: cycles the GEMM core multiply-accumulates / all cycles
                    macs = result.hw_counters["gemm_active"] - result.hw_counters["gemm_reset"]
                    util = f"{macs / result.cycles:.1%}"
                table.add_row(kind, "on" if hiding else "off", str(len(op.program.instructions)), cycles, util,
                              "[green]yes[/green]" if same else "[red]NO[/red]")
    console.print(table)
    return _demo_llvm(console) and ok


def _demo_llvm(console: Console) -> bool:
    """The demo convolution through the LLVM back ends (CPU; GPU PTX, run where a GPU is)."""
    import time

    from gemforge.compiler.backends.gpu import cuda
    x_shape, w_shape = CONV_SHAPES
    x, w, bias, expected = _conv_operands()
    xf, wf = x.astype(np.float32) / 64, w.astype(np.float32) / 64
    bf = bias.astype(np.float32) / 4096
    expected_f = conv2d_reference(xf, wf, bf, padding=1, relu=True)
    flops = 2 * np.prod(w_shape) * x_shape[2] * x_shape[3]
    console.print("\n[bold]the same conv2d through the LLVM back ends[/bold] (int8: the accelerator's "
                  "arithmetic, bit for bit; float32: within 1e-4 of numpy)")
    table = Table("target", "type", "method", "time", "GOP/s", "= reference")
    ok = True
    runs = [("cpu", "int8"), ("cpu", "float32")] + ([("gpu", "int8"), ("gpu", "float32")] if cuda.available() else [])
    for kind, dtype in runs:
        epilogue = dict(shift=10) if dtype == "int8" else {}
        with open_device(kind) as device:
            op = compile_conv2d(device.target, x_shape, w_shape, padding=1, dtype=dtype, bias=True, relu=True,
                                **epilogue)
            inputs = dict(x=x, w=w, bias=bias) if dtype == "int8" else dict(x=xf, w=wf, bias=bf)
            op.run(device, **inputs)  # the first run JIT-loads and warms the caches
            start = time.perf_counter()
            y, _ = op.run(device, **inputs)
            seconds = time.perf_counter() - start
        same = bool(np.array_equal(y, expected)) if dtype == "int8" else \
            bool(np.allclose(y, expected_f, rtol=1e-4, atol=1e-4))
        ok &= same
        table.add_row(kind, dtype, str(op.plan.get("method", op.plan.get("tile", ""))), f"{seconds * 1e3:.2f} ms",
                      f"{flops / seconds / 1e9:.0f}", "[green]yes[/green]" if same else "[red]NO[/red]")
    console.print(table)
    if not cuda.available():
        from gemforge.compiler import GpuTarget
        ptx = compile_conv2d(GpuTarget("sm_90"), x_shape, w_shape, padding=1, dtype="int8", bias=True, shift=10,
                             relu=True).program
        checked = "assembled by ptxas" if ptx.cubin is not None else "ptxas not on PATH: not assembled"
        console.print(f"[dim]gpu: no GPU here; the kernel compiles to {len(ptx.ptx.splitlines()):,} lines of PTX "
                      f"for sm_90 ({checked})[/dim]")
    return ok
