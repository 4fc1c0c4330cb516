"""IR nodes that exist only on the accelerator, introduced by its passes.

An on-chip buffer holds *entries*: one tile of its scope (``batch × block_in``
for ``inp``), the `Buffer.tile_dims` trailing dimensions of a tensor in the
accelerator's packed layouts. The nodes below move and compute whole entries:

- `BufferRef`: the entry of a buffer at some tile indices, or at a flat offset
  after `flatten_storage`;
- `DmaCopy`: a LOAD or STORE (2-D strided, zero padding on chip);
- `GemmIntrin` / `AluIntrin`: one GEMM or ALU micro-op;
- `HwLoopTask`: a GEMM or ALU instruction, two hardware loops over a kernel
  of micro-ops.

They are dataclasses over the generic IR's `Stmt` and `Node`, so the generic
traversal, substitution and printer handle them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir import Buffer, Const, Expr, Node, Stmt, Var
from ...target import ACCEL_ON_CHIP_SCOPES as ON_CHIP_SCOPES

__all__ = ["BufferRef", "DmaCopy", "GemmIntrin", "AluIntrin", "HwLoopTask", "ON_CHIP_SCOPES"]


@dataclass(frozen=True, eq=False)
class BufferRef(Node):
    """The entry of ``buffer`` at ``indices`` (one index per tile dimension of its
    grid, `Buffer.outer_shape`), or after storage flattening the flat entry ``offset``."""

    buffer: Buffer
    indices: tuple[Expr, ...] = ()
    offset: Expr | None = None

    def __repr__(self) -> str:
        if self.offset is not None:
            return f"{self.buffer.name}@{self.offset!r}"
        return f"{self.buffer.name}[{', '.join(map(repr, self.indices))}]"


@dataclass(eq=False)
class DmaCopy(Stmt):
    """A 2-D strided copy between DRAM and an on-chip buffer (LOAD or STORE).

    ``y_size`` rows of ``x_size`` entries; DRAM rows ``x_stride`` entries apart;
    on chip (loads) the tile is framed by zero padding. ``dram`` references the
    first DRAM entry copied, ``sram`` the top-left corner of the on-chip tile
    including its padding (the LOAD/STORE ``dram_base`` and ``sram_base``)."""

    direction: str      # "load" or "store"
    dram: BufferRef
    sram: BufferRef
    y_size: Expr
    x_size: Expr
    x_stride: int
    y_pad0: Expr = field(default_factory=lambda: Const(0))
    y_pad1: Expr = field(default_factory=lambda: Const(0))
    x_pad0: Expr = field(default_factory=lambda: Const(0))
    x_pad1: Expr = field(default_factory=lambda: Const(0))

    def ir_line(self) -> str:
        pads = f" pad y({self.y_pad0!r},{self.y_pad1!r}) x({self.x_pad0!r},{self.x_pad1!r})"
        return (f"dma.{self.direction} dram={self.dram!r} sram={self.sram!r} "
                f"y={self.y_size!r} x={self.x_size!r} stride={self.x_stride}{pads}")


@dataclass(eq=False)
class GemmIntrin(Stmt):
    """One GEMM micro-op: ``dst += src · wgtᵀ`` on whole entries (or ``dst = 0`` with reset)."""

    dst: BufferRef
    src: BufferRef | None = None
    wgt: BufferRef | None = None
    reset: bool = False

    def ir_line(self) -> str:
        what = "reset" if self.reset else f"+= {self.src!r} x {self.wgt!r}"
        return f"gemm {self.dst!r} {what}"


@dataclass(eq=False)
class AluIntrin(Stmt):
    """One ALU micro-op on accumulator entries: ``dst = op(dst, src or imm)``."""

    op: str             # "min", "max", "add", "shr", "mul"
    dst: BufferRef
    src: BufferRef | None = None
    imm: int | None = None

    def ir_line(self) -> str:
        operand = self.imm if self.imm is not None else self.src
        return f"alu.{self.op} {self.dst!r}, {operand!r}"


@dataclass(eq=False)
class HwLoopTask(Stmt):
    """A GEMM or ALU instruction: two hardware loops over a micro-op kernel.

    ``hw_loops`` are the ``(var, extent)`` of iter_out and iter_in; the
    micro-ops are ``body`` (one `GemmIntrin` or `AluIntrin`) for every point of
    ``uop_loops``, with the hardware variables at 0. Index steps per hardware
    iteration are the coefficients of the hardware variables in the references,
    which `fold_uop_loops` guaranteed to be constants."""

    kind: str  # "gemm" or "alu"
    hw_loops: list[tuple[Var, Expr]]
    uop_loops: list[tuple[Var, Expr]]
    body: GemmIntrin | AluIntrin

    def ir_line(self) -> str:
        hw = ", ".join(f"{v.name}<{e!r}>" for v, e in self.hw_loops)
        uo = ", ".join(f"{v.name}<{e!r}>" for v, e in self.uop_loops)
        return f"{self.kind} hw_loops[{hw}] uops[{uo}]:"
