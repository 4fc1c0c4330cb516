"""gemforge.compiler: tensor expressions, schedules, one loop IR, passes and back ends.

Top to bottom (see `pipeline`)::

    te (what)  →  schedule (how)  →  lower (bounds inference, loop IR)
      →  passes: tensorize, inject_alu, inject_dma, flatten_storage, fold_uop_loops,
                 inject_virtual_threads, allocate_storage
      →  backends.accel: instructions, de-duplicated micro-ops, dependency tokens, DRAM layout
      →  Program (runs on any Device)

Operators with default schedules are in `ops` (dense, conv2d, add/relu/clip,
max_pool2d); host packing helpers in `layout`.
"""

from .ops import (
    CompiledOp, Epilogue, OpError, compile_add, compile_clip, compile_conv2d, compile_dense,
    compile_max_pool2d, compile_relu, conv2d_reference, dense_reference, max_pool2d_reference,
    run_conv2d, run_dense,
)
from .pipeline import accel_passes, build, lower
from .schedule import Schedule, ScheduleError, Stage, create_schedule
from .te import TeError, compute, pad, placeholder, reduce_axis, sum_

__all__ = [
    # operators
    "CompiledOp", "Epilogue", "OpError",
    "compile_dense", "run_dense", "dense_reference",
    "compile_conv2d", "run_conv2d", "conv2d_reference",
    "compile_add", "compile_relu", "compile_clip", "compile_max_pool2d", "max_pool2d_reference",
    # the compiler itself
    "placeholder", "compute", "reduce_axis", "sum_", "pad", "TeError",
    "create_schedule", "Schedule", "Stage", "ScheduleError",
    "lower", "build", "accel_passes",
]
