"""From one lowered function to GPU kernels: splitting, thread binding, barriers.

- `split_kernels`: every top-level statement of the function (one root stage's
  loop nest) becomes a kernel, launched in order (a launch boundary is a
  global synchronization); main-memory intermediates become workspaces the
  runtime allocates on the device;
- `insert_barriers`: a ``shared`` buffer written by some threads and read by
  others needs ``barrier()`` between the writes and the reads, and — inside a
  loop — before the next iteration's writes (TVM's storage sync, for the
  statement sequences schedules produce);
- `bind_threads`: loops bound to ``blockIdx.*``/``threadIdx.*`` become the
  hardware indices; the launch dimensions are the largest extent bound to
  each; a loop shorter than its dimension is guarded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import CompileError
from ...ir import (
    Allocate, Buffer, BufferLoad, BufferStore, Call, Cmp, Const, Evaluate, For, ForKind, IfThenElse, LetStmt,
    PrimFunc, Seq, Stmt, StmtMutator, const_upper_bound, seq, simplify, walk, walk_expr,
)
from ..llvm.module import split_workspaces

__all__ = ["GpuKernelFunc", "GpuProgram", "split_kernels", "insert_barriers", "bind_threads", "GpuCompileError",
           "THREAD_TAGS"]

#: The hardware indices a loop may be bound to.
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
#: Largest grid dimensions (x, y, z) and threads per block of the supported architectures.
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
MAX_BLOCK_THREADS = 1024


class GpuCompileError(CompileError):
    """The loop IR cannot be turned into GPU kernels."""


@dataclass
class GpuKernelFunc:
    """One kernel: its function (parameters: the buffers it touches), launch dimensions,
    and the buffers it writes."""

    func: PrimFunc
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    writes: list[Buffer] = field(default_factory=list)


@dataclass
class GpuProgram:
    """The kernels of one lowered function, launched in order; ``params`` are the
    function's buffers, ``workspaces`` its device-side intermediates, ``source`` the
    lowered function itself (its sequential meaning, for inspection and tests)."""

    name: str
    params: list[Buffer]
    workspaces: list[Buffer]
    kernels: list[GpuKernelFunc]
    source: PrimFunc | None = None

    def __str__(self) -> str:
        from ...ir import format_ir
        parts = []
        for k in self.kernels:
            parts.append(f"// kernel {k.func.name}: grid {k.grid}, block {k.block}\n{format_ir(k.func)}")
        return "\n\n".join(parts)


def _buffers_of(stmt: Stmt) -> tuple[list[Buffer], list[Buffer]]:
    """Buffers read and written in ``stmt`` (first-use order), not counting its own allocations."""
    used: list[Buffer] = []
    written: list[Buffer] = []
    local: set[Buffer] = set()

    def visit(s: Stmt) -> None:
        if isinstance(s, Allocate):
            local.add(s.buffer)
        if isinstance(s, BufferStore) and s.buffer not in written:
            written.append(s.buffer)
            if s.buffer not in used:
                used.append(s.buffer)

    walk(stmt, visit)
    walk_expr(stmt, lambda e: used.append(e.buffer) if isinstance(e, BufferLoad) and e.buffer not in used else None)
    return [b for b in used if b not in local], [b for b in written if b not in local]


def split_kernels(func: PrimFunc) -> GpuProgram:
    """One kernel per top-level statement; top-level main-memory allocations are workspaces."""
    workspaces, body = split_workspaces(func)
    parts = body.stmts if isinstance(body, Seq) else [body]
    kernels = []
    order = func.params + workspaces
    for i, part in enumerate(parts):
        used, written = _buffers_of(part)
        params = [b for b in order if b in used]
        for b in used:
            if b not in order:
                raise GpuCompileError(f"buffer {b.name} ({b.scope}) is used across kernels; only main memory can be")
        name = f"{func.name}_k{i}" if len(parts) > 1 else func.name
        kernels.append(GpuKernelFunc(PrimFunc(name, params, part, dict(func.attrs)), writes=written))
    return GpuProgram(func.name, list(func.params), workspaces, kernels, func)


# ---------------------------------------------------------------------------- barriers

def _touches(stmt: Stmt, buffer: Buffer) -> tuple[bool, bool]:
    """(reads, writes) of ``buffer`` in ``stmt``."""
    reads = writes = False

    def visit(s: Stmt) -> None:
        nonlocal writes
        if isinstance(s, BufferStore) and s.buffer is buffer:
            writes = True

    def visit_expr(e) -> None:
        nonlocal reads
        if isinstance(e, BufferLoad) and e.buffer is buffer:
            reads = True
    walk(stmt, visit)
    walk_expr(stmt, visit_expr)
    return reads, writes


def _barrier() -> Stmt:
    return Evaluate(Call("barrier"))


class _Barriers(StmtMutator):
    def __init__(self, shared: list[Buffer]) -> None:
        self.shared = shared

    def visit_Seq(self, s: Seq) -> Stmt:
        stmts = [self.visit(c) for c in s.stmts]
        stmts = [c for c in stmts if c is not None]
        out: list[Stmt] = []
        pending: set[Buffer] = set()  # written since the last barrier
        for c in stmts:
            access = {b: _touches(c, b) for b in self.shared}
            if any(access[b][0] for b in pending):
                out.append(_barrier())
                pending.clear()
            out.append(c)
            pending |= {b for b, (_, w) in access.items() if w}
        return seq(out)

    def visit_For(self, s: For) -> Stmt:
        body = self.visit(s.body)
        # A loop that writes and reads a shared buffer: the next iteration's writes
        # wait until every thread has finished this iteration's reads. (Not a loop bound
        # to a thread index: its iterations are the threads, running side by side.)
        if s.kind is not ForKind.THREAD_BINDING and any(all(_touches(body, b)) for b in self.shared):
            body = seq([_barrier(), body])
        return For(s.var, s.extent, body, s.kind, s.thread)


def insert_barriers(program: GpuProgram) -> GpuProgram:
    """Barriers around the accesses of every ``shared`` buffer (see the module docstring)."""
    for k in program.kernels:
        shared: list[Buffer] = []
        walk(k.func.body, lambda s: shared.append(s.buffer) if isinstance(s, Allocate)
             and s.buffer.scope == "shared" else None)
        if shared:
            k.func = k.func.with_body(_Barriers(shared).visit(k.func.body))
    return program


# ---------------------------------------------------------------------------- thread binding

def bind_threads(program: GpuProgram) -> GpuProgram:
    """Thread-bound loops → hardware indices (guarded where shorter than the launch)."""
    for k in program.kernels:
        dims: dict[str, int] = {}

        def visit(s: Stmt) -> None:
            if isinstance(s, For) and s.kind is ForKind.THREAD_BINDING:
                if s.thread not in THREAD_TAGS:
                    raise GpuCompileError(f"loop {s.var.name} is bound to {s.thread!r}; bind to one of "
                                          f"{', '.join(THREAD_TAGS)}")
                try:
                    extent = const_upper_bound(s.extent)
                except ValueError:
                    raise GpuCompileError(f"loop {s.var.name} bound to {s.thread} has no constant bound "
                                          f"({s.extent!r})") from None
                dims[s.thread] = max(dims.get(s.thread, 1), extent)
        walk(k.func.body, visit)
        grid = tuple(dims.get(f"blockIdx.{a}", 1) for a in "xyz")
        block = tuple(dims.get(f"threadIdx.{a}", 1) for a in "xyz")
        if any(g > m for g, m in zip(grid, MAX_GRID)):
            raise GpuCompileError(f"kernel {k.func.name} needs a grid of {grid} blocks; the GPU allows {MAX_GRID}")
        if block[0] * block[1] * block[2] > MAX_BLOCK_THREADS:
            raise GpuCompileError(f"kernel {k.func.name} needs {block} = {block[0] * block[1] * block[2]} threads "
                                  f"per block; the GPU allows {MAX_BLOCK_THREADS}")
        k.grid, k.block = grid, block
        k.func = k.func.with_body(_Bind(dims).visit(k.func.body))
    return program


class _Bind(StmtMutator):
    def __init__(self, dims: dict[str, int]) -> None:
        self.dims = dims

    def visit_For(self, s: For) -> Stmt:
        body = self.visit(s.body)
        if s.kind is not ForKind.THREAD_BINDING:
            return For(s.var, s.extent, body, s.kind, s.thread)
        extent = simplify(s.extent)
        if not (isinstance(extent, Const) and extent.value == self.dims[s.thread]):
            if _has_barrier(body):
                # Threads that skip a barrier leave the others waiting for ever.
                raise GpuCompileError(f"loop {s.var.name} bound to {s.thread} runs {extent!r} of "
                                      f"{self.dims[s.thread]} threads around a barrier; give the thread loops "
                                      "around shared-memory stages whole extents (pad the tile)")
            body = IfThenElse(Cmp("<", s.var, extent), body)
        return LetStmt(s.var, Call(s.thread), body)


def _has_barrier(stmt: Stmt) -> bool:
    found = False

    def visit(s: Stmt) -> None:
        nonlocal found
        if isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.name == "barrier":
            found = True
    walk(stmt, visit)
    return found
