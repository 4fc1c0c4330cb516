"""gemforge.compiler: tensor expressions, schedules, one target-neutral loop IR, back ends.

Top to bottom (see `pipeline`)::

    te (what)  →  schedule (how)  →  lower (bounds inference → verified PrimFunc)
      →  stages(target): the back end's ordered stages
           accel: IR passes (tensorize, ALU/DMA injection, virtual threads, storage)
                  → instructions, micro-ops, dependency tokens → Program
           cpu:   LLVM IR → optimized native code (JIT)
           gpu:   LLVM IR for NVPTX → PTX → CUDA driver

`ir` is the loop IR, `target` the targets, `backends` the back ends, `ops`
the operators with default schedules and their numpy references.
"""

# The folder is installed as gemforge.compiler; imported as `compiler` (from the repository root) its
# modules would form a second tree whose classes differ from gemforge's own.
if __name__ != "gemforge.compiler":
    raise ImportError(f"this folder is the package gemforge.compiler: import gemforge.compiler, not {__name__} "
                      "(`pip install -e .` or `make install` installs it)")

from .ops import (
    CompiledOp, Epilogue, OpError, compile_add, compile_clip, compile_conv2d, compile_dense, compile_max_pool2d,
    compile_relu, conv2d_reference, dense_reference, max_pool2d_reference, run_conv2d, run_dense,
)
from .pipeline import build, lower, run_stages
from .schedule import Schedule, ScheduleError, Stage, create_schedule
from .target import AccelTarget, CpuTarget, GpuTarget, Target, target_of
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
    "Target", "AccelTarget", "CpuTarget", "GpuTarget", "target_of",
    "lower", "build", "run_stages",
]
