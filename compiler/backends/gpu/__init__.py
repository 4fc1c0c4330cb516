"""The GPU back end: loop IR → kernels → LLVM IR for NVPTX → PTX → the CUDA driver.

`stages(target)`, in order::

    split_kernels    one kernel per root stage; main-memory intermediates → device workspaces
    insert_barriers  barrier() around shared-memory writes and reads
    bind_threads     blockIdx/threadIdx loops → hardware indices; launch dimensions
    make_llvm_ir     every kernel in one LLVM module (`codegen.GpuCodegen`, ptx_kernel)
    emit_ptx         LLVM's NVPTX back end for the target architecture → PTX text
    check_ptx        ptxas (when on PATH) assembles the PTX → cubin; an error names the line
    load             → a `GpuKernel`: runs through the CUDA driver where a GPU is present

A `GpuKernel` is built (and its PTX checked) on any machine; calling it needs
a GPU (`cuda.available`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import llvmlite.binding as llvm
import llvmlite.ir as ll
import numpy as np

from ...ir import Buffer
from ...target import GpuTarget
from ..llvm.module import optimize_o3
from .codegen import NVPTX_DATA_LAYOUT, NVPTX_TRIPLE, GpuCodegen
from .kernels import GpuCompileError, GpuProgram, bind_threads, insert_barriers, split_kernels

__all__ = ["stages", "GpuModule", "GpuKernel", "GpuCompileError", "ptxas_path"]

_initialized = False


def _initialize() -> None:
    global _initialized
    if not _initialized:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _initialized = True


def ptxas_path() -> str | None:
    """The ``ptxas`` on PATH, if any."""
    return shutil.which("ptxas")


@dataclass
class GpuModule:
    """The kernels of one function on their way to PTX and a cubin."""

    program: GpuProgram
    target: GpuTarget
    llvm_ir: str = ""
    ptx: str = ""
    cubin: bytes | None = None
    ptxas_log: str = ""

    def __str__(self) -> str:
        return self.ptx or self.llvm_ir


def make_llvm_ir(program: GpuProgram, target: GpuTarget) -> GpuModule:
    """All kernels in one LLVM module for NVPTX."""
    module = ll.Module(name=program.name)
    module.triple = NVPTX_TRIPLE
    module.data_layout = NVPTX_DATA_LAYOUT
    for kernel in program.kernels:
        GpuCodegen(module, kernel.func).emit_kernel()
    return GpuModule(program, target, str(module))


def emit_ptx(mod: GpuModule, target: GpuTarget) -> GpuModule:
    """Optimize (O3) and emit PTX for the target architecture."""
    _initialize()
    machine = llvm.Target.from_triple(NVPTX_TRIPLE).create_target_machine(cpu=target.arch, features="+ptx80", opt=3)
    ref = optimize_o3(mod.llvm_ir, machine, vectorize=False)
    mod.llvm_ir = str(ref)
    mod.ptx = machine.emit_assembly(ref)
    return mod


def check_ptx(mod: GpuModule, target: GpuTarget) -> GpuModule:
    """Assemble the PTX with ``ptxas`` for the architecture (skipped when ptxas is absent)."""
    ptxas = ptxas_path()
    if ptxas is None:
        mod.ptxas_log = "ptxas is not on PATH: the PTX was not assembled"
        return mod
    with tempfile.TemporaryDirectory(prefix="gemforge-ptx-") as tmp:
        src, out = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as handle:
            handle.write(mod.ptx)
        done = subprocess.run([ptxas, f"-arch={target.arch}", "-v", src, "-o", out], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise GpuCompileError(f"ptxas rejected the generated PTX for {target.arch}: {done.stderr.strip()}")
        mod.ptxas_log = done.stderr.strip()
        with open(out, "rb") as handle:
            mod.cubin = handle.read()
    return mod


@dataclass
class GpuKernel:
    """Compiled kernels of one function. ``kernel(*arrays)`` copies the arrays to the GPU,
    launches every kernel in order and copies the written ones back; `time` measures
    the launches alone. Building needs no GPU; running does."""

    name: str
    target: GpuTarget
    program: GpuProgram
    llvm_ir: str
    ptx: str
    cubin: bytes | None
    ptxas_log: str
    _loaded: Any = field(default=None, repr=False)

    @property
    def params(self) -> list[Buffer]:
        return self.program.params

    @property
    def assembly(self) -> str:
        return self.ptx

    def check(self, arrays) -> list[np.ndarray]:
        """The arrays (C-contiguous copies where needed: they are uploaded) if they match the
        parameters, else a clear `KernelArgumentError`."""
        from ..cpu import check_arguments
        return [np.ascontiguousarray(a) for a in check_arguments(self.name, self.program.params, arrays,
                                                                 contiguous=False)]

    def _functions(self):
        from . import cuda
        dev = cuda.device()
        if self._loaded is None:
            module = dev.load_module(self.cubin if self.cubin is not None and dev.arch == self.target.arch
                                     else self.ptx.encode())
            self._loaded = [dev.function(module, k.func.name) for k in self.program.kernels]
        return dev, self._loaded

    def _run(self, arrays: list[np.ndarray], repeats: int = 0) -> float | None:
        dev, functions = self._functions()
        buffers = list(self.program.params) + list(self.program.workspaces)
        sizes = [b.size * np.dtype(b.dtype).itemsize for b in buffers]
        pointers = {b: dev.alloc(n) for b, n in zip(buffers, sizes)}
        try:
            for buf, array in zip(self.program.params, arrays):
                dev.upload(pointers[buf], array)

            def launch_all() -> None:
                for k, fn in zip(self.program.kernels, functions):
                    dev.launch(fn, k.grid, k.block, [pointers[b] for b in k.func.params])
            launch_all()
            dev.synchronize()
            elapsed = None
            if repeats:
                timer = dev.timer()
                best = float("inf")
                for _ in range(repeats):
                    timer.start()
                    launch_all()
                    timer.stop()
                    best = min(best, timer.elapsed_ms())
                elapsed = best / 1e3
            written = {b for k in self.program.kernels for b in k.writes}
            for buf, array in zip(self.program.params, arrays):
                if buf in written:
                    dev.download(array, pointers[buf])
            return elapsed
        finally:
            for ptr in pointers.values():
                dev.free(ptr)

    def __call__(self, *arrays: np.ndarray) -> None:
        checked = self.check(arrays)
        self._run(checked)
        for original, result in zip(arrays, checked):
            if result is not original:
                original[...] = result

    def time(self, *arrays: np.ndarray, repeats: int = 10) -> float:
        """Seconds of the fastest of ``repeats`` launches of all kernels (data on the GPU)."""
        return self._run(self.check(arrays), repeats)


def load(mod: GpuModule, target: GpuTarget) -> GpuKernel:
    """The kernel object (modules load into the CUDA driver at the first call)."""
    return GpuKernel(mod.program.name, target, mod.program, mod.llvm_ir, mod.ptx, mod.cubin, mod.ptxas_log)


def stages(target: GpuTarget) -> dict[str, Callable[[Any], Any]]:
    """The GPU back end's stages, in order (see the module docstring)."""
    return {
        "split_kernels": split_kernels,
        "insert_barriers": insert_barriers,
        "bind_threads": bind_threads,
        "make_llvm_ir": partial(make_llvm_ir, target=target),
        "emit_ptx": partial(emit_ptx, target=target),
        "check_ptx": partial(check_ptx, target=target),
        "load": partial(load, target=target),
    }
