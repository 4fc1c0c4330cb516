"""Per-layer profiles of a network run: a text table and a PNG of the breakdown."""

from __future__ import annotations

import io
from pathlib import Path

from gemforge.compiler.graph.partition import round_trips
from gemforge.files import write_bytes_atomic

from .device import HOST_DEVICES

__all__ = ["profile_table", "profile_png", "save_profile_png", "profile_totals"]


def profile_totals(rows) -> dict:
    """Sums over a run's layers: time, accelerator cycles, MACs and the network's GEMM utilization."""
    accel = [r for r in rows if r.cycles is not None]
    cycles = sum(r.cycles for r in accel)
    on_accelerator = [r.device not in (*HOST_DEVICES, "host (data)") for r in rows]
    out = {"seconds": round(sum(r.seconds for r in rows), 6), "layers": len(rows),
           "accelerator_layers": sum(on_accelerator), "macs": sum(r.macs for r in rows)}
    if any(on_accelerator):
        out["host_round_trips"] = round_trips(on_accelerator)
        out["accelerator_runs"] = len({r.run for r in rows if r.run is not None})   # program starts
    if accel:
        active = sum((r.gemm_utilization or 0.0) * r.cycles for r in accel)
        out.update(cycles=cycles, gemm_utilization=round(active / cycles, 4) if cycles else None)
    return out


def profile_table(rows) -> str:
    """A fixed-width table: one line per layer, then the totals."""
    head = f"{'layer':28} {'op':11} {'device':12} {'time ms':>9} {'cycles':>11} {'GEMM util':>9} {'MACs':>13}"
    lines = [head, "-" * len(head)]
    for r in rows:
        cycles = f"{r.cycles:,}" if r.cycles is not None else "-"
        util = f"{100 * r.gemm_utilization:.1f}%" if r.gemm_utilization is not None else "-"
        lines.append(f"{r.node[:28]:28} {r.op:11} {r.device:12} {1000 * r.seconds:9.3f} {cycles:>11} {util:>9} "
                     f"{r.macs:13,}")
    t = profile_totals(rows)
    cycles = f"{t['cycles']:,}" if "cycles" in t else "-"
    util = f"{100 * t['gemm_utilization']:.1f}%" if t.get("gemm_utilization") is not None else "-"
    lines.append("-" * len(head))
    lines.append(f"{'total':28} {'':11} {'':12} {1000 * t['seconds']:9.3f} {cycles:>11} {util:>9} {t['macs']:13,}")
    if "host_round_trips" in t:
        lines.append(f"host round trips per inference: {t['host_round_trips']}; accelerator runs (program "
                     f"starts): {t['accelerator_runs']}")
    return "\n".join(lines)


def save_profile_png(rows, path: str | Path, title: str = "per-layer profile") -> None:
    """`profile_png` written to ``path`` atomically."""
    write_bytes_atomic(path, profile_png(rows, title))


def profile_png(rows, title: str = "per-layer profile") -> bytes:
    """A PNG of horizontal bars per layer (accelerator cycles where the device counts them, else
    wall time), coloured by where the layer ran."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.device != "host (data)"]
    by_cycles = any(r.cycles is not None for r in shown)
    colors = {"cpu": "#4c72b0", "gpu": "#55a868"}
    fig, axes = plt.subplots(1, 2 if by_cycles else 1, figsize=(12 if by_cycles else 8, 0.28 * len(shown) + 1.5),
                             squeeze=False)
    names = [r.node for r in shown][::-1]
    ax = axes[0][0]
    ax.barh(names, [1000 * r.seconds for r in shown][::-1],
            color=[colors.get(r.device, "#c44e52") for r in shown][::-1])
    ax.set_xlabel("wall time (ms)")
    ax.set_title(title)
    from matplotlib.patches import Patch
    where = sorted({r.device for r in shown})
    ax.legend(handles=[Patch(color=colors.get(d, "#c44e52"), label=d) for d in where], fontsize=8, loc="lower right")
    if by_cycles:
        ax2 = axes[0][1]
        ax2.barh(names, [r.cycles or 0 for r in shown][::-1], color="#c44e52")
        ax2.set_xlabel("accelerator cycles")
        for i, r in enumerate(shown[::-1]):
            if r.gemm_utilization is not None:
                ax2.text(r.cycles, i, f" {100 * r.gemm_utilization:.0f}%", va="center", fontsize=7)
        ax2.set_title("cycles (GEMM utilization)")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()
