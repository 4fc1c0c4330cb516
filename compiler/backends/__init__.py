"""Back ends: each turns the lowered loop IR into a runnable artefact for one kind of target.

- ``accel``: instructions, micro-ops and DRAM layout for the accelerator (a `Program`);
- ``cpu``: LLVM IR → optimized native code, JIT-compiled and callable on numpy arrays;
- ``gpu``: LLVM IR for NVPTX → PTX, run through the CUDA driver where a GPU is present.

Each back end declares one ordered stage list, `stages(target)` → ``{name: function}``
(Triton's layout): every function takes the previous stage's output. The
pipeline (`gemforge.compiler.pipeline.build`) runs them and can trace each.
"""

from __future__ import annotations

from typing import Any, Callable

from ..target import Target, TargetError

__all__ = ["stages"]


def stages(target: Target) -> dict[str, Callable[[Any], Any]]:
    """The ordered stages of ``target``'s back end."""
    if target.kind == "accel":
        from .accel import stages as accel_stages
        return accel_stages(target)
    if target.kind == "cpu":
        from .cpu import stages as cpu_stages
        return cpu_stages(target)
    if target.kind == "gpu":
        from .gpu import stages as gpu_stages
        return gpu_stages(target)
    raise TargetError(f"no back end for target kind {target.kind!r}")
