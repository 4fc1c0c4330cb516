"""The GPU specifics of LLVM code generation (NVPTX).

Kernel parameters are pointers to global memory (address space 1), kernels
use the ``ptx_kernel`` calling convention; ``shared`` buffers are module
globals in address space 3, ``local`` ones stack arrays (registers after
optimization); thread indices read the PTX special registers and
``barrier()`` is ``bar.sync 0``.
"""

from __future__ import annotations

import llvmlite.ir as ll

from ...ir import Buffer, Call
from ..llvm.codegen import I32, I64, CodegenError, LLVMCodegen, llvm_type

__all__ = ["GpuCodegen", "NVPTX_TRIPLE", "NVPTX_DATA_LAYOUT"]

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
NVPTX_DATA_LAYOUT = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"

_SREG = {"threadIdx": "tid", "blockIdx": "ctaid"}


class GpuCodegen(LLVMCodegen):
    param_addrspace = 1

    def emit_kernel(self) -> ll.Function:
        fn = self.emit_function()
        fn.calling_convention = "ptx_kernel"
        return fn

    def thread_index(self, name: str) -> ll.Value:
        kind, axis = name.split(".")
        reg = self.intrinsic(f"llvm.nvvm.read.ptx.sreg.{_SREG[kind]}.{axis}", I32, [])
        return self.builder.call(reg, [])

    def index(self, e):
        # Hardware indices are never negative: zero-extend them.
        if isinstance(e, Call) and e.name.startswith(("threadIdx.", "blockIdx.")):
            return self.builder.zext(self.thread_index(e.name), I64)
        return super().index(e)

    def barrier(self) -> None:
        self.builder.call(self.intrinsic("llvm.nvvm.barrier0", ll.VoidType(), []), [])

    def allocate(self, buffer: Buffer):
        if buffer.scope == "shared":
            array = ll.ArrayType(llvm_type(buffer.dtype), max(1, buffer.size))
            name = f"{self.func.name}.{buffer.name}"
            var = ll.GlobalVariable(self.module, array, name, addrspace=3)
            var.linkage = "internal"
            var.align = 16
            var.initializer = ll.Constant(array, ll.Undefined)
            var.type = ll.PointerType(addrspace=3)  # the IR uses opaque pointers
            return var, None
        if buffer.scope == "global":
            raise CodegenError(f"buffer {buffer.name}: main memory is allocated by the host, between kernels")
        return super().allocate(buffer)

    def call(self, e):
        if e.name in ("exp", "log", "tanh"):
            raise CodegenError(f"intrinsic {e.name} is not available on the GPU back end (no libdevice)")
        return super().call(e)
