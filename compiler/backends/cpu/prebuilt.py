"""CPU kernels built before, found from their schedule without lowering it again.

The kernel cache (`cache`) is keyed by the lowered function, so finding a kernel there means
lowering its schedule first (bounds inference, loop nests, the passes): a warm run of a
network lowered every host layer again to find the code it had compiled (MobileNetV2 float32:
most of a second). Here what `pipeline.build` is given — the schedule's stages (operations,
axes, splits, attachments, loop kinds and pragmas), its arguments and the kernel's name —
keys the kernel's *signature*: its parameters and workspaces, its object code and optimized
IR. Together with the target (LLVM's CPU name and features, the triple, LLVM's version) and
the source of the whole compiler, that decides the lowered function, so a kernel found by it
is the one lowering would give.

Two places hold such kernels:

- the kernel cache's folder, beside the object code (``<key>.sig.json``), for every kernel
  this machine has built;
- a model file (`.gfm`): `gemforge compile` collects the kernels its host layers need
  (`collecting`) and the file carries them; a run uses them (`embedded`) where their keys are
  this machine's (the same CPU and features, the same back end), and compiles — once, then
  cached — where they are not, so a file built for another CPU never runs its code here.

A schedule that cannot be fingerprinted (nested beyond Python's stack, or holding an object
the fingerprint does not know) is lowered as before.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import llvmlite
import llvmlite.binding as llvm

from gemforge.files import write_bytes_atomic

from ...ir import Buffer, Evaluate, Const, PrimFunc
from ...target import CpuTarget
from . import cache

__all__ = ["BuiltKernel", "active", "schedule_key", "find", "keep", "embedded", "collecting", "to_archive",
           "from_archive"]

#: Bumped when what a signature holds changes.
_FORMAT = 1


@dataclass(frozen=True)
class BuiltKernel:
    """A compiled kernel as it is kept: its entry point's name, its parameters and workspaces
    (``(name, shape, dtype)``), its object code and its optimized LLVM IR."""

    name: str
    params: tuple[tuple[str, tuple[int, ...], str], ...]
    workspaces: tuple[tuple[str, tuple[int, ...], str], ...]
    object_code: bytes
    llvm_ir: str

    def signature(self) -> dict:
        return {"format": _FORMAT, "name": self.name,
                "params": [[name, list(shape), dtype] for name, shape, dtype in self.params],
                "workspaces": [[name, list(shape), dtype] for name, shape, dtype in self.workspaces]}

    @classmethod
    def from_signature(cls, sig: dict, object_code: bytes, llvm_ir: str) -> BuiltKernel:
        """The kernel a signature (`signature`'s form, read from a file) describes; ValueError
        if it is malformed."""
        def buffers(items) -> tuple:
            out = []
            for item in items:
                name, shape, dtype = item
                if not (isinstance(name, str) and isinstance(dtype, str) and isinstance(shape, list)
                        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
                    raise ValueError(f"malformed kernel parameter {item!r}"[:200])
                out.append((name, tuple(shape), dtype))
            return tuple(out)
        if not isinstance(sig, dict) or sig.get("format") != _FORMAT or not isinstance(sig.get("name"), str):
            raise ValueError("not a kernel signature of this version")
        return cls(sig["name"], buffers(sig.get("params", ())), buffers(sig.get("workspaces", ())), bytes(object_code),
                   llvm_ir)


_EMBEDDED: ContextVar[dict[str, BuiltKernel] | None] = ContextVar("gemforge_embedded_kernels", default=None)
_COLLECTED: ContextVar[dict[str, BuiltKernel] | None] = ContextVar("gemforge_collected_kernels", default=None)


def active() -> bool:
    """Whether builds look for kernels built before (inside `embedded`: a network's host
    layers). Elsewhere (an operator compiled on its own, `gemforge compile-op`) a build lowers
    its schedule, so that its kernel carries the whole lowered function."""
    return _EMBEDDED.get() is not None


@contextmanager
def embedded(kernels: dict[str, BuiltKernel]) -> Iterator[None]:
    """Builds in the block look for kernels built before: in ``kernels`` (a model file's, by
    `schedule_key`), then in the kernel cache. A kernel found has its parameters and workspaces
    but not the lowered function's body."""
    token = _EMBEDDED.set(kernels)
    try:
        yield
    finally:
        _EMBEDDED.reset(token)


@contextmanager
def collecting(into: dict[str, BuiltKernel]) -> Iterator[dict[str, BuiltKernel]]:
    """Every CPU kernel built or found in the block is added to ``into`` (by `schedule_key`)."""
    token = _COLLECTED.set(into)
    try:
        yield into
    finally:
        _COLLECTED.reset(token)


def schedule_key(sch, args, name: str, target: CpuTarget) -> str | None:
    """The key of the kernel ``build(sch, target, args, name=name)`` gives: None where the
    schedule cannot be fingerprinted."""
    from . import _host
    try:
        structure = cache.fingerprint((list(sch.outputs), list(sch.stages), list(args)))
    except (RecursionError, TypeError):
        return None
    cpu, features = _host(target)
    h = hashlib.sha256()
    # Any of the compiler's source may change what a schedule lowers to.
    for part in ("schedule", str(_FORMAT), cache.source_digest(("",)), llvmlite.__version__,
                 str(llvm.llvm_version_info), llvm.get_process_triple(), cpu, features, str(target.threads), name):
        h.update(part.encode() + b"\0")
    h.update(structure)
    return h.hexdigest()


def find(key: str | None, target: CpuTarget):
    """The kernel kept under ``key`` (a model file's first, then the kernel cache's), loaded and
    ready to call, or None."""
    if key is None:
        return None
    built = (_EMBEDDED.get() or {}).get(key)
    if built is None:
        built = _from_cache(key)
    kernel = load(built, target) if built is not None else None
    if kernel is not None:
        _collect(key, built)
    return kernel


def keep(key: str | None, kernel) -> None:
    """Keep a kernel just built (a `CpuKernel` with its object code) under ``key``: its
    signature in the kernel cache's folder, and in the collection being made, if any."""
    if key is None or kernel.object_code is None:
        return
    built = BuiltKernel(kernel.func.name, tuple((b.name, tuple(int(d) for d in b.shape), b.dtype)
                                                for b in kernel.func.params),
                        tuple((b.name, tuple(int(d) for d in b.shape), b.dtype) for b in kernel.workspaces),
                        kernel.object_code, kernel.llvm_ir)
    _collect(key, built)
    path = cache.cache_file(f"{key}.sig.json", create=True)
    if path is None or kernel.cache_key is None:
        return
    try:      # the object code and IR are the kernel cache's entry already (`jit` wrote it)
        write_bytes_atomic(path, json.dumps({**built.signature(), "object": kernel.cache_key}).encode())
    except OSError:
        pass                    # a cache that cannot be written is skipped


def _collect(key: str, built: BuiltKernel) -> None:
    into = _COLLECTED.get()
    if into is not None:
        into[key] = built


def _from_cache(key: str) -> BuiltKernel | None:
    path = cache.cache_file(f"{key}.sig.json")
    if path is None:
        return None
    try:
        sig = json.loads(path.read_bytes())
        held = cache.load(sig.get("object"))
        if held is None:
            return None
        object_code, llvm_ir = held
        return BuiltKernel.from_signature(sig, object_code, llvm_ir)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def load(built: BuiltKernel, target: CpuTarget):
    """``built``'s object code loaded into this process as a `CpuKernel`, or None where it does
    not load (then it is built again)."""
    from . import CpuKernel, load_object
    params = [Buffer(n, shape, dtype) for n, shape, dtype in built.params]
    workspaces = [Buffer(n, shape, dtype) for n, shape, dtype in built.workspaces]
    loaded = load_object(built.object_code, built.name, len(params) + len(workspaces), target)
    if loaded is None:
        return None
    engine, entry = loaded
    func = PrimFunc(built.name, params, Evaluate(Const(0)), {"prebuilt": True})
    return CpuKernel(func, target, built.llvm_ir, workspaces, engine, entry, object_code=built.object_code)


def to_archive(kernels: dict[str, BuiltKernel]) -> tuple[dict, dict[str, bytes]]:
    """The model file's form of ``kernels``: an index (key → signature, digests) and members
    (``<key>.o``, ``<key>.ll.z``)."""
    index, members = {}, {}
    for key, built in sorted(kernels.items()):
        ir = zlib.compress(built.llvm_ir.encode(), 6)
        index[key] = {**built.signature(), "object_sha256": hashlib.sha256(built.object_code).hexdigest(),
                      "ir_sha256": hashlib.sha256(ir).hexdigest()}
        members[f"{key}.o"], members[f"{key}.ll.z"] = built.object_code, ir
    return index, members


def from_archive(index: dict, members: dict[str, bytes]) -> dict[str, BuiltKernel]:
    """`to_archive`'s inverse; ValueError naming what is wrong (a member missing, changed or malformed)."""
    if not isinstance(index, dict):
        raise ValueError("the host kernels' index must be an object")
    out = {}
    for key, sig in index.items():
        if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
            raise ValueError(f"host kernel key {key!r} is not 64 hexadecimal digits"[:200])
        obj, ir = members.get(f"{key}.o"), members.get(f"{key}.ll.z")
        if obj is None or ir is None:
            raise ValueError(f"host kernel {key[:12]}… has no object code or IR in the file")
        if not isinstance(sig, dict) or hashlib.sha256(obj).hexdigest() != sig.get("object_sha256") \
                or hashlib.sha256(ir).hexdigest() != sig.get("ir_sha256"):
            raise ValueError(f"host kernel {key[:12]}… is not the code its index names (changed after compiling)")
        try:
            text = zlib.decompress(ir).decode()
        except (zlib.error, UnicodeDecodeError):
            raise ValueError(f"host kernel {key[:12]}…'s IR is not compressed text") from None
        out[key] = BuiltKernel.from_signature(sig, obj, text)
    return out
