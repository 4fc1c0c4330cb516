"""The CPU back end: loop IR → LLVM IR → optimized native code, JIT-compiled and
callable on numpy arrays.

`stages(target)`, in order::

    partition_tiles  full tiles of partially tiled axes get constant extents (`passes`)
    make_llvm_ir   PrimFunc → LLVM IR (`codegen.CpuCodegen`: vector loops, unrolling,
                   parallel loops outlined onto the runtime's thread pool)
    optimize       LLVM's O3 pipeline (loop and SLP vectorization) for the target's CPU
                   name and features (the host's by default)
    jit            MCJIT → a `CpuKernel`, called with numpy arrays

A function compiled before on this machine (`cache`: its object code and optimized IR on
disk, keyed by its structure, the CPU and the back end's source) skips the last three: its
`CpuModule` carries the cached IR and object code, and ``jit`` loads the object.

`CpuModule.llvm_ir` and `CpuKernel.assembly` are the inspectable artefacts
(``gemforge compile-op --device cpu --emit llvm|asm``).
"""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass, field
from functools import cached_property, lru_cache, partial
from typing import Any, Callable

import llvmlite.binding as llvm
import llvmlite.ir as ll
import numpy as np

from ...errors import CompileError
from ...ir import Buffer, PrimFunc
from ...passes import partition_tiles
from ...target import CpuTarget
from ..llvm.module import optimize_o3, split_workspaces
from . import cache, runtime
from .codegen import CpuCodegen

__all__ = ["stages", "CpuModule", "CpuKernel", "KernelArgumentError", "target_machine", "vector_bits",
           "vector_registers", "has_feature", "runs_here", "aligned_empty"]

#: Alignment of the arrays the back end allocates: one cache line, one AVX-512 vector
#: (a vector load that straddles two cache lines costs about twice as much).
ALIGNMENT = 64


def aligned_empty(shape, dtype, align: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an ``align``-byte boundary."""
    dtype = np.dtype(dtype)
    count = math.prod(int(d) for d in shape)         # (np.prod of a short tuple costs microseconds)
    raw = np.empty(count * dtype.itemsize + align, np.uint8)
    start = -raw.__array_interface__["data"][0] % align
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)

_init_lock = threading.Lock()
_initialized = False
_machines: dict[tuple[str, str], Any] = {}


class KernelArgumentError(CompileError):
    """A compiled kernel was called with arrays of the wrong shape, type or count."""


def _initialize() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            runtime.install()
            _initialized = True


def _host(target: CpuTarget) -> tuple[str, str]:
    """LLVM's CPU name and feature string for the target. ``features`` is ``host`` (this
    CPU's), an explicit list, or ``host`` followed by changes (``host,-avx512vnni``)."""
    return _resolved(target.cpu, target.features)


@lru_cache(maxsize=None)
def _resolved(cpu: str, features: str) -> tuple[str, str]:
    """`_host` of a (cpu, features) pair, asked of LLVM once per process."""
    _initialize()
    target = CpuTarget(cpu, features)
    cpu = llvm.get_host_cpu_name() if target.cpu == "host" else target.cpu
    parts = [p for p in target.features.split(",") if p]
    if parts and parts[0] == "host":
        flags = dict((f[1:], f[0]) for f in llvm.get_host_cpu_features().flatten().split(",") if f)
        for change in parts[1:]:
            flags[change.lstrip("+-")] = "-" if change.startswith("-") else "+"
        return cpu, ",".join(f"{sign}{name}" for name, sign in flags.items())
    return cpu, target.features


def runs_here(target: CpuTarget) -> bool:
    """Whether code compiled for ``target`` runs on this machine: its CPU has every feature the
    target's feature string turns on (code for a CPU with more would fault on an instruction)."""
    _initialize()
    host = {f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+")}
    wanted = {f[1:] for f in _host(target)[1].split(",") if f.startswith("+")}
    return wanted <= host


def has_feature(target: CpuTarget, feature: str) -> bool:
    """Whether the target CPU has ``feature`` (LLVM's name, e.g. ``avx512vnni``)."""
    _initialize()
    return f"+{feature}" in set(_host(target)[1].split(","))


def host_description() -> dict[str, str]:
    """This machine's CPU as LLVM names it and its widest vector extension, for benchmark
    reports (the CPU back end's speed depends on both)."""
    host = CpuTarget()
    vector = ("AVX-512 with VNNI" if has_feature(host, "avx512vnni") else "AVX-512" if has_feature(host, "avx512f")
              else "AVX2" if has_feature(host, "avx2") else f"{vector_bits(host)}-bit vectors")
    return {"cpu": _host(host)[0], "vector": vector}


def vector_bits(target: CpuTarget) -> int:
    """The width of the target CPU's vector registers: 512 with AVX-512, 256 with AVX, else 128."""
    _initialize()
    features = set(_host(target)[1].split(","))
    if "+avx512f" in features:
        return 512
    if "+avx" in features or "+avx2" in features:
        return 256
    return 128


def vector_registers(target: CpuTarget) -> int:
    """How many vector registers the target CPU has: 32 with AVX-512 (zmm0-31) and on
    AArch64 (v0-v31), 16 on x86-64 without it (ymm0-15 or xmm0-15). A micro-kernel's
    register tile must fit them, or LLVM spills accumulators to the stack every step."""
    _initialize()
    if "+avx512f" in set(_host(target)[1].split(",")) or llvm.get_process_triple().startswith(("aarch64", "arm64")):
        return 32
    return 16


def target_machine(target: CpuTarget, *, fresh: bool = False):
    """LLVM's target machine for the CPU target: a shared one for optimization and
    assembly, or with ``fresh`` a new one (an execution engine takes ownership of its
    machine and frees it with itself)."""
    _initialize()
    key = _host(target)

    def make():
        return llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(
            cpu=key[0], features=key[1], opt=3, codemodel="jitdefault", jit=True)
    if fresh:
        return make()
    with _init_lock:
        machine = _machines.get(key)
        if machine is None:
            machine = _machines[key] = make()
        return machine


def check_arguments(name: str, params: list[Buffer], arrays, contiguous: bool) -> list[np.ndarray]:
    """``arrays`` if they match kernel ``name``'s ``params`` in type and shape (and, with
    ``contiguous``, are C-contiguous: the kernel gets their pointers), else a clear
    `KernelArgumentError`."""
    if len(arrays) != len(params):
        raise KernelArgumentError(f"{name} takes {len(params)} arrays "
                                  f"({', '.join(b.name for b in params)}), not {len(arrays)}")
    for array, buf in zip(arrays, params):
        if not isinstance(array, np.ndarray):
            raise KernelArgumentError(f"argument {buf.name} must be a numpy array, not {type(array).__name__}")
        if array.dtype != np.dtype(buf.dtype) or tuple(array.shape) != tuple(buf.shape):
            raise KernelArgumentError(f"argument {buf.name} must be {buf.dtype}{list(buf.shape)}, not "
                                      f"{array.dtype}{list(array.shape)}")
        if contiguous and not array.flags.c_contiguous:
            raise KernelArgumentError(f"argument {buf.name} must be C-contiguous")
    return list(arrays)


@dataclass
class CpuModule:
    """An LLVM module holding one function, before and after optimization. The
    function's intermediate tensors in main memory are ``workspaces``: extra
    parameters after the function's own, allocated once per kernel."""

    func: PrimFunc
    target: CpuTarget
    llvm_ir: str
    workspaces: list[Buffer] = field(default_factory=list)
    module: Any = None  # llvmlite.binding.ModuleRef once parsed and optimized
    #: The native code, where the kernel cache held it (``llvm_ir`` is then the optimized IR).
    object_code: bytes | None = None
    #: The kernel cache's key of ``func`` for this target (None: not cached).
    cache_key: str | None = None

    def __str__(self) -> str:
        return self.llvm_ir


@dataclass
class CpuKernel:
    """A JIT-compiled function: ``kernel(*arrays)`` runs it on C-contiguous numpy arrays
    matching the function's parameters (inputs and outputs, in order)."""

    func: PrimFunc
    target: CpuTarget
    llvm_ir: str
    workspaces: list[Buffer]
    _engine: Any = field(repr=False)
    _entry: Callable = field(repr=False)
    _scratch: list[np.ndarray] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The native code (None where MCJIT kept it to itself) and the kernel cache's key of the
    #: lowered function (None: not cached), which `prebuilt` keeps the kernel by.
    object_code: bytes | None = field(default=None, repr=False)
    cache_key: str | None = None

    @property
    def params(self):
        return self.func.params

    @cached_property
    def assembly(self) -> str:
        """The native code, as assembly text (generated on first use: most builds never look)."""
        return target_machine(self.target).emit_assembly(llvm.parse_assembly(self.llvm_ir))

    @cached_property
    def _expected(self) -> list[tuple[np.dtype, tuple[int, ...]]]:
        return [(np.dtype(b.dtype), tuple(int(d) for d in b.shape)) for b in self.func.params]

    def check(self, arrays) -> list[np.ndarray]:
        """The arrays if they match the parameters, else a clear `KernelArgumentError`."""
        expected = self._expected
        if len(arrays) == len(expected) and all(
                type(a) is np.ndarray and a.dtype == dtype and a.shape == shape and a.flags.c_contiguous
                for a, (dtype, shape) in zip(arrays, expected)):
            return arrays          # the common case, checked without building a message
        return check_arguments(self.func.name, self.func.params, arrays, contiguous=True)

    def __call__(self, *arrays: np.ndarray, threads: int | None = None) -> None:
        """Run on ``arrays``, parallel loops on ``threads`` threads (default: the target's;
        0: one per core)."""
        arrays = self.check(arrays)
        # Workspaces are allocated at the first call and reused (their pages stay
        # mapped); one call at a time uses them.
        with self._lock:
            previous = runtime.enter(self.target.threads if threads is None else threads)
            try:
                if self._scratch is None:
                    self._scratch = [aligned_empty(b.shape, b.dtype) for b in self.workspaces]
                self._entry(*(a.ctypes.data for a in arrays), *(w.ctypes.data for w in self._scratch))
            except BaseException:
                runtime.leave(previous, check=False)
                raise
            runtime.leave(previous)


def make_llvm_ir(func: PrimFunc, target: CpuTarget, *, cached: bool = True) -> CpuModule:
    """The function in LLVM IR (unoptimized), for the target's triple and data layout.
    Intermediate tensors allocated at the top of the function become workspace
    parameters (allocated once by the kernel, not per call). A function the kernel cache holds
    for this target (and ``cached``) comes back with its object code and optimized IR instead."""
    _initialize()
    key = cache.kernel_key(func, *_host(target)) if cache.cache_dir() is not None else None
    workspaces, body = split_workspaces(func)
    held = cache.load(key) if cached else None
    if held is not None:
        object_code, optimized = held
        return CpuModule(func, target, f"; {func.name}: optimized IR from the kernel cache\n{optimized}", workspaces,
                         object_code=object_code, cache_key=key)
    machine = target_machine(target)
    module = ll.Module(name=func.name)
    module.triple = llvm.get_process_triple()
    module.data_layout = str(machine.target_data)
    CpuCodegen(module, PrimFunc(func.name, func.params + workspaces, body, func.attrs),
               vnni=has_feature(target, "avx512vnni"), vl=has_feature(target, "avx512vl"),
               avx2=has_feature(target, "avx2")).emit_function()
    return CpuModule(func, target, str(module), workspaces, cache_key=key)


def optimize(mod: CpuModule, target: CpuTarget) -> CpuModule:
    """LLVM's O3 pipeline with loop and SLP vectorization for the target CPU (nothing to do for
    a module the kernel cache held)."""
    if mod.object_code is not None:
        return mod
    ref = optimize_o3(mod.llvm_ir, target_machine(target), vectorize=True)
    return CpuModule(mod.func, target, str(ref), mod.workspaces, ref, cache_key=mod.cache_key)


def _entry_point(address: int, arguments: int) -> Callable:
    """A kernel's native entry point, called with one pointer per array."""
    return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * arguments))(address)


def load_object(object_code: bytes, name: str, arguments: int, target: CpuTarget) -> tuple[Any, Callable] | None:
    """Object code of a kernel loaded into this process as it is (the kernel cache's, a model
    file's): its execution engine (which owns the code) and the entry point ``name`` taking
    ``arguments`` pointers; None where it does not load or ``name`` does not resolve."""
    _initialize()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine(target, fresh=True))
    try:
        engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
        engine.finalize_object()
    except RuntimeError:
        return None
    address = engine.get_function_address(name)
    return (engine, _entry_point(address, arguments)) if address else None


def jit(mod: CpuModule, target: CpuTarget) -> CpuKernel:
    """Native code for the module, loaded into this process: compiled by MCJIT (and kept in
    the kernel cache), or the cached object code loaded as it is."""
    arguments = len(mod.func.params) + len(mod.workspaces)
    if mod.object_code is not None:
        loaded = load_object(mod.object_code, mod.func.name, arguments, target)
        if loaded is None:       # not the kernel it should be: compile it again
            return jit(optimize(make_llvm_ir(mod.func, target, cached=False), target), target)
        engine, entry = loaded
        return CpuKernel(mod.func, target, mod.llvm_ir.split("\n", 1)[1], mod.workspaces, engine, entry,
                         object_code=mod.object_code, cache_key=mod.cache_key)
    engine = llvm.create_mcjit_compiler(mod.module, target_machine(target, fresh=True))
    compiled: list[bytes] = []
    engine.set_object_cache(lambda module, buffer: compiled.append(bytes(buffer)))
    engine.finalize_object()
    entry = _entry_point(engine.get_function_address(mod.func.name), arguments)
    if compiled:
        cache.store(mod.cache_key, compiled[0], mod.llvm_ir)
    return CpuKernel(mod.func, target, mod.llvm_ir, mod.workspaces, engine, entry,
                     object_code=compiled[0] if compiled else None, cache_key=mod.cache_key)


def stages(target: CpuTarget) -> dict[str, Callable[[Any], Any]]:
    """The CPU back end's stages, in order (see the module docstring)."""
    return {
        "partition_tiles": lambda func: func.with_body(partition_tiles(func.body)),
        "make_llvm_ir": partial(make_llvm_ir, target=target),
        "optimize": partial(optimize, target=target),
        "jit": partial(jit, target=target),
    }
