"""`CompiledNetwork`: what the graph compiler produces and the runtime runs.

Its own module, apart from the pipeline (`compile`), so that loading and running a compiled
network never imports the ONNX front end (onnx takes most of a second to import).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gemforge.hw.config import AccelConfig

from .ir import Graph
from .memory_plan import MemoryPlan
from .partition import AccelLayer

__all__ = ["CompiledNetwork"]


@dataclass
class CompiledNetwork:
    """A compiled network: ``graph`` (float32 or int8), its accelerator ``layers`` (by node
    name) and the device-memory ``plan`` (int8 with a config), plus what the passes noted."""

    graph: Graph
    dtype: str                                   # "float32" or "int8"
    config: AccelConfig | None = None
    layers: dict[str, AccelLayer] = field(default_factory=dict)
    plan: MemoryPlan | None = None               # with a config: the packed tensors' device memory
    compile_seconds: float = 0.0
    #: The host layers' CPU kernels as compiled for the machine `gemforge compile` ran on (or
    #: named), by their schedule's key (`backends.cpu.prebuilt`): a run on a machine they
    #: match loads them without compiling.
    host_kernels: dict[str, Any] = field(default_factory=dict)
    #: The tuning records (`gemforge.compiler.tuning`, as dicts) of the CPU schedules the network
    #: was compiled with: a run that compiles its host kernels again applies them too.
    tuning: list[dict[str, Any]] = field(default_factory=list)
    #: The CPU the host kernels were compiled for where it is not the compiling machine's own
    #: (``{"cpu": level, "features": …}``, `target.named_cpu`; None: that machine's).
    host_target: dict[str, str] | None = None
