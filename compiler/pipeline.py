"""The compilation pipeline, top to bottom, for every target.

::

    schedule ──lower (bounds inference, loop nests, verify)──▶ PrimFunc
      ──stages(target): the back end's ordered stages──▶ artefact
          accel: tensorize … allocate_storage, layout_dram … insert_dependency_tokens → Program
          cpu:   … → LLVM IR → optimized → JIT-compiled kernel
          gpu:   … → LLVM IR (NVPTX) → PTX → kernel

`build` runs all of it; ``trace=print`` (or any callable) shows the IR after
lowering and after every stage, and ``with tracing(print):`` does so for every
build inside (an operator's compile function, a command). `run_stages` runs
part of a stage list (for tests and inspection).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Sequence

from .backends import stages
from .ir import PrimFunc, format_ir
from .lower import lower_schedule
from .schedule import Schedule
from .target import Target, target_of
from .te import Tensor

__all__ = ["lower", "build", "run_stages", "describe", "tracing"]

_TRACE: ContextVar[Callable[[str], None] | None] = ContextVar("gemforge_trace", default=None)


@contextmanager
def tracing(trace: Callable[[str], None]) -> Iterator[None]:
    """Trace every `build` in the ``with`` block (that has no trace of its own)."""
    token = _TRACE.set(trace)
    try:
        yield
    finally:
        _TRACE.reset(token)


def describe(obj: Any) -> str:
    """The text `trace` shows for a stage's output."""
    try:
        return format_ir(obj) if isinstance(obj, PrimFunc) else str(obj)
    except RecursionError:      # an expression nested past Python's stack (a long chain of maxima)
        return f"({type(obj).__name__} nested too deeply to print)"


def lower(sch: Schedule, target, args: Sequence[Tensor], *, name: str = "main",
          trace: Callable[[str], None] | None = None) -> PrimFunc:
    """Schedule → the verified `PrimFunc` for ``target`` (before any back-end stage)."""
    target = target_of(target)
    func = lower_schedule(sch, list(args), name, target)
    if trace:
        trace(f"== lower\n{describe(func)}")
    return func


def run_stages(obj: Any, target: Target, *, until: str | None = None,
               trace: Callable[[str], None] | None = None) -> Any:
    """Run ``target``'s stages on ``obj`` (a lowered `PrimFunc`), stopping after ``until``."""
    plan = stages(target)
    if until is not None and until not in plan:
        raise ValueError(f"{target.kind} has no stage {until!r}; its stages: {', '.join(plan)}")
    for name, run in plan.items():
        obj = run(obj)
        if trace:
            trace(f"== {name}\n{describe(obj)}")
        if name == until:
            break
    return obj


def build(sch: Schedule, target, args: Sequence[Tensor], *, name: str = "main",
          trace: Callable[[str], None] | None = None) -> Any:
    """Schedule → the target's artefact (a `Program` for the accelerator, a kernel
    for the CPU and GPU). ``args`` are the function's tensors (inputs, then outputs)."""
    target = target_of(target)
    trace = trace or _TRACE.get()
    from .backends.cpu import prebuilt
    if target.kind != "cpu" or trace is not None or not prebuilt.active():
        return run_stages(lower(sch, target, args, name=name, trace=trace), target, trace=trace)
    # A network's host kernel built before (this machine's kernel cache, or the model file
    # being run) is found by its schedule, without lowering it again (`backends.cpu.prebuilt`).
    key = prebuilt.schedule_key(sch, args, name, target)
    kernel = prebuilt.find(key, target)
    if kernel is None:
        kernel = run_stages(lower(sch, target, args, name=name), target)
        prebuilt.keep(key, kernel)
    return kernel
