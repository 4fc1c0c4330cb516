"""The accelerator's loop-IR passes: each a plain function ``IR → IR`` with a docstring.

They map the generic loop IR onto the accelerator's instructions (GEMM and ALU
micro-ops, DMA copies, hardware loops, virtual threads, on-chip storage). The
order they run in is the accelerator's stage list, `gemforge.compiler.backends.accel.stages`.
"""

from .alu import AluInjectionError, inject_alu
from .dma import DmaInjectionError, inject_dma
from .flatten import flatten_storage
from .storage import CapacityError, StoragePlan, allocate_storage
from .tensorize import TensorizeError, tensorize
from .uop_fold import DEFAULT_UOP_BUDGET, default_uop_budget, fold_uop_loops
from .vthread import inject_virtual_threads

__all__ = [
    "tensorize", "inject_alu", "inject_dma", "flatten_storage", "inject_virtual_threads",
    "fold_uop_loops", "allocate_storage", "StoragePlan", "DEFAULT_UOP_BUDGET", "default_uop_budget",
    "TensorizeError", "AluInjectionError", "DmaInjectionError", "CapacityError",
]
