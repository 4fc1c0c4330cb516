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


def _unfolds(graph: Graph, node: Node, producer: dict[str, Node], config: AccelConfig) -> bool:
    """Whether ``node`` is a one-group int8 convolution of constant weights and a window larger
    than 1×1, fed by a host ``quantize``, whose patches use the reduction lanes `MIN_GAIN` times
    better than its channels."""
    if node.op != "conv2d" or node.attrs.get("groups", 1) != 1 or not graph.is_constant(node.inputs[1]):
        return False
    _, channels, kh, kw = graph.values[node.inputs[1]].shape
    feeder = producer.get(node.inputs[0])
    return kh * kw > 1 and feeder is not None and feeder.op == "quantize" and \
        _lanes_used(channels * kh * kw, config.block_in) >= MIN_GAIN * _lanes_used(channels, config.block_in)


def unfold_small_channel_convs(graph: Graph, config: AccelConfig) -> Graph:
    """Each convolution `_unfolds` picks becomes ``unfold`` → 1×1 conv2d of its weights reshaped."""
    producer = graph.producer()
    nodes: list[Node] = []
    for node in graph.nodes:
        if not _unfolds(graph, node, producer, config):
            nodes.append(node)
            continue
        x, w = graph.values[node.inputs[0]], graph.values[node.inputs[1]]
        patches = graph.fresh_name(f"{node.name}/patches")
        graph.values[patches] = Value(patches, None, x.dtype, x.exponent)
        flat = graph.add_constant(f"{w.name}/unfolded", graph.constants[w.name].reshape(w.shape[0], -1, 1, 1),
                                  w.exponent)
        nodes.append(Node("unfold", f"{node.name}/unfold", [x.name], patches,
                          {"kernel": tuple(w.shape[2:]), "stride": node.attrs["stride"], "padding": padding(node)}))
        nodes.append(Node("conv2d", node.name, [patches, flat, *node.inputs[2:]], node.output,
                          {**{k: v for k, v in node.attrs.items() if k != "auto_pad"}, "stride": 1, "padding": 0}))
    graph.nodes = nodes
    graph.prune()
    return graph
