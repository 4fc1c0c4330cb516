"""The CUDA driver API through ctypes: just what running compiled kernels needs.

No CUDA toolkit or Python package is required — only the driver library
(``libcuda.so.1``) that an NVIDIA GPU machine has. `available` says whether a
GPU can be used here; every failure raises `CudaError` with the driver's own
error name and text.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

__all__ = ["CudaError", "available", "Device", "device"]


class CudaError(RuntimeError):
    """The CUDA driver reported an error, or there is no GPU."""


_lib = None
_lock = threading.Lock()
_device: "Device | None" = None


def _load():
    global _lib
    if _lib is None:
        for name in ("libcuda.so.1", "libcuda.so"):
            try:
                _lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise CudaError("no CUDA driver (libcuda.so.1) on this machine: GPU kernels cannot run here")
    return _lib


def _check(result: int, what: str) -> None:
    if result != 0:
        lib = _load()
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        lib.cuGetErrorName(result, ctypes.byref(name))
        lib.cuGetErrorString(result, ctypes.byref(text))
        raise CudaError(f"{what} failed: {(name.value or b'?').decode()} ({(text.value or b'').decode()})")


def available() -> bool:
    """Whether a CUDA GPU is usable in this process."""
    try:
        device()
    except CudaError:
        return False
    return True


class Device:
    """The first GPU, its primary context, and module/launch/copy helpers."""

    def __init__(self) -> None:
        lib = _load()
        self.lib = lib
        _check(lib.cuInit(0), "cuInit")
        count = ctypes.c_int()
        _check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        if count.value < 1:
            raise CudaError("the CUDA driver sees no GPU")
        self.handle = ctypes.c_int()
        _check(lib.cuDeviceGet(ctypes.byref(self.handle), 0), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.handle), "cuDevicePrimaryCtxRetain")
        self.activate()
        name = ctypes.create_string_buffer(256)
        _check(lib.cuDeviceGetName(name, 256, self.handle), "cuDeviceGetName")
        self.name = name.value.decode()
        major, minor = ctypes.c_int(), ctypes.c_int()
        _check(lib.cuDeviceGetAttribute(ctypes.byref(major), 75, self.handle), "compute capability")  # major
        _check(lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, self.handle), "compute capability")  # minor
        self.arch = f"sm_{major.value}{minor.value}"
        for attr, field in ((16, "multiprocessors"), (13, "clock_khz")):
            value = ctypes.c_int()
            _check(lib.cuDeviceGetAttribute(ctypes.byref(value), attr, self.handle), "cuDeviceGetAttribute")
            setattr(self, field, value.value)

    def activate(self) -> None:
        _check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def load_module(self, image: bytes) -> ctypes.c_void_p:
        """A module from a cubin or PTX image (PTX is compiled by the driver)."""
        module = ctypes.c_void_p()
        # PTX must end in a NUL, which every Python bytes object's buffer has.
        _check(self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)), "cuModuleLoadData")
        return module

    def function(self, module: ctypes.c_void_p, name: str) -> ctypes.c_void_p:
        fn = ctypes.c_void_p()
        _check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction({name})")
        return fn

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        _check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(1, nbytes))), "cuMemAlloc")
        return ptr.value

    def free(self, ptr: int) -> None:
        _check(self.lib.cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree")

    def upload(self, ptr: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        _check(self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), array.ctypes.data_as(ctypes.c_void_p),
                                        ctypes.c_size_t(array.nbytes)), "cuMemcpyHtoD")

    def download(self, array: np.ndarray, ptr: int) -> None:
        _check(self.lib.cuMemcpyDtoH_v2(array.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(ptr),
                                        ctypes.c_size_t(array.nbytes)), "cuMemcpyDtoH")

    def launch(self, fn: ctypes.c_void_p, grid, block, pointers: list[int]) -> None:
        values = [ctypes.c_uint64(p) for p in pointers]
        args = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        _check(self.lib.cuLaunchKernel(fn, *(ctypes.c_uint(g) for g in grid), *(ctypes.c_uint(b) for b in block),
                                       ctypes.c_uint(0), None, args, None), "cuLaunchKernel")

    def synchronize(self) -> None:
        _check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def timer(self):
        """A pair of events: record ``start``, launch, record ``stop``, then ``elapsed_ms()``."""
        return _Timer(self)


class _Timer:
    def __init__(self, dev: Device) -> None:
        self.lib = dev.lib
        self.start_event, self.stop_event = ctypes.c_void_p(), ctypes.c_void_p()
        _check(self.lib.cuEventCreate(ctypes.byref(self.start_event), 0), "cuEventCreate")
        _check(self.lib.cuEventCreate(ctypes.byref(self.stop_event), 0), "cuEventCreate")

    def start(self) -> None:
        _check(self.lib.cuEventRecord(self.start_event, None), "cuEventRecord")

    def stop(self) -> None:
        _check(self.lib.cuEventRecord(self.stop_event, None), "cuEventRecord")

    def elapsed_ms(self) -> float:
        _check(self.lib.cuEventSynchronize(self.stop_event), "cuEventSynchronize")
        ms = ctypes.c_float()
        _check(self.lib.cuEventElapsedTime(ctypes.byref(ms), self.start_event, self.stop_event), "cuEventElapsedTime")
        return ms.value

    def __del__(self) -> None:
        for event in (self.start_event, self.stop_event):
            if event.value:
                self.lib.cuEventDestroy_v2(event)


def device() -> Device:
    """The process's GPU (opened once); `CudaError` when there is none."""
    global _device
    with _lock:
        if _device is None:
            _device = Device()
        _device.activate()
        return _device
