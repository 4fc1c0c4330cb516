"""Compiled CPU kernels kept on disk, so that a kernel is compiled once per machine, not per run.

Generating LLVM IR, LLVM's O3 pipeline and code generation take most of a network's first run
(ResNet-18 at 64×64, width 32: 16 s of 17). A kernel's object code and its optimized LLVM IR
are kept under ``$GEMFORGE_CACHE/cpu-kernels`` (default ``~/.cache/gemforge``; ``off`` turns the
cache off), keyed by everything its code depends on:

- the lowered function's whole structure (every statement, expression, type, buffer and
  attribute, hashed: `fingerprint`), not its printed form;
- the target CPU's LLVM name and feature string, the process triple and LLVM's version;
- the source of everything between the lowered function and the object code (this back end,
  the LLVM code generator, the IR and the passes), so a changed code generator never reuses an
  old kernel.

A kernel read back is checked: its entry point must resolve, else it is compiled again. Writes
are atomic, and a cache that cannot be read or written is skipped (the kernel is compiled as
without one). The cache holds native code this process runs, so its folder must be the user's
own and writable by no one else (it is made with mode 0700); any other is not used.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import stat
import zlib
from functools import lru_cache
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import numpy as np

from gemforge.files import write_bytes_atomic

from ...ir import PrimFunc

__all__ = ["CACHE_ENV", "cache_dir", "cache_file", "fingerprint", "kernel_key", "load", "source_digest", "store"]

#: The environment variable naming the cache's directory (``off``: no cache).
CACHE_ENV = "GEMFORGE_CACHE"
#: Bumped when what an entry holds changes.
_ENTRY_FORMAT = 1
#: The packages whose code decides what a lowered function compiles to.
_SOURCES = ("backends/cpu", "backends/llvm", "ir", "passes")


def cache_dir() -> Path | None:
    """The directory of the CPU kernels' cache, or None where it is turned off (or there is no
    home directory to put it in)."""
    root = os.environ.get(CACHE_ENV, "")
    if root.lower() == "off":
        return None
    try:
        return (Path(root) if root else Path.home() / ".cache" / "gemforge") / "cpu-kernels"
    except RuntimeError:        # no HOME and no passwd entry (a container run as a bare uid)
        return None


def _private(folder: Path) -> bool:
    """Whether ``folder`` is a real directory of this user's that no one else may write: the
    cache holds native code this process runs, so a folder another user could plant entries in
    (a shared temporary directory made by someone else) is not used."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


@lru_cache(maxsize=None)
def source_digest(folders: tuple[str, ...] = _SOURCES) -> str:
    """A digest of the source of ``folders`` of the compiler package ("" is all of it)."""
    compiler = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted((compiler / folder).rglob("*.py")):
            digest.update(path.relative_to(compiler).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint(func) -> bytes:
    """A digest of the whole structure of ``func`` (a `PrimFunc`, or a schedule's parts:
    `prebuilt`). Shared subtrees are hashed once; variables and buffers by name, type and the
    order they first appear in (distinct objects of one name stay distinct); a dictionary keyed
    by such objects (a stage's loop kinds) by its keys' digests."""
    memo: dict[int, bytes] = {}
    identities: dict[int, int] = {}
    keep = []      # keeps the objects hashed alive, so their ids stay theirs

    def digest(value) -> bytes:
        key = id(value)
        if key in memo:
            return memo[key]
        h = hashlib.sha256()
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            h.update(type(value).__qualname__.encode())
            if not type(value).__dataclass_params__.eq:
                # An object with an identity (a Var, a Buffer): the same one everywhere it is used.
                h.update(identities.setdefault(key, len(identities)).to_bytes(8, "little"))
            for f in dataclasses.fields(value):
                h.update(f.name.encode())
                h.update(digest(getattr(value, f.name)))
        elif isinstance(value, (list, tuple)):
            h.update(type(value).__name__.encode())
            for item in value:
                h.update(digest(item))
        elif isinstance(value, dict):
            if all(isinstance(k, (str, int)) for k in value):
                for k in sorted(value, key=repr):
                    h.update(repr(k).encode())
                    h.update(digest(value[k]))
            else:
                for k_digest, v in sorted((digest(k), v) for k, v in value.items()):
                    h.update(k_digest)
                    h.update(digest(v))
        elif isinstance(value, enum.Enum):
            h.update(f"{type(value).__qualname__}.{value.name}".encode())
        elif isinstance(value, np.generic):
            h.update(f"{value.dtype}:{value.item()!r}".encode())
        elif value is None or isinstance(value, (bool, int, float, str, bytes)):
            h.update(f"{type(value).__name__}:{value!r}".encode())
        else:
            raise TypeError(f"cannot fingerprint {type(value).__name__}")
        memo[key] = result = h.digest()
        keep.append(value)
        return result
    return digest(func)


def kernel_key(func: PrimFunc, cpu: str, features: str) -> str | None:
    """The cache key of ``func`` compiled for ``cpu`` with ``features``; None where the function
    cannot be fingerprinted (nested beyond Python's stack), which then compiles uncached."""
    try:
        structure = fingerprint(func)
    except (RecursionError, TypeError):
        return None
    h = hashlib.sha256()
    for part in (str(_ENTRY_FORMAT), source_digest(), llvmlite.__version__, str(llvm.llvm_version_info),
                 llvm.get_process_triple(), cpu, features, func.name):
        h.update(part.encode() + b"\0")
    h.update(structure)
    return h.hexdigest()


def cache_file(name: str, create: bool = False) -> Path | None:
    """The file ``name`` in the private cache folder (made, with ``create``), else None."""
    root = cache_dir()
    if root is None:
        return None
    if create and not root.exists():
        try:
            root.mkdir(parents=True, mode=0o700)
        except OSError:
            return None
    return root / name if _private(root) else None


def _paths(key: str, create: bool = False) -> tuple[Path, Path] | None:
    """The entry's two files, in a private cache folder (made, with ``create``), else None."""
    obj = cache_file(f"{key}.o", create)
    return None if obj is None else (obj, obj.with_name(f"{key}.ll.z"))


def load(key: str | None) -> tuple[bytes, str] | None:
    """The object code and optimized LLVM IR kept under ``key``, or None (none kept, or an entry
    whose object code is not the one its IR file's checksum names: cut short, or changed)."""
    paths = _paths(key) if key else None
    if paths is None or any(path.is_symlink() for path in paths):
        return None
    try:
        object_code = paths[0].read_bytes()
        checksum, _, llvm_ir = zlib.decompress(paths[1].read_bytes()).decode().partition("\n")
    except (OSError, zlib.error, UnicodeDecodeError):
        return None
    return (object_code, llvm_ir) if checksum == hashlib.sha256(object_code).hexdigest() else None


def store(key: str | None, object_code: bytes, llvm_ir: str) -> None:
    """Keep a kernel's object code and optimized IR under ``key``; the IR file's first line is
    the object code's SHA-256, which `load` checks."""
    paths = _paths(key, create=True) if key else None
    if paths is None or any(path.is_symlink() for path in paths):
        return
    try:
        write_bytes_atomic(paths[0], object_code)
        text = f"{hashlib.sha256(object_code).hexdigest()}\n{llvm_ir}"
        write_bytes_atomic(paths[1], zlib.compress(text.encode(), 6))
    except OSError:
        pass
