"""The graph level of the compiler: whole networks from ONNX.

`onnx_import` reads an ONNX model into the `ir.Graph`; `passes` (shape
inference, constant folding, BatchNorm folding, fusion), `quantize` (int8 with
power-of-two scales) and `accel` (partitioning, layout packing, memory planning)
transform it, in the order `compile.compile_network` runs them; `cpu_kernels`
compiles its host nodes with the LLVM back ends; `evaluate` is its numpy
reference. The runtime and the ``.gfm`` artefact are `gemforge.driver.runtime.model`.
"""

from .compile import CompiledNetwork, compile_network
from .ir import Graph, GraphError, Node, Value
from .onnx_import import SUPPORTED_OPS, import_onnx

__all__ = ["Graph", "GraphError", "Node", "Value", "SUPPORTED_OPS", "import_onnx", "CompiledNetwork",
           "compile_network"]
