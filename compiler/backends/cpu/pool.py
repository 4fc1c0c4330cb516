"""The native parallel-loop runner: ``gf_parallel_for`` and its worker threads, in LLVM IR.

A parallel loop of a compiled kernel calls ``gf_parallel_for(body, closure, n)``. Run from
Python (a ctypes callback handing chunks to a thread pool, `runtime`'s fallback) every call
cost tens of microseconds of Python on each side: MobileNetV2 float32 ran *slower* on two
threads than on one (22.0 against 16.5 ms), its 94 parallel loops per inference each paying
a thread-pool round trip. Here the runner and its workers are native code that never enters
Python:

- one worker thread per further core, started once (`start`), each waiting on its own slot
  (a 64-byte line: a generation counter, a done counter, the chunk's body, closure and
  range);
- the caller splits ``[0, n)`` into one contiguous chunk per thread, publishes each worker's
  chunk (its fields, then the generation with a release store), runs the first chunk itself
  and waits until every worker's done counter reaches the generation it published;
- a waiting thread spins briefly (``pause``), then sleeps on a futex (Linux) so that idle
  workers use no CPU; the side that changes a counter wakes its sleeper.

One parallel loop runs on the pool at a time: a caller that finds it taken (a kernel running
in another Python thread) runs its loop serially, which is correct, only slower. How many
threads a loop uses is the ``gf_threads`` global, which `runtime.running` sets for each
kernel call. After ``fork`` the child has no workers (`runtime` restarts them).

Only where the futex system call's number is known (Linux on x86-64 and AArch64); elsewhere
`runtime` keeps the Python runner.
"""

from __future__ import annotations

import ctypes
import platform
import sys

import llvmlite.binding as llvm

__all__ = ["NativePool", "supported"]

#: Slots (workers) the pool has room for.
MAX_WORKERS = 64
#: A slot: one cache line, ``{ i32 generation, i32 done, ptr body, ptr closure, i64 begin, i64 end }``
#: padded; the done counter follows the generation (`NativePool.forget_workers` reads both).
_SLOT_BYTES, _DONE_OFFSET = 64, 4
#: Spins (each a ``pause``) before a waiting thread sleeps: tens of microseconds, about the gap
#: between two kernels of a network, so a worker usually catches the next loop awake.
SPINS = 4000
#: Linux's futex system call by architecture, and its private wait and wake operations.
_FUTEX = {"x86_64": 202, "aarch64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129


def supported() -> bool:
    """Whether this machine can run the native pool (Linux with a known futex call)."""
    return sys.platform.startswith("linux") and platform.machine() in _FUTEX


def _ir(machine: str) -> str:
    pause = "call void @llvm.x86.sse2.pause()" if machine == "x86_64" else "call void @llvm.aarch64.hint(i32 1)"
    pause_decl = ("declare void @llvm.x86.sse2.pause()" if machine == "x86_64"
                  else "declare void @llvm.aarch64.hint(i32)")
    futex = _FUTEX[machine]
    return f"""
%slot = type {{ i32, i32, ptr, ptr, i64, i64, [{_SLOT_BYTES - 40} x i8] }}

@gf_slots = global [{MAX_WORKERS} x %slot] zeroinitializer, align 64
@gf_threads = global i32 1, align 64
@gf_workers = global i32 0, align 64
@gf_busy = global i32 0, align 64

declare i64 @syscall(i64, ...)
{pause_decl}

define private void @pause() {{
  {pause}
  ret void
}}

define private void @futex_wait(ptr %addr, i32 %seen) {{
  %v = zext i32 %seen to i64
  %r = call i64 (i64, ...) @syscall(i64 {futex}, ptr %addr, i64 {_FUTEX_WAIT}, i64 %v, ptr null)
  ret void
}}

define private void @futex_wake(ptr %addr) {{
  %r = call i64 (i64, ...) @syscall(i64 {futex}, ptr %addr, i64 {_FUTEX_WAKE}, i64 1)
  ret void
}}

; Wait until the counter at %addr is no longer %old (acquire), spinning, then sleeping.
define private i32 @wait_change(ptr %addr, i32 %old) {{
entry:
  br label %poll
poll:
  %k = phi i32 [0, %entry], [%k1, %pause], [0, %sleep]
  %now = load atomic i32, ptr %addr acquire, align 4
  %changed = icmp ne i32 %now, %old
  br i1 %changed, label %done, label %spin
spin:
  %k1 = add i32 %k, 1
  %more = icmp ult i32 %k1, {SPINS}
  br i1 %more, label %pause, label %sleep
pause:
  call void @pause()
  br label %poll
sleep:
  call void @futex_wait(ptr %addr, i32 %old)
  br label %poll
done:
  ret i32 %now
}}

define ptr @gf_worker(ptr %arg) {{
entry:
  %idx = ptrtoint ptr %arg to i64
  %s = getelementptr inbounds [{MAX_WORKERS} x %slot], ptr @gf_slots, i64 0, i64 %idx
  %genp = getelementptr inbounds %slot, ptr %s, i32 0, i32 0
  %donep = getelementptr inbounds %slot, ptr %s, i32 0, i32 1
  %fnp = getelementptr inbounds %slot, ptr %s, i32 0, i32 2
  %clp = getelementptr inbounds %slot, ptr %s, i32 0, i32 3
  %bp = getelementptr inbounds %slot, ptr %s, i32 0, i32 4
  %ep = getelementptr inbounds %slot, ptr %s, i32 0, i32 5
  ; Waiting for work past the last generation it finished (a chunk published before this
  ; thread first ran is not missed).
  %start = load atomic i32, ptr %donep acquire, align 4
  br label %loop
loop:
  %seen = phi i32 [%start, %entry], [%g, %loop]
  %g = call i32 @wait_change(ptr %genp, i32 %seen)
  %fn = load ptr, ptr %fnp
  %cl = load ptr, ptr %clp
  %b = load i64, ptr %bp
  %e = load i64, ptr %ep
  call void %fn(ptr %cl, i64 %b, i64 %e)
  store atomic i32 %g, ptr %donep release, align 4
  call void @futex_wake(ptr %donep)
  br label %loop
}}

define void @gf_parallel_for(ptr %body, ptr %closure, i64 %n) {{
entry:
  %want = load atomic i32, ptr @gf_threads monotonic, align 4
  %workers = load atomic i32, ptr @gf_workers acquire, align 4
  %room = add i32 %workers, 1
  %t0 = call i32 @llvm.umin.i32(i32 %want, i32 %room)
  %t1 = zext i32 %t0 to i64
  %t = call i64 @llvm.umin.i64(i64 %t1, i64 %n)
  %serial = icmp ule i64 %t, 1
  br i1 %serial, label %alone, label %lock
alone:
  call void %body(ptr %closure, i64 0, i64 %n)
  ret void
lock:
  %r = cmpxchg ptr @gf_busy, i32 0, i32 1 acquire monotonic
  %got = extractvalue {{ i32, i1 }} %r, 1
  br i1 %got, label %publish, label %alone
publish:
  %j = phi i64 [1, %lock], [%j1, %publish]
  %s = getelementptr inbounds [{MAX_WORKERS} x %slot], ptr @gf_slots, i64 0, i64 %j
  %sm1 = getelementptr inbounds %slot, ptr %s, i64 -1
  %genp = getelementptr inbounds %slot, ptr %sm1, i32 0, i32 0
  %fnp = getelementptr inbounds %slot, ptr %sm1, i32 0, i32 2
  %clp = getelementptr inbounds %slot, ptr %sm1, i32 0, i32 3
  %bp = getelementptr inbounds %slot, ptr %sm1, i32 0, i32 4
  %ep = getelementptr inbounds %slot, ptr %sm1, i32 0, i32 5
  %lo0 = mul i64 %n, %j
  %lo = udiv i64 %lo0, %t
  %j1 = add i64 %j, 1
  %hi0 = mul i64 %n, %j1
  %hi = udiv i64 %hi0, %t
  store ptr %body, ptr %fnp
  store ptr %closure, ptr %clp
  store i64 %lo, ptr %bp
  store i64 %hi, ptr %ep
  %g = load i32, ptr %genp
  %g1 = add i32 %g, 1
  store atomic i32 %g1, ptr %genp release, align 4
  call void @futex_wake(ptr %genp)
  %again = icmp ult i64 %j1, %t
  br i1 %again, label %publish, label %mine
mine:
  %first = udiv i64 %n, %t
  call void %body(ptr %closure, i64 0, i64 %first)
  br label %gather
gather:
  %w = phi i64 [0, %mine], [%w1, %waited]
  %ws = getelementptr inbounds [{MAX_WORKERS} x %slot], ptr @gf_slots, i64 0, i64 %w
  %wgen = getelementptr inbounds %slot, ptr %ws, i32 0, i32 0
  %wdone = getelementptr inbounds %slot, ptr %ws, i32 0, i32 1
  %target = load i32, ptr %wgen
  br label %check
check:
  %d = load atomic i32, ptr %wdone acquire, align 4
  %finished = icmp eq i32 %d, %target
  br i1 %finished, label %waited, label %sleep
sleep:
  %d2 = call i32 @wait_change(ptr %wdone, i32 %d)
  br label %check
waited:
  %w1 = add i64 %w, 1
  %last = add i64 %t, -1
  %more = icmp ult i64 %w1, %last
  br i1 %more, label %gather, label %free
free:
  store atomic i32 0, ptr @gf_busy release, align 4
  ret void
}}

declare i32 @llvm.umin.i32(i32, i32)
declare i64 @llvm.umin.i64(i64, i64)
"""


class NativePool:
    """The compiled runner: its entry points and globals, and its workers once `start`ed."""

    def __init__(self, target_machine) -> None:
        machine = platform.machine()
        module = llvm.parse_assembly(_ir(machine))
        module.triple = llvm.get_process_triple()
        module.verify()
        self._engine = llvm.create_mcjit_compiler(module, target_machine)   # kept: it owns the code
        self._engine.finalize_object()
        self.parallel_for = self._engine.get_function_address("gf_parallel_for")
        self._worker = self._engine.get_function_address("gf_worker")
        self._threads = ctypes.c_int32.from_address(self._engine.get_global_value_address("gf_threads"))
        self._workers = ctypes.c_int32.from_address(self._engine.get_global_value_address("gf_workers"))
        self._busy = ctypes.c_int32.from_address(self._engine.get_global_value_address("gf_busy"))
        self._libc = ctypes.CDLL(None)
        self._libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p,
                                              ctypes.c_void_p]
        self._libc.pthread_detach.argtypes = [ctypes.c_ulong]

    def start(self, workers: int) -> int:
        """Start up to ``workers`` worker threads (detached, never stopped: they sleep when idle);
        returns how many run. Called again after ``fork`` (the child has none)."""
        workers = max(0, min(workers, MAX_WORKERS))
        self._busy.value = 0
        started = 0
        for index in range(workers):
            tid = ctypes.c_ulong()
            if self._libc.pthread_create(ctypes.byref(tid), None, self._worker, index) != 0:
                break
            self._libc.pthread_detach(tid.value)
            started += 1
        self._workers.value = started        # published last: loops use workers that run
        return started

    def forget_workers(self) -> None:
        """After ``fork``: the child's pool has no threads (they were the parent's), and no chunk
        published in the parent is left pending for the workers the child starts."""
        self._workers.value = 0
        self._busy.value = 0
        slots = self._engine.get_global_value_address("gf_slots")
        for index in range(MAX_WORKERS):
            slot = slots + _SLOT_BYTES * index
            ctypes.c_int32.from_address(slot + _DONE_OFFSET).value = ctypes.c_int32.from_address(slot).value

    def set_threads(self, threads: int) -> None:
        self._threads.value = max(1, threads)
