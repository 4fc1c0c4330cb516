"""Convolutions with few input channels as a 1×1 convolution over their patches.

The accelerator reduces ``block_in`` channels per micro-op, so a network's first convolution
(3 channels padded to 16 on `default`) leaves most of the core idle: ResNet-18's 7×7 stem ran at
14% useful utilization and took a third of the network's cycles. Its patches — the
C·kh·kw values each output pixel reads, laid out as channels by an ``unfold`` node — make it a
1×1 convolution with C·kh·kw channels (147 of 160 lanes used), its weights the same numbers
reshaped. An int8 convolution sums the same integer products either way, so the result is
bit-identical; only where and how fast it runs change.

The unfold runs on the host, so it is done only where the convolution's input comes from the
host already (the network's entry ``quantize``): no round trip is added.
"""

from __future__ import annotations

from gemforge.hw.config import AccelConfig

from .ir import Graph, Node, Value
from .operators.base import padding

__all__ = ["unfold_small_channel_convs"]

#: The least gain in useful reduction lanes for which a convolution is unfolded.
MIN_GAIN = 1.5


def _lanes_used(channels: int, block: int) -> float:
    return channels / (-(-channels // block) * block)


def unfold_small_channel_convs(graph: Graph, config: AccelConfig) -> Graph:
    """Each int8 one-group convolution of a window larger than 1×1, whose input a host
    ``quantize`` writes and whose patches use ``config``'s reduction lanes at least `MIN_GAIN`
    times better than its channels, becomes ``unfold`` → 1×1 conv2d (weights reshaped)."""
    producer = graph.producer()
    nodes: list[Node] = []
    for node in graph.nodes:
        x = node.inputs[0] if node.op == "conv2d" else None
        w = graph.values[node.inputs[1]].shape if x is not None else None
        if x is None or node.attrs.get("groups", 1) != 1 or w[2] * w[3] == 1 or \
                not graph.is_constant(node.inputs[1]) or getattr(producer.get(x), "op", None) != "quantize" or \
                _lanes_used(w[1] * w[2] * w[3], config.block_in) < MIN_GAIN * _lanes_used(w[1], config.block_in):
            nodes.append(node)
            continue
        source = graph.values[x]
        patches = graph.fresh_name(f"{node.name}/patches")
        unfold = Node("unfold", f"{node.name}/unfold", [x], patches,
                      {"kernel": (w[2], w[3]), "stride": node.attrs["stride"], "padding": padding(node)})
        graph.values[patches] = Value(patches, None, source.dtype, source.exponent)
        weights = graph.constants[node.inputs[1]]
        flat = graph.add_constant(f"{node.inputs[1]}/unfolded", weights.reshape(w[0], -1, 1, 1),
                                  graph.values[node.inputs[1]].exponent)
        conv = Node("conv2d", node.name, [patches, flat, *node.inputs[2:]], node.output,
                    {**{k: v for k, v in node.attrs.items() if k != "auto_pad"}, "stride": 1, "padding": 0})
        nodes += [unfold, conv]
    graph.nodes = nodes
    graph.prune()
    return graph
