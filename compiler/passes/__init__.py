"""Loop-IR passes: each a plain function ``IR → IR`` with a docstring.

The order they run in is `gemforge.compiler.pipeline.ACCEL_PASSES`.
"""

from .alu import AluInjectionError, inject_alu
from .dma import DmaInjectionError, inject_dma
from .flatten import flatten_storage
from .storage import CapacityError, StoragePlan, allocate_storage
from .tensorize import TensorizeError, tensorize
from .uop_fold import DEFAULT_UOP_BUDGET, fold_uop_loops
from .vthread import inject_virtual_threads

__all__ = [
    "tensorize", "inject_alu", "inject_dma", "flatten_storage", "inject_virtual_threads",
    "fold_uop_loops", "allocate_storage", "StoragePlan", "DEFAULT_UOP_BUDGET",
    "TensorizeError", "AluInjectionError", "DmaInjectionError", "CapacityError",
]
