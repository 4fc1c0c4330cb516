"""Operators: tensor expressions with default schedules, and their numpy references.

``accel`` holds the accelerator's operators (packed layouts, tilings from its
pipeline cost model); `reference` the numpy references every target is
checked against; `common` the fused epilogue and the compiled-operator handle.
"""

from .accel import (
    compile_add, compile_clip, compile_conv2d, compile_dense, compile_max_pool2d, compile_relu, run_conv2d,
    run_dense,
)
from .common import CompiledOp, Epilogue, OpError
from .reference import (
    avg_pool2d_reference, conv2d_reference, dense_reference, elementwise_reference, max_pool2d_reference,
    softmax_reference,
)

__all__ = ["CompiledOp", "Epilogue", "OpError", "compile_dense", "run_dense", "dense_reference",
           "compile_conv2d", "run_conv2d", "conv2d_reference",
           "compile_add", "compile_relu", "compile_clip", "compile_max_pool2d", "max_pool2d_reference",
           "avg_pool2d_reference", "softmax_reference", "elementwise_reference"]
