"""A dense layer of a flattened image as the convolution whose window is the whole image.

A classifier ends ``pool → flatten → dense``. On the accelerator the pool's output is packed
as an image of channel blocks and the dense layer's input as a matrix of channel blocks; the
flatten between them is a move on the host, so an inference that runs every layer on the
accelerator still left it there and came back. A dense layer over an (N, C, H, W) image
flattened to (N, C·H·W) is the H×W convolution (no padding) of that image, its weights
transposed and reshaped to (O, C, H, W) — NCHW's flattening order is OIHW's — giving an
(N, O, 1, 1) image: the same integer products summed in the same int32, the same bias, shift
and ReLU, so the result is bit-identical. Rewritten so, the convolution reads the pool's
output where the pool wrote it and the flatten moves after the last accelerator layer, on
the way out.

Done only with a config (the rewrite is for the accelerator's layouts), and only where the
flatten's result has no other reader.
"""

from __future__ import annotations

from .ir import Graph, Node, Value

__all__ = ["dense_of_image_as_conv"]


def _flattened_image(graph: Graph, node: Node, producer: dict[str, Node], readers: dict[str, list[Node]]
                     ) -> Node | None:
    """The reshape that flattens the (N, C, H, W) image ``node`` (an int8 dense layer of
    constant weights) reads to (N, C·H·W), when the layer is its only reader."""
    if node.op != "dense" or not graph.is_constant(node.inputs[1]) or graph.values[node.inputs[0]].dtype != "int8":
        return None
    flatten = producer.get(node.inputs[0])
    if flatten is None or flatten.op != "reshape" or len(readers.get(flatten.output, [])) != 1:
        return None
    image, flat = graph.values[flatten.inputs[0]].shape, graph.values[flatten.output].shape
    if len(image) != 4 or tuple(flat) != (image[0], image[1] * image[2] * image[3]):
        return None
    return flatten


def dense_of_image_as_conv(graph: Graph) -> Graph:
    """Each int8 dense layer `_flattened_image` finds becomes the conv2d of the image whose
    kernel is the image, then the flatten of its (N, O, 1, 1) result into the layer's (N, O)
    output."""
    producer, readers = graph.producer(), graph.consumers()
    nodes: list[Node] = []
    for node in graph.nodes:
        flatten = _flattened_image(graph, node, producer, readers)
        if flatten is None:
            nodes.append(node)
            continue
        image, w, out = graph.values[flatten.inputs[0]], graph.values[node.inputs[1]], graph.values[node.output]
        o, (n, c, h, wd) = w.shape[1], image.shape
        kernel = graph.add_constant(f"{w.name}/as_conv", graph.constants[w.name].T.reshape(o, c, h, wd).copy(),
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
