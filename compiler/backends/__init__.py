"""Back ends consuming the loop IR: ``accel`` (instruction stream for the accelerator).

The CPU and GPU LLVM back ends will live next to it and consume the same IR.
"""

from .accel import ACCEL_STAGES, AccelCompileError, build_program

__all__ = ["build_program", "AccelCompileError", "ACCEL_STAGES"]
