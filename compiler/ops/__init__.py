"""Operators with default accelerator schedules."""

from .common import CompiledOp, Epilogue, OpError
from .conv2d import compile_conv2d, conv2d_reference, run_conv2d
from .dense import compile_dense, dense_reference, run_dense
from .elementwise import compile_add, compile_clip, compile_max_pool2d, compile_relu, max_pool2d_reference

__all__ = ["CompiledOp", "Epilogue", "OpError", "compile_dense", "run_dense", "dense_reference",
           "compile_conv2d", "run_conv2d", "conv2d_reference",
           "compile_add", "compile_relu", "compile_clip", "compile_max_pool2d", "max_pool2d_reference"]
