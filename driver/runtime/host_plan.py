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
concat, …), a kernel whose argument is a copy made per run rather than a view of a node's output,
an unpacking that copies (a convolution whose output rows have a pitch). Its consumers then find
their argument's address at run time, after checking the array's shape, type and layout against
the trace's (a mismatch runs that node the slow way).

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
        for node in graph.nodes:
            start = time.perf_counter()
            hk = kernel_of(node)
            args = [env[name] for name in node.inputs]
            step = _trace_node(node, hk, args, node.inputs, graph.constants, static, device)
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
                constants: dict[str, np.ndarray], static: set[str], device) -> _Step:
    """``node``'s step: native where every kernel argument is a fixed buffer or a view of an input
    (and its output is a view of its buffer or a copy the step makes), else a Python step."""
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
    step = _Step(node, hk, kernel, arguments, raw_output=buffer, keep=keep + [value],
                 scratch=tuple(_address(w) for w in kernel._scratch or ()))
    if _address(value) == _address(buffer) and value.flags.c_contiguous:
        step.output = value
    else:
        step.finish = lambda out, hk=hk, op=op: hk.finish(op.unpack_output(out))
    if all(a.fixed is not None for a in arguments):
        step.fixed = tuple(a.fixed for a in arguments) + step.scratch
    return step


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
