"""The ``cpu`` and ``gpu`` devices: where kernels from the LLVM back ends run.

They take the same call as the accelerator's devices — ``run_program(kernel,
inputs, outputs)`` — so a `CompiledOp` runs on any device with ``op.run``.
The CPU device runs JIT-compiled native code in this process on all cores;
the GPU device runs through the CUDA driver and is refused with a clear
message on a machine without a GPU.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gemforge.compiler.target import CpuTarget, GpuTarget, Target

from .device import DeviceError, RunResult

__all__ = ["HostDevice", "CpuDevice", "GpuDevice"]


class HostDevice:
    """A device that runs host-target kernels on numpy arrays."""

    kind = "host"
    #: It runs host-target kernels, not accelerator programs (`Device.host`).
    host = True

    def __init__(self, target: Target) -> None:
        self.target = target
        self.config = None
        self.last_result: RunResult | None = None

    def run_program(self, kernel: Any, inputs: dict[str, np.ndarray],
                    outputs: list[str]) -> tuple[dict[str, np.ndarray], RunResult]:
        """Run ``kernel`` on ``inputs`` (by parameter name); returns the ``outputs`` and the
        run's wall time."""
        if getattr(getattr(kernel, "target", None), "kind", None) != self.target.kind:
            raise DeviceError(f"this {self.kind} device runs {self.target.kind} kernels; the operator was compiled "
                              "for another target")
        from gemforge.compiler.backends.cpu import aligned_empty
        # Outputs: cache-line aligned, as the kernels' vector stores prefer, and not cleared:
        # a kernel writes every element its unpacking reads back (checked with outputs filled
        # with NaN and 0x5A over the operator and network tests).
        arrays = [inputs[buf.name] if buf.name in inputs else aligned_empty(buf.shape, buf.dtype)
                  for buf in kernel.params]
        start = time.perf_counter()
        self._call(kernel, arrays)
        seconds = time.perf_counter() - start
        by_name = {buf.name: array for buf, array in zip(kernel.params, arrays)}
        result = RunResult(counters={}, seconds=seconds)
        self.last_result = result
        return {name: by_name[name] for name in outputs}, result

    def _call(self, kernel: Any, arrays: list[np.ndarray]) -> None:
        kernel(*arrays)

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> HostDevice:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class CpuDevice(HostDevice):
    """This machine's CPU (``threads``: 0 for one per core)."""

    kind = "cpu"

    def __init__(self, config=None, threads: int = 0) -> None:
        super().__init__(CpuTarget(threads=threads))
        self.threads = threads

    def _call(self, kernel: Any, arrays: list[np.ndarray]) -> None:
        kernel(*arrays, threads=self.threads)


class GpuDevice(HostDevice):
    """The first NVIDIA GPU, through the CUDA driver; its architecture picks the target."""

    kind = "gpu"

    def __init__(self, config=None) -> None:
        from gemforge.compiler.backends.gpu import cuda
        from gemforge.compiler.target import GPU_ARCHS
        try:
            dev = cuda.device()
        except cuda.CudaError as exc:
            raise DeviceError(f"device gpu is not available: {exc}") from None
        # The device's own architecture, else the newest supported one below it (newer
        # GPUs run its PTX through the driver's compiler).
        number = int(dev.arch[3:])
        older = [a for a in GPU_ARCHS if int(a[3:]) <= number]
        if not older:
            raise DeviceError(f"device gpu is a {dev.name} ({dev.arch}); the GPU back end needs "
                              f"{GPU_ARCHS[0]} or newer")
        super().__init__(GpuTarget(max(older, key=lambda a: int(a[3:]))))
        self.name = dev.name

    def _call(self, kernel: Any, arrays: list[np.ndarray]) -> None:
        from gemforge.compiler.backends.gpu import cuda
        try:
            kernel(*arrays)
        except cuda.CudaError as exc:  # out of memory, a failed launch: the device's word, not a traceback
            raise DeviceError(f"the gpu could not run {kernel.name}: {exc}") from None
