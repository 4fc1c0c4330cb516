"""What compiled CPU code calls at run time: the parallel-loop runner.

Generated code runs a ``parallel`` loop by calling ``gf_parallel_for(body,
closure, n)``: ``body(closure, begin, end)`` is the outlined loop body (a
native function), and the runner splits ``[0, n)`` into one contiguous chunk
per thread. The runner is a Python callback on a thread pool; every chunk is a
ctypes call into native code, which releases the GIL, so the chunks run on
all cores at once. The calling thread runs the first chunk itself.

Nested parallel loops do not nest thread pools: the code generator runs a
parallel loop inside another one serially.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm

__all__ = ["RUNTIME_SYMBOLS", "install", "set_threads", "thread_count"]

_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_PARALLEL_FOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_threads = 0
_installed = False


def thread_count() -> int:
    """Threads parallel loops use (the CPU target's, else one per available core)."""
    if _threads:
        return _threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def set_threads(count: int) -> None:
    """Use ``count`` threads for parallel loops (0: one per core)."""
    global _threads, _pool
    with _lock:
        if count != _threads:
            _threads = count
            if _pool is not None:
                _pool.shutdown(wait=True)
                _pool = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, thread_count() - 1), thread_name_prefix="gemforge-cpu")
        return _pool


def _parallel_for(body: int, closure: int, n: int) -> None:
    fn = _BODY(body)
    threads = min(thread_count(), n)
    if threads <= 1:
        fn(closure, 0, n)
        return
    bounds = [n * t // threads for t in range(threads + 1)]
    pool = _executor()
    futures = [pool.submit(fn, closure, bounds[t], bounds[t + 1]) for t in range(1, threads)]
    fn(closure, bounds[0], bounds[1])
    for f in futures:
        f.result()


_callback = _PARALLEL_FOR(_parallel_for)

#: Symbols generated code may call, with their LLVM signatures (return, arguments).
RUNTIME_SYMBOLS = {"gf_parallel_for": ("void", ("ptr", "ptr", "i64"))}


def install() -> None:
    """Make the runtime's symbols resolvable by JIT-compiled code (once per process)."""
    global _installed
    if not _installed:
        llvm.add_symbol("gf_parallel_for", ctypes.cast(_callback, ctypes.c_void_p).value)
        _installed = True
