"""The accelerator back end: loop IR → `Program` (instructions, micro-ops, DRAM layout).

`stages(target)` is its one ordered stage list: the passes that map the loop
IR onto the accelerator (`passes`), then program emission (`emission`,
`uops`, `tokens`). Accelerator-only IR nodes are in `nodes`, the GEMM tensor
intrinsic in `intrin`, host packing to its tiled layouts in `layout`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from ...ir import PrimFunc, Stmt
from ...target import AccelTarget
from .emission import AccelBuild, AccelCompileError, Emitted, emit_instructions, finish, layout_dram
from .fusion import fuse_accumulator_init, fuse_requant_store
from .passes import (
    allocate_storage, flatten_storage, fold_uop_loops, inject_alu, inject_dma, inject_virtual_threads, tensorize,
)
from .tokens import insert_dependency_tokens, make_program
from .uops import deduplicate_uops, place_uops

__all__ = ["stages", "AccelCompileError", "AccelBuild", "Emitted", "deduplicate_uops", "insert_dependency_tokens"]


def _on_body(ir_pass: Callable[[Stmt], Stmt]) -> Callable[[PrimFunc], PrimFunc]:
    """A pass over statements as a stage over functions."""
    def run(func: PrimFunc) -> PrimFunc:
        return func.with_body(ir_pass(func.body))
    run.__name__ = getattr(ir_pass, "__name__", "pass")
    run.__doc__ = ir_pass.__doc__
    return run


def stages(target: AccelTarget) -> dict[str, Callable[[Any], Any]]:
    """The accelerator's stages, in order: IR passes, then program emission.

    ::

        tensorize               loops under a tensorize mark → GEMM micro-ops
        inject_alu              element-wise accumulator stages → ALU micro-ops (in place)
        inject_dma              copy nests → 2-D strided DMAs with zero padding
        flatten_storage         entry references → flat entry offsets
        fold_uop_loops          micro-op nests → GEMM/ALU instructions (2 hardware loops + kernel)
        inject_virtual_threads  vthread loops → interleaved, double-buffered copies
        allocate_storage        on-chip buffers placed, capacities checked
        layout_dram             DRAM tensors (the function's parameters) placed in the arena
        emit_instructions       host loops unrolled, every DMA/task an instruction
        fuse_accumulator_init   reset GEMMs → an overwriting first reduction step
        fuse_requant_store      ALU shift/clip + output STOREs → requantizing STOREs
        deduplicate_uops        identical micro-op kernels stored once
        finish                  FINISH, a barrier on everything on chip
        insert_dependency_tokens  push/pop flags from exact dataflow → `Program`
    """
    config = target.config
    return {
        "tensorize": _on_body(tensorize),
        "inject_alu": _on_body(partial(inject_alu, config=config)),
        "inject_dma": _on_body(partial(inject_dma, config=config)),
        "flatten_storage": _on_body(flatten_storage),
        "fold_uop_loops": _on_body(partial(fold_uop_loops, config=config, uop_budget=target.uop_budget)),
        "inject_virtual_threads": _on_body(inject_virtual_threads),
        "allocate_storage": _on_body(partial(allocate_storage, config=config)),
        "layout_dram": partial(layout_dram, config=config),
        "emit_instructions": emit_instructions,
        "fuse_accumulator_init": fuse_accumulator_init,
        "fuse_requant_store": fuse_requant_store,
        "deduplicate_uops": place_uops,
        "finish": finish,
        "insert_dependency_tokens": make_program,
    }
