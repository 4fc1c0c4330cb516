"""What compiled CPU code calls at run time: the parallel-loop runner.

Generated code runs a ``parallel`` loop by calling ``gf_parallel_for(body,
closure, n)``: ``body(closure, begin, end)`` is the outlined loop body (a
native function), and the runner splits ``[0, n)`` into one contiguous chunk
per thread. The calling thread runs the first chunk itself.

On Linux (x86-64, AArch64) the runner is native code with native worker threads
(`pool`): a loop never enters Python. Elsewhere it is a Python callback on a
thread pool; every chunk is a ctypes call into native code, which releases the
GIL, so the chunks run on all cores at once, at tens of microseconds a loop.

The pool is created once, with a worker per core, and never shut down; how
many threads a call uses is that call's (`running`), so kernels of different
thread counts may run at the same time from different Python threads. A
failure inside the runner (it cannot come from native code) makes it run the
remaining chunks itself and is reported by `running` when the kernel returns:
a kernel never returns with part of its loop skipped.

Nested parallel loops do not nest thread pools: the code generator runs a
parallel loop inside another one serially.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

import llvmlite.binding as llvm

from . import pool

__all__ = ["install", "running", "enter", "leave", "cores"]

_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_PARALLEL_FOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_call = threading.local()  # the current call's thread count and first error
_installed = False
_native = None             # the native pool (`pool.NativePool`), where it runs
_native_pid = 0            # the process its workers belong to (a forked child starts its own)


def cores() -> int:
    """Cores this process may run on (asked once per process: every kernel call wants it)."""
    if _cores is None or _cores_pid != os.getpid():
        _count_cores()
    return _cores


_cores: int | None = None
_cores_pid = 0


def _count_cores() -> None:
    global _cores, _cores_pid
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _cores_pid = os.getpid()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, cores() - 1), thread_name_prefix="gemforge-cpu")
        return _pool


@contextmanager
def running(threads: int) -> Iterator[None]:
    """Run a kernel with ``threads`` threads (0: one per core) in this Python thread;
    raises the runner's error, if any, when the kernel has returned."""
    previous = enter(threads)
    try:
        yield
    except BaseException:
        leave(previous, check=False)
        raise
    leave(previous)


def enter(threads: int) -> tuple:
    """`running`'s start, as a call (a kernel call pays no generator): returns what `leave` restores."""
    previous = getattr(_call, "threads", None), getattr(_call, "error", None)
    _call.threads, _call.error = threads or cores(), None
    if _native is not None:
        if _native_pid != os.getpid():
            _restart_native()
        _native.set_threads(_call.threads)
    return previous


def leave(previous: tuple, check: bool = True) -> None:
    """`running`'s end: raises the runner's error, if any (with ``check``), and restores ``previous``."""
    error = _call.error
    _call.threads, _call.error = previous
    if check and error is not None:
        raise RuntimeError(f"the parallel-loop runner failed (the loop was finished serially): {error}")


def _parallel_for(body: int, closure: int, n: int) -> None:
    fn = _BODY(body)
    threads = min(getattr(_call, "threads", None) or cores(), n)
    if threads <= 1:
        fn(closure, 0, n)
        return
    bounds = [n * t // threads for t in range(threads + 1)]
    done = [False] * threads
    futures = []
    try:
        pool = _executor()
        futures = [(t, pool.submit(fn, closure, bounds[t], bounds[t + 1])) for t in range(1, threads)]
        fn(closure, bounds[0], bounds[1])
        done[0] = True
        for t, future in futures:
            future.result()
            done[t] = True
    except BaseException as exc:  # noqa: BLE001 - reported by `running`, never lost in a callback
        _call.error = getattr(_call, "error", None) or repr(exc)
        for t, future in futures:
            try:
                future.result()
                done[t] = True
            except BaseException:  # noqa: BLE001 - that chunk runs here instead
                pass
        for t in range(threads):
            if not done[t]:
                fn(closure, bounds[t], bounds[t + 1])


_callback = _PARALLEL_FOR(_parallel_for)


def install() -> None:
    """Make ``gf_parallel_for`` resolvable by JIT-compiled code (once per process): the native
    runner where it runs, else the Python one."""
    global _installed, _native, _native_pid
    if _installed:
        return
    address = ctypes.cast(_callback, ctypes.c_void_p).value
    if pool.supported() and os.environ.get("GEMFORGE_NATIVE_POOL", "1") != "0":
        try:
            machine = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(jit=True)
            _native = pool.NativePool(machine)
            _native.start(cores() - 1)
            _native_pid = os.getpid()
            os.register_at_fork(after_in_child=_native.forget_workers)
            address = _native.parallel_for
        except (RuntimeError, OSError, AttributeError):     # no native pool here: the Python one
            _native = None
    llvm.add_symbol("gf_parallel_for", address)
    _installed = True


def _restart_native() -> None:
    """In a forked child: workers of its own (the parent's did not come along)."""
    global _native_pid
    with _lock:
        if _native_pid != os.getpid():
            _native.start(cores() - 1)
            _native_pid = os.getpid()
