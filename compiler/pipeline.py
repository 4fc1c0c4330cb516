"""The accelerator compilation pipeline, top to bottom.

::

    schedule ──infer_bounds + schedule_to_ir──▶ loop IR
      tensorize               loops under a tensorize mark → GEMM micro-ops
      inject_alu              element-wise accumulator stages → ALU micro-ops (in place)
      inject_dma              copy nests → 2-D strided DMAs with zero padding
      flatten_storage         entry references → flat entry offsets
      fold_uop_loops          micro-op nests → GEMM/ALU instructions (2 hardware loops + kernel)
      inject_virtual_threads  vthread loops → interleaved, double-buffered copies (interleaving
                              stops at instructions, so it runs after folding)
      allocate_storage        on-chip buffers placed, capacities checked
    ──backends.accel──▶ Program (instructions, de-duplicated micro-ops, tokens, DRAM layout)

`lower` returns the loop IR after the passes; `build` also runs the back end.
Pass ``trace=print`` (or any callable) to see the IR after every pass.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

from gemforge.hw.program import Program
from gemforge.hw.config import AccelConfig

from .backends.accel import build_program
from .ir import Stmt, format_ir
from .lower import schedule_to_ir
from .passes import (
    DEFAULT_UOP_BUDGET, allocate_storage, flatten_storage, fold_uop_loops, inject_alu, inject_dma,
    inject_virtual_threads, tensorize,
)
from .schedule import Schedule
from .te import Tensor

__all__ = ["accel_passes", "lower", "build"]


def accel_passes(config: AccelConfig, uop_budget: int | None = None) -> list[tuple[str, Callable[[Stmt], Stmt]]]:
    """The ordered pass list of the accelerator target."""
    budget = uop_budget if uop_budget is not None else max(1, min(DEFAULT_UOP_BUDGET, config.uop_depth // 4))
    return [
        ("tensorize", tensorize),
        ("inject_alu", inject_alu),
        ("inject_dma", inject_dma),
        ("flatten_storage", flatten_storage),
        ("fold_uop_loops", partial(fold_uop_loops, uop_budget=budget)),
        ("inject_virtual_threads", inject_virtual_threads),
        ("allocate_storage", partial(allocate_storage, config=config)),
    ]


def lower(sch: Schedule, config: AccelConfig, *, uop_budget: int | None = None,
          trace: Callable[[str], None] | None = None) -> Stmt:
    """Schedule → loop IR ready for the accelerator back end."""
    stmt = schedule_to_ir(sch)
    if trace:
        trace(f"== schedule_to_ir\n{format_ir(stmt)}")
    for name, run in accel_passes(config, uop_budget):
        stmt = run(stmt)
        if trace:
            trace(f"== {name}\n{format_ir(stmt)}")
    return stmt


def build(sch: Schedule, config: AccelConfig, tensors: Sequence[Tensor], *,
          uop_budget: int | None = None, trace: Callable[[str], None] | None = None) -> Program:
    """Schedule → runnable `Program` whose DRAM tensors are ``tensors`` (by name)."""
    stmt = lower(sch, config, uop_budget=uop_budget, trace=trace)
    return build_program(stmt, config, [t.buffer for t in tensors])
