"""What the CPU and GPU back ends do alike around code generation: peel a function's
main-memory workspaces off its body, and run LLVM's O3 pipeline on a module."""

from __future__ import annotations

import llvmlite.binding as llvm

from ...ir import Allocate, Buffer, PrimFunc, Stmt

__all__ = ["split_workspaces", "optimize_o3"]


def split_workspaces(func: PrimFunc) -> tuple[list[Buffer], Stmt]:
    """The main-memory allocations at the top of ``func`` (its workspaces: the caller
    allocates them once, not every call) and the body inside them."""
    body, workspaces = func.body, []
    while isinstance(body, Allocate) and body.buffer.scope == "global":
        workspaces.append(body.buffer)
        body = body.body
    return workspaces, body


def optimize_o3(llvm_ir: str, machine, *, vectorize: bool) -> llvm.ModuleRef:
    """``llvm_ir`` parsed, verified and optimized by the O3 pipeline for ``machine``
    (with ``vectorize``: loop and SLP vectorization and unrolling)."""
    ref = llvm.parse_assembly(llvm_ir)
    ref.verify()
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    if vectorize:
        options.loop_vectorization = True
        options.slp_vectorization = True
        options.loop_unrolling = True
    builder = llvm.create_pass_builder(machine, options)
    builder.getModulePassManager().run(ref, builder)
    return ref
