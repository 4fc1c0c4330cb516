"""Graph nodes as CPU (and GPU) kernels: each node compiled by the LLVM back end.

`host_kernel` turns one node into a `HostKernel` (`kernels`) by its operator's host lowering
(``OpDef.host``, `operators`): a compiled operator plus its constant operands packed once
(weights in the kernel's layout), run on numpy arrays in the graph's layouts. Operators
that only move or convert data (reshapes, concats, the network's entry quantization and exit
dequantization) have no kernel and run in numpy (``OpDef.move``).
"""

from __future__ import annotations

from ..target import Target
from .ir import Graph, GraphError, Node
from .kernels import HostKernel
from .operators import op_def

__all__ = ["HostKernel", "host_kernel"]


def host_kernel(graph: Graph, node: Node, target: Target, blocked: frozenset[str] = frozenset()) -> HostKernel:
    """Compile ``node`` of ``graph`` for a host ``target`` (cpu or gpu), the values named in
    ``blocked`` in the CPU's blocked image layout (`blocked.plan`), the others in the graph's."""
    from . import blocked as blocked_layout
    kernel = blocked_layout.host_kernel(graph, node, target, blocked) if blocked else None
    if kernel is not None:
        return kernel
    definition = op_def(node)
    if definition.host is None:
        if definition.move is None:
            raise GraphError(f"node {node.name}: no CPU kernel for {node.op}")
        return HostKernel(node, move=definition.move)
    return definition.host(graph, node, target)
