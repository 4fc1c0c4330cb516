"""Where a float32 network's images stay in the CPU's blocked layout between layers.

A convolution on the CPU runs fastest with its images as (N, C/16, H, W, 16) (NCHW16c,
`ops.nn.CHANNEL_BLOCK`): a pixel's 16 channels are one AVX-512 vector, so the product broadcasts
an input value and multiplies a vector of weights, and stores whole vectors of its output
(ResNet-18's 3×3 layers: 7–20% faster than reading and writing NCHW; a stride-2 one, whose
windows NCHW copies into an im2col matrix, 20%). The gain is lost if every layer converts its
input and output, so, as TVM's ``AlterOpLayout`` and oneDNN's graph mode do, the layout is
chosen for the whole network and converted only at its edges.

`plan` decides which values are blocked. An operator takes part through its `OpDef.blocked`
form: the inputs whose layout must be its output's (``tied``: an element-wise operand, a pooled
image, a convolution's residual) and those that may be either (``free``: a convolution reads
NCHW or blocked input alike, converting while it copies its padded image). A value is blocked
when its producer can write it so, it is a float32 image of more than one pixel, it is not a
network output, and every reader takes it blocked; the tied positions are then made to agree (a
value failing them goes back to NCHW, which may send others back, until nothing changes). An
image whose channels are no multiple of 16 ends in a partial block, padded with zeros: only
operators that keep those zeros write it and only those that read them as zeros take it (a
convolution, whose weights there are zero; a pool; a ReLU; not a sigmoid, whose value at 0 is not 0,
nor a division). A one-pixel image is the same bytes in both layouts, so a global pool's output
is NCHW at no cost.

`host_kernel` compiles a node for the layouts its values got. The CPU runs of a network without
an accelerator use it (`driver.runtime.model`); the GPU, and the CPU beside an accelerator or a
GPU, keep NCHW.
"""

from __future__ import annotations

from ..ops.nn import CHANNEL_BLOCK
from ..target import Target
from .ir import Graph, Node
from .kernels import HostKernel
from .operators import op_def
from .operators.base import BlockedForm

__all__ = ["plan", "host_kernel", "forms"]


def forms(graph: Graph) -> dict[str, BlockedForm | None]:
    """Each node's blocked form (`OpDef.blocked`), by its output; None where it runs in NCHW only."""
    out = {}
    for node in graph.nodes:
        rule = op_def(node).blocked
        out[node.output] = rule.form(graph, node) if rule is not None else None
    return out


def _image(graph: Graph, name: str) -> bool:
    """A float32 image of more than one pixel."""
    value = graph.values.get(name)
    shape = value.shape if value is not None else None
    return shape is not None and len(shape) == 4 and value.dtype == "float32" and shape[2] * shape[3] > 1


def plan(graph: Graph) -> frozenset[str]:
    """The values of ``graph`` held in the blocked layout on the CPU (module docstring)."""
    form = forms(graph)
    outputs = set(graph.outputs)

    def partial(name: str) -> bool:
        return graph.values[name].shape[1] % CHANNEL_BLOCK != 0
    blocked = {node.output for node in graph.nodes
               if form[node.output] is not None and node.output not in outputs and node.output not in graph.constants
               and _image(graph, node.output) and (form[node.output].partial or not partial(node.output))}
    changed = True
    while changed:
        changed = False
        for node in graph.nodes:
            tied, free, takes_partial = form[node.output] or BlockedForm(())
            for index, name in enumerate(node.inputs):
                if name in blocked and not ((index in free or (index in tied and node.output in blocked))
                                            and (takes_partial or not partial(name))):
                    blocked.discard(name)
                    changed = True
            if node.output in blocked and any(node.inputs[i] not in blocked for i in tied):
                blocked.discard(node.output)
                changed = True
    return frozenset(blocked)


def host_kernel(graph: Graph, node: Node, target: Target, blocked: frozenset[str]) -> HostKernel | None:
    """``node``'s CPU kernel for the layouts ``blocked`` (`plan`) gives its values, or None where
    they are all NCHW (its ordinary kernel)."""
    inputs = tuple(name in blocked for name in node.inputs)
    out = node.output in blocked
    if not out and not any(inputs):
        return None
    return op_def(node).blocked.host(graph, node, target, inputs, out)
