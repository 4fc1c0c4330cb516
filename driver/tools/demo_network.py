"""The demo's end-to-end story: a trained network from ONNX to the generated hardware.

Generate the accelerator's Verilog for `default`; compile the committed digits CNN
(`gemforge.models.digits`, scikit-learn's 8×8 digits) to int8 for it, calibrated
on training images; run the whole test set on fsim, on the generated Verilog under
Verilator (when installed) and on the LLVM CPU back end; print the accuracy of each
next to the float network's, check the int8 outputs are bit-identical everywhere,
and print and plot the per-layer profile of the RTL run.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from gemforge.hw.config import PRESETS
from gemforge.hw.flow.generate import generate

from ..runtime.model import compile_model
from ..runtime.profile import profile_table, profile_totals, save_profile_png

__all__ = ["demo_network", "DEMO_DIR"]

DEMO_DIR = Path("build/demo")


def demo_network(console: Console, device_kind: str = "fsim", out_dir: Path = DEMO_DIR) -> bool:
    from gemforge.models import digits
    from gemforge.sim.cosim.harness import simulator_available

    config = PRESETS["default"]
    console.print("[bold]1. the hardware[/bold]: Verilog for config [cyan]default[/cyan]")
    files = generate(config, out_dir / "rtl")
    console.print(f"   wrote {', '.join(str(f) for f in files[:4])}{' …' if len(files) > 4 else ''}\n")

    x_train, _, x_test, y_test = digits.load_split()
    console.print(f"[bold]2. the network[/bold]: {digits.MODEL_PATH.name}, a CNN trained on scikit-learn's digits "
                  f"(test set: {len(x_test)} images)")
    start = time.perf_counter()
    float_model = compile_model(digits.MODEL_PATH, batch=len(x_test))
    calib = x_train[:len(x_test)][None]            # one calibration batch of training images
    int8_model = compile_model(digits.MODEL_PATH, quantize="int8", calibrate=calib, config=config,
                               batch=len(x_test), report=lambda line: console.print(f"   [dim]{line}[/dim]"))
    console.print(f"   compiled float32 and int8 networks in {time.perf_counter() - start:.1f} s\n")

    console.print("[bold]3. running the test set[/bold]")
    table = Table("network", "device", "accuracy", "time", "int8 = fsim")
    runs = [("float32", float_model, "cpu"), ("int8", int8_model, device_kind)]
    if device_kind == "fsim" and simulator_available("verilator"):
        runs.append(("int8", int8_model, "verilator"))
        console.print("   [dim]the Verilator run builds and caches the simulator first (about a minute, once)[/dim]")
    runs.append(("int8", int8_model, "cpu"))
    results, profiles, ok = {}, {}, True
    for label, model, kind in runs:
        start = time.perf_counter()
        logits = model.run(x_test, kind)
        seconds = time.perf_counter() - start
        results[(label, kind)] = logits
        profiles[kind] = model.last_profile
        same = ""
        if label == "int8":
            equal = bool(np.array_equal(logits, results[("int8", device_kind)]))
            ok &= equal
            same = "[green]yes[/green]" if equal else "[red]NO[/red]"
        table.add_row(label, kind, f"{100 * digits.accuracy(logits, y_test):.2f}%", f"{seconds:.2f} s", same)
    console.print(table)
    float_acc = digits.accuracy(results[("float32", "cpu")], y_test)
    int8_acc = digits.accuracy(results[("int8", device_kind)], y_test)
    console.print(f"   int8 accuracy {100 * int8_acc:.2f}% vs float32 {100 * float_acc:.2f}% "
                  f"({100 * (int8_acc - float_acc):+.2f} points)\n")

    shown = "verilator" if "verilator" in profiles else device_kind
    console.print(f"[bold]4. per-layer profile[/bold] of the int8 network on {shown}")
    console.print(profile_table(profiles[shown]), markup=False, highlight=False)
    totals = profile_totals(profiles[shown])
    if "cycles" in totals:
        console.print(f"   accelerator: {totals['cycles']:,} cycles, GEMM-core utilization "
                      f"{100 * totals['gemm_utilization']:.1f}% over its layers")
    png = out_dir / "digits_profile.png"
    save_profile_png(profiles[shown], png, f"digits CNN, int8, on {shown}")
    console.print(f"   profile plot: {png}\n")
    return ok
