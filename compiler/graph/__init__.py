"""The graph level of the compiler: whole networks from ONNX.

`onnx_import` reads an ONNX model into the `ir.Graph`; `passes` (shape
inference, constant folding, BatchNorm folding, fusion), `quantize` (int8 with
power-of-two scales) and `accel` (partitioning, layout packing, memory planning)
transform it, in the order `compile.compile_network` runs them; `cpu_kernels`
compiles its host nodes with the LLVM back ends; `evaluate` is its numpy
reference. The runtime and the ``.gfm`` artefact are `gemforge.driver.runtime`.

The ONNX front end (`onnx_import`, and with it onnx, which takes most of a second to import)
loads when one of its names is first used: a run of a compiled network never needs it.
"""

from typing import Any

from .ir import Graph, GraphError, Node, Value
from .network import CompiledNetwork

__all__ = ["Graph", "GraphError", "Node", "Value", "SUPPORTED_OPS", "import_onnx", "CompiledNetwork",
           "compile_network"]

_FRONT_END = {"SUPPORTED_OPS": "onnx_import", "import_onnx": "onnx_import", "compile_network": "compile"}


def __getattr__(name: str) -> Any:
    if name in _FRONT_END:
        from importlib import import_module
        return getattr(import_module(f".{_FRONT_END[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
