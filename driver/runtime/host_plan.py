"""A network's CPU run as a fixed sequence of native calls: what a run costs beyond its kernels.

A host node's run goes through Python: its arguments packed into a dict, the kernel's parameters
checked, outputs allocated, the thread count set and restored, the output unpacked — about 25 µs
a node, a quarter of MobileNetV2's 9.5 ms on 2 cores. A `HostPlan` does that work once. Built
from a first run of the network (which it traces: every kernel's arguments, where each comes
from), it gives every kernel node an output buffer of its own, kept from run to run, so that a
kernel's arguments are fixed addresses: a packed constant, a buffer of the plan, or a place in
a model input (fed per run). A run is then, per node, one call of the kernel's native entry,
under one thread-count setting for the whole run (TVM's graph executor does the same with its
static memory plan).

A node the plan cannot fix stays a Python step and runs as before: data movement (reshape,
…), a kernel whose argument is a copy made per run rather than a view of a node's output, an
unpacking that copies (a convolution whose output rows have a pitch). Its consumers then find
their argument's address at run time, after checking the array's shape, type and layout against
the trace's (a mismatch runs that node the slow way).

A concatenation whose parts are contiguous slices of its output (along the first axis longer
than 1) costs nothing where its parts' kernels write into those slices: the plan places each
part there before tracing (`_place_concats`), so the concatenation's output is a view of a
buffer its parts already filled, and it copies only a part that ended elsewhere (one whose
kernel pads its output, or a Python step's). DenseNet's blocks concatenate every earlier
layer's output at every layer (a quadratic amount of copying); placed, the block is one buffer
whose prefixes the concatenations are, each layer writing its slice once.

The outputs a run returns are copies (the next run overwrites the plan's buffers). One run at a
time uses a plan (a lock); each kernel's own lock is taken around its call, as a direct call does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gemforge.compiler.backends.cpu import CpuKernel, aligned_empty, runtime
from gemforge.compiler.graph.kernels import HostKernel, contiguous
from gemforge.compiler.graph.ir import Graph, Node

__all__ = ["HostPlan"]


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@dataclass
class _Argument:
    """Where a kernel argument's address comes from: ``fixed`` (an int), or byte ``offset`` into
    the env value ``name``, which must have ``shape``/``dtype`` and be C-contiguous."""

    fixed: int | None = None
    name: str | None = None
    offset: int = 0
    shape: tuple[int, ...] = ()
    dtype: np.dtype | None = None


@dataclass
class _Step:
    node: Node
    hk: HostKernel
    #: Set for a native step: the kernel, its arguments' sources, and what its output is.
    kernel: CpuKernel | None = None
    arguments: list[_Argument] = field(default_factory=list)
    fixed: tuple[int, ...] | None = None         # every address, when all are fixed
    output: np.ndarray | None = None             # the node's value: a view of the plan's buffer
    finish: Callable[[np.ndarray], np.ndarray] | None = None   # or this, of the kernel's output
    raw_output: np.ndarray | None = None
    scratch: tuple[int, ...] = ()
    keep: list[np.ndarray] = field(default_factory=list)   # alive while the plan holds addresses
    device_kind: str = "cpu"

    def value(self) -> np.ndarray:
        """The node's value after its kernel ran: the plan's buffer, or the copy its unpacking makes."""
        return self.output if self.output is not None else contiguous(self.finish(self.raw_output))


class HostPlan:
    """The traced CPU run of a network on a device (`Model._run_host_planned` builds and uses it).
    ``row(node, device kind, seconds)`` makes a profile row."""

    def __init__(self, steps: list[_Step], constants: dict[str, np.ndarray], threads: int,
                 row: Callable[[Node, str, float], Any]):
        self.steps = steps
        self.constants = constants
        self.threads = threads
        self.row = row
        self.lock = threading.Lock()

    @classmethod
    def trace(cls, graph: Graph, feeds: dict[str, np.ndarray], device, kernel_of: Callable[[Node], HostKernel],
              row: Callable[[Node, str, float], Any]) -> tuple[HostPlan, dict[str, np.ndarray], list]:
        """Run ``graph`` once the ordinary way on the CPU ``device`` (``kernel_of`` gives a node's
        host kernel), recording each node; returns the plan, that run's outputs and its profile."""
        env: dict[str, np.ndarray] = dict(graph.constants)
        env.update(feeds)
        static: set[str] = set()                       # env values whose buffers the plan owns
        steps: list[_Step] = []
        profile = []
        places = _place_concats(graph)
        for node in graph.nodes:
            start = time.perf_counter()
            hk = kernel_of(node)
            if node.output in places and node.op == "concat":
                hk = HostKernel(node, move=_PlacedConcat(places[node.output]))
                static.add(node.output)
            args = [env[name] for name in node.inputs]
            step = _trace_node(node, hk, args, node.inputs, graph.constants, static, device,
                               places.get(node.output))
            if step.kernel is None:
                env[node.output], result = hk.run(device, args)
                kind = "cpu" if result is not None else "host (data)"
            else:                 # `_trace_node` ran the kernel
                env[node.output] = step.value()
                if step.output is not None:
                    static.add(node.output)
                kind = "cpu"
            step.device_kind = kind
            steps.append(step)
            profile.append(row(node, kind, time.perf_counter() - start))
        outputs = {name: np.array(env[name]) for name in graph.outputs}
        return cls(steps, dict(graph.constants), device.threads, row), outputs, profile

    def run(self, feeds: dict[str, np.ndarray], device, outputs: list[str]) -> tuple[dict[str, np.ndarray], list]:
        """One run on ``feeds``: the outputs (copies) and the profile rows."""
        env = dict(self.constants)
        env.update(feeds)
        profile = []
        with self.lock:
            previous = runtime.enter(self.threads)
            try:
                for step in self.steps:
                    start = time.perf_counter()
                    node = step.node
                    if step.kernel is None or not _call(step, env):
                        # A Python step, or an argument not as traced: the ordinary way.
                        env[node.output], _ = step.hk.run(device, [env[name] for name in node.inputs])
                    else:
                        env[node.output] = step.value()
                    profile.append(self.row(node, step.device_kind, time.perf_counter() - start))
                result = {name: np.array(env[name]) for name in outputs}
            except BaseException:
                runtime.leave(previous, check=False)
                raise
            runtime.leave(previous)
        return result, profile


def _trace_node(node: Node, hk: HostKernel, args: list[np.ndarray], names: list[str],
                constants: dict[str, np.ndarray], static: set[str], device,
                place: np.ndarray | None = None) -> _Step:
    """``node``'s step: native where every kernel argument is a fixed buffer or a view of an input
    (and its output is a view of its buffer or a copy the step makes), else a Python step. A
    kernel whose output is the node's value as it is writes it to ``place``, where given."""
    op = hk.op
    kernel = op.program if op is not None else None
    if not isinstance(kernel, CpuKernel) or getattr(device, "kind", None) != "cpu":
        return _Step(node, hk)
    prepared = hk.prepare(args)
    again = hk.prepare(args)
    arguments: list[_Argument] = []
    keep: list[np.ndarray] = []
    buffer = None
    for param in kernel.params:
        array = prepared.get(param.name)
        if param.name == op.output:
            buffer = aligned_empty(param.shape, param.dtype)
            if place is not None and place.nbytes == buffer.nbytes and place.dtype == buffer.dtype:
                buffer = place.reshape(param.shape)     # if unpacking is a reshape (checked below)
            keep.append(buffer)
            arguments.append(_Argument(fixed=_address(buffer)))
            continue
        if array is None:
            return _Step(node, hk)
        source = _view_of(array, args, names)
        if source is not None:
            name, offset = source
            fixed = name in static or name in constants
            arguments.append(_Argument(fixed=_address(array) if fixed else None, name=name, offset=offset,
                                       shape=tuple(args[names.index(name)].shape),
                                       dtype=args[names.index(name)].dtype))
        elif again.get(param.name) is array and array.flags.c_contiguous:     # packed once: a constant
            keep.append(array)
            arguments.append(_Argument(fixed=_address(array)))
        else:
            return _Step(node, hk)                     # made per run: not fixed
        if tuple(array.shape) != tuple(param.shape) or array.dtype != np.dtype(param.dtype) \
                or not array.flags.c_contiguous:
            return _Step(node, hk)
    # The traced run's own call (it allocates the kernel's workspaces, whose addresses stay).
    kernel(*[buffer if p.name == op.output else prepared[p.name] for p in kernel.params], threads=device.threads)
    value = contiguous(hk.finish(op.unpack_output(buffer)))
    if place is not None and _address(buffer) == _address(place) and _address(value) != _address(buffer):
        # Unpacking copies: the value is not in its place, and the buffer must be the kernel's own
        # (a concatenation copies the value into the place, which this buffer would overwrite).
        return _trace_node(node, hk, args, names, constants, static, device)
    step = _Step(node, hk, kernel, arguments, raw_output=buffer, keep=keep + [value],
                 scratch=tuple(_address(w) for w in kernel._scratch or ()))
    if _address(value) == _address(buffer) and value.flags.c_contiguous:
        step.output = value
    else:
        step.finish = lambda out, hk=hk, op=op: hk.finish(op.unpack_output(out))
    if all(a.fixed is not None for a in arguments):
        step.fixed = tuple(a.fixed for a in arguments) + step.scratch
    return step


def _place_concats(graph: Graph) -> dict[str, np.ndarray]:
    """Where each concatenation's output and parts live (`HostPlan`): the largest concatenation
    gets a buffer, each part a view of its slice (recursively into a part that is itself a
    concatenation); a smaller concatenation whose parts are already placed one after another in
    one buffer is the view of their span, else gets its own. Placed are only values a node
    makes (not inputs or constants), each in one place; concatenations of contiguous slices."""
    producer = graph.producer()
    places: dict[str, np.ndarray] = {}
    made = {node.output for node in graph.nodes}

    def place(name: str, view: np.ndarray) -> None:
        places[name] = view
        node = producer.get(name)
        if node is None or node.op != "concat" or not _slices_contiguous(graph, node):
            return
        for part, part_view in zip(node.inputs, _part_slices(view, node, [graph.values[p].shape for p in node.inputs])):
            if part in made and part not in places:
                place(part, part_view)

    concats = [n for n in graph.nodes if n.op == "concat" and _slices_contiguous(graph, n)]
    for node in sorted(concats, key=lambda n: -_nbytes(graph, n.output)):
        if node.output in places:
            continue
        span = _span(graph, node, places)
        value = graph.values[node.output]
        place(node.output, span if span is not None else aligned_empty(value.shape, value.dtype))
    return places


def _slices_contiguous(graph: Graph, node: Node) -> bool:
    """Whether a concatenation's parts are contiguous slices of its output (nothing but axes of
    length 1 before its axis)."""
    shape = graph.values[node.output].shape
    axis = node.attrs["axis"] % len(shape)
    return all(int(d) == 1 for d in shape[:axis]) and \
        all(graph.values[part].dtype == graph.values[node.output].dtype for part in node.inputs)


def _nbytes(graph: Graph, name: str) -> int:
    value = graph.values[name]
    return int(np.prod(value.shape, dtype=np.int64)) * np.dtype(value.dtype).itemsize


def _span(graph: Graph, node: Node, places: dict[str, np.ndarray]) -> np.ndarray | None:
    """The view of ``node``'s output shape over its parts' places, where they are placed one
    after another in one buffer, else None."""
    parts = node.inputs
    if not parts or not all(part in places for part in parts):
        return None
    first = places[parts[0]]
    buffer = _owner(first)
    at = _address(first)
    for part in parts:
        view = places[part]
        if _address(view) != at or _owner(view) is not buffer:
            return None
        at += view.nbytes
    value = graph.values[node.output]
    start = _address(first) - _address(buffer)
    return buffer.reshape(-1).view(np.uint8)[start:start + _nbytes(graph, node.output)].view(
        np.dtype(value.dtype)).reshape(value.shape)


def _part_slices(out: np.ndarray, node: Node, shapes) -> list[np.ndarray]:
    """The views of a concatenation's output ``out`` that its parts (of ``shapes``) fill."""
    axis, start, views = node.attrs["axis"] % out.ndim, 0, []
    for shape in shapes:
        views.append(out[(slice(None),) * axis + (slice(start, start + shape[axis]),)])
        start += shape[axis]
    return views


def _owner(view: np.ndarray) -> np.ndarray:
    """The array that owns ``view``'s memory."""
    while isinstance(view.base, np.ndarray):
        view = view.base
    return view


class _PlacedConcat:
    """A placed concatenation's step: copies into ``out`` the parts not already in their slices.
    The first call (the trace's) finds the parts in place; later calls skip exactly those
    arrays (the plan's buffers, the same objects each run), without asking numpy where they are."""

    def __init__(self, out: np.ndarray):
        self.out = out
        self.slices: list[np.ndarray] | None = None
        self.in_place: list[np.ndarray | None] = []

    def __call__(self, node: Node, args: list[np.ndarray]) -> np.ndarray:
        if self.slices is None:
            self.slices = _part_slices(self.out, node, [part.shape for part in args])
            self.in_place = [part if _address(part) == _address(target) and part.shape == target.shape else None
                             for part, target in zip(args, self.slices)]
        for part, target, placed in zip(args, self.slices, self.in_place):
            if part is not placed:
                np.copyto(target, part)
        return self.out


def _view_of(array: np.ndarray, args: list[np.ndarray], names: list[str]) -> tuple[str, int] | None:
    """(input name, byte offset) where ``array`` is a C-contiguous view of the whole of a
    C-contiguous input, else None."""
    start = _address(array)
    for arg, name in zip(args, names):
        if isinstance(arg, np.ndarray) and arg.flags.c_contiguous and array.flags.c_contiguous \
                and _address(arg) == start and arg.nbytes == array.nbytes:
            return name, 0
    return None


def _call(step: _Step, env: dict[str, Any]) -> bool:
    """Call ``step``'s kernel on its arguments' addresses; False (nothing called) where an input
    is not as traced."""
    if step.fixed is not None:
        addresses = step.fixed
    else:
        addresses = []
        for a in step.arguments:
            if a.fixed is not None:
                addresses.append(a.fixed)
                continue
            value = env[a.name]
            if type(value) is not np.ndarray or value.shape != a.shape or value.dtype != a.dtype \
                    or not value.flags.c_contiguous:
                return False
            addresses.append(_address(value) + a.offset)
        addresses = (*addresses, *step.scratch)
    with step.kernel._lock:
        step.kernel._entry(*addresses)
    return True
