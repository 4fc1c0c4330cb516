"""A dense layer of a flattened 1×1 image as a 1×1 convolution, flattened after.

A classifier ends ``global pool → flatten → dense``. On the accelerator the pool's output is
packed as an image of channel blocks and the dense layer's input as a matrix of channel
blocks; the flatten between them is a move on the host, so an inference that runs every
layer on the accelerator still left it there and came back. A dense layer over the channels
of an (N, C, 1, 1) image is the 1×1 convolution of that image with its weights transposed:
the same integer products summed in the same int32, the same bias, shift and ReLU, so the
result is bit-identical. Rewritten so, the convolution reads the pool's output where the pool
wrote it and the flatten moves after the last accelerator layer, on the way out.

Done only with a config (the rewrite is for the accelerator's layouts), and only where the
flatten's result has no other reader.
"""

from __future__ import annotations

from .ir import Graph, Node, Value

__all__ = ["dense_of_pixels_as_conv"]


def _flattened_pixels(graph: Graph, node: Node, producer: dict[str, Node], readers: dict[str, list[Node]]
                      ) -> Node | None:
    """The reshape that flattens the (N, C, 1, 1) image ``node`` (an int8 dense layer of
    constant weights) reads, when the layer is its only reader."""
    if node.op != "dense" or not graph.is_constant(node.inputs[1]) or graph.values[node.inputs[0]].dtype != "int8":
        return None
    flatten = producer.get(node.inputs[0])
    if flatten is None or flatten.op != "reshape" or len(readers.get(flatten.output, [])) != 1:
        return None
    image, flat = graph.values[flatten.inputs[0]].shape, graph.values[flatten.output].shape
    if len(image) != 4 or tuple(image[2:]) != (1, 1) or tuple(flat) != tuple(image[:2]):
        return None
    return flatten


def dense_of_pixels_as_conv(graph: Graph) -> Graph:
    """Each int8 dense layer `_flattened_pixels` finds becomes a 1×1 conv2d of the image, then
    the flatten of its (N, O, 1, 1) result into the layer's (N, O) output."""
    producer, readers = graph.producer(), graph.consumers()
    nodes: list[Node] = []
    for node in graph.nodes:
        flatten = _flattened_pixels(graph, node, producer, readers)
        if flatten is None:
            nodes.append(node)
            continue
        image, w, out = graph.values[flatten.inputs[0]], graph.values[node.inputs[1]], graph.values[node.output]
        (k, o), n = w.shape, image.shape[0]
        kernel = graph.add_constant(f"{w.name}/as_conv", graph.constants[w.name].T.reshape(o, k, 1, 1).copy(),
                                    w.exponent)
        pixels = graph.fresh_name(f"{node.output}/pixels")
        graph.values[pixels] = Value(pixels, (n, o, 1, 1), out.dtype, out.exponent)
        nodes.append(Node("conv2d", node.name, [image.name, kernel, *node.inputs[2:]], pixels,
                          {"stride": 1, "padding": 0, "groups": 1, "relu": node.attrs["relu"],
                           "shift": node.attrs["shift"]}))
        nodes.append(Node("reshape", f"{node.name}/flatten", [pixels], node.output, {"flatten_axis": 1}))
    graph.nodes = nodes
    graph.prune()
    return graph
