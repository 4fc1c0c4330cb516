"""Operators with default accelerator schedules, on its packed layouts.

`dense` and `conv2d` tile their outputs for the config's buffers (chosen by the
pipeline cost model in `common`), run the reduction on the GEMM core and the
fused epilogue on the ALU; `elementwise` has add/relu/clip and max pooling
on accumulator-width tensors.
"""

from .conv2d import compile_conv2d, conv2d_schedule, conv2d_te, plan_conv2d
from .dense import compile_dense, dense_schedule, dense_te, plan_dense
from .elementwise import compile_add, compile_clip, compile_max_pool2d, compile_relu

__all__ = ["compile_dense", "dense_te", "dense_schedule", "plan_dense",
           "compile_conv2d", "conv2d_te", "conv2d_schedule", "plan_conv2d",
           "compile_add", "compile_relu", "compile_clip", "compile_max_pool2d"]
