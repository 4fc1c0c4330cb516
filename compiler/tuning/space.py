"""The configurations each tunable operator may take, with its own estimate of each.

- ``cpu.conv2d`` / ``cpu.dense``: the register tile of the product (``mb`` rows × ``vectors``
  vectors of columns, every shape `cpu.tile_shapes` allows on the target's register file) and
  the order its output tiles run in (`cpu.TILE_ORDERS`). The estimate is `cpu.tile_cost`, the
  same one the untuned compile minimizes.
- ``accel.conv2d``: every tiling of the convolution the accelerator's buffers hold, with the
  planner's closed-form cycle estimate (`ops.accel.conv2d.tiling_candidates`, beside the
  planner). The untuned compile takes the best estimate; tuning runs the others on the
  calibrated cycle model.

`features` turns a configuration into the cost model's inputs (`search.CostModel`).
"""

from __future__ import annotations

import math
from typing import Any

from ..ops import cpu as cpu_schedules
from .log import KINDS

__all__ = ["cpu_product_candidates", "features", "describe"]


def cpu_product_candidates(rows: int, cols: int, lanes: int, registers: int) -> list[tuple[dict[str, Any], float]]:
    """Every register tile and tile order of a product of ``rows`` × ``cols`` outputs."""
    out = []
    for mb, vectors in cpu_schedules.tile_shapes(rows, registers):
        estimate = cpu_schedules.tile_cost(rows, cols, lanes, registers, mb, vectors)
        for order in cpu_schedules.TILE_ORDERS:
            out.append(({"mb": mb, "vectors": vectors, "order": order}, estimate))
    return out


def features(kind: str, config: dict[str, Any], estimate: float) -> list[float]:
    """The cost model's inputs for ``config``: the operator's own estimate (its logarithm), then
    what the estimate leaves out: for a CPU tile its rows, vectors, accumulators and order; for an
    accelerator tiling its tile sizes, threads and loop order."""
    base = [1.0, math.log(max(estimate, 1e-30))]
    if kind in KINDS["cpu"]:
        mb, vectors = config["mb"], config["vectors"]
        return base + [mb / 16, vectors / 4, mb * vectors / 24, float(config["order"] == "rows"),
                       float(mb * vectors >= 12), float(mb == 1), float(config.get("method") == "rows"),
                       float(config.get("method") == "columns")]
    sizes = [math.log2(config.get(k, 1)) for k in ("toc", "toh", "tow", "tic", "tkh", "tkw")]
    return base + sizes + [float(config.get("threads", 1) == 2), float(bool(config.get("bias_once"))),
                           float(config.get("order") == "interleaved")]


def describe(kind: str, config: dict[str, Any]) -> str:
    """A configuration in a few words, for progress lines."""
    if kind in KINDS["cpu"]:
        method = f", pixels for {'rows' if config['method'] == 'rows' else 'columns'}" if "method" in config else ""
        return f"{config['mb']}×{config['vectors']} tile, {config['order']} first{method}"
    return ", ".join(f"{k} {v}" for k, v in config.items())
