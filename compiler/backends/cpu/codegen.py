"""The CPU specifics of LLVM code generation: parallel loops and main-memory allocations.

A ``parallel`` loop is outlined into a function ``body(closure, begin, end)``
that runs iterations ``[begin, end)``; the values it needs (the variables and
buffer pointers in scope) travel in a closure struct on the caller's stack,
and the runtime (`runtime.gf_parallel_for`) runs chunks of the range on all
cores. A parallel loop inside another runs serially.

Intermediate tensors in main memory (``global`` allocations that are not
parameters) are allocated with ``aligned_alloc`` and freed after their scope;
``local`` arrays live on the stack (registers, after optimization), up to
`MAX_STACK_BYTES`, and on the heap beyond.
"""

from __future__ import annotations

import llvmlite.ir as ll

from ...ir import Buffer, For, Var, bits, simplify
from ..llvm.codegen import I64, LLVMCodegen

__all__ = ["CpuCodegen", "MAX_STACK_BYTES"]

#: ``local`` arrays up to this size live on the stack (registers, after optimization);
#: larger ones are allocated on the heap so that no thread's stack overflows.
MAX_STACK_BYTES = 128 * 1024


class CpuCodegen(LLVMCodegen):
    """``vnni``: the CPU has AVX-512 VNNI (``vpdpbusd``), which `dot4` uses on vectors of
    4, 8 or 16 lanes (``vl``: the 128- and 256-bit forms exist too); ``avx2``: without VNNI,
    `dot4` runs on AVX2's byte and word multiply-adds, exactly (`_dot4_avx2`)."""

    def __init__(self, module: ll.Module, func, *, vnni: bool = False, vl: bool = False, avx2: bool = False) -> None:
        super().__init__(module, func)
        self._outlined = 0
        self._in_parallel = False
        self.vnni = vnni
        self.vl = vl
        self.avx2 = avx2

    def dot4(self, acc, a, b, below_128: bool = False):
        a, b = self._match(a, b)
        lanes = a.type.count if isinstance(a.type, ll.VectorType) else 1
        if self.vnni and lanes > 16 and lanes % 16 == 0:
            # Wider vectors: one instruction per 16 lanes.
            if acc is not None and not isinstance(acc.type, ll.VectorType):
                acc = self.broadcast(acc, lanes)
            parts = [self.dot4(None if acc is None else self._lanes(acc, k, 16), self._lanes(a, k, 16),
                               self._lanes(b, k, 16), below_128) for k in range(0, lanes, 16)]
            return self._concat(parts)
        if not self.vnni and self.avx2 and lanes % 8 == 0:
            return self._dot4_avx2(acc, a, b, lanes, below_128)
        if not self.vnni or lanes not in ((4, 8, 16) if self.vl else (16,)):
            return super().dot4(acc, a, b)
        # acc + Σ u8(a) × s8(b) per 32-bit lane in one instruction.
        bits = lanes * 32
        words, octets = ll.VectorType(ll.IntType(32), lanes), ll.VectorType(ll.IntType(8), lanes * 4)
        if acc is None:
            acc = ll.Constant(words, None)
        elif not isinstance(acc.type, ll.VectorType):
            acc = self.broadcast(acc, lanes)
        fn = self.intrinsic(f"llvm.x86.avx512.vpdpbusd.{bits}", words, [words, octets, octets])
        return self.builder.call(fn, [acc, self.builder.bitcast(a, octets), self.builder.bitcast(b, octets)])

    def _dot4_avx2(self, acc, a, b, lanes: int, below_128: bool = False):
        """``acc + Σ u8(a) × s8(b)`` per 32-bit lane on AVX2, bit-exact: ``vpmaddubsw`` multiplies
        unsigned by signed bytes and adds pairs into 16 bits, saturating (255 · −128 · 2 does not
        fit), so ``a`` is split into its low 7 bits and its top bit, each product pair then fits
        (127 · 128 · 2 < 2^15); ``vpmaddwd`` widens the pairs' sums to 32 bits, the top bits' by 128.
        ``below_128`` (`dot4_u7s8`): ``a`` has no top bits, one multiply-add of each suffices."""
        bld = self.builder
        if acc is not None and not isinstance(acc.type, ll.VectorType):
            acc = self.broadcast(acc, lanes)
        if lanes > 8:                    # one 256-bit register per 8 lanes
            parts = [self._dot4_avx2(None if acc is None else self._lanes(acc, k, 8), self._lanes(a, k, 8),
                                     self._lanes(b, k, 8), 8, below_128) for k in range(0, lanes, 8)]
            return self._concat(parts)
        octets, halves = ll.VectorType(ll.IntType(8), 32), ll.VectorType(ll.IntType(16), 16)
        words = ll.VectorType(ll.IntType(32), 8)
        ubs = self.intrinsic("llvm.x86.avx2.pmadd.ub.sw", halves, [octets, octets])
        wd = self.intrinsic("llvm.x86.avx2.pmadd.wd", words, [halves, halves])
        bytes_a, bytes_b = bld.bitcast(a, octets), bld.bitcast(b, octets)
        if below_128:
            total = bld.call(wd, [bld.call(ubs, [bytes_a, bytes_b]), ll.Constant(halves, [1] * 16)])
            return total if acc is None else bld.add(acc, total)
        low = bld.and_(bytes_a, ll.Constant(octets, [0x7F] * 32))
        top = bld.lshr(bytes_a, ll.Constant(octets, [7] * 32))
        total = bld.add(bld.call(wd, [bld.call(ubs, [low, bytes_b]), ll.Constant(halves, [1] * 16)]),
                        bld.call(wd, [bld.call(ubs, [top, bytes_b]), ll.Constant(halves, [128] * 16)]))
        return total if acc is None else bld.add(acc, total)

    def _lanes(self, v: ll.Value, first: int, count: int) -> ll.Value:
        mask = ll.Constant(ll.VectorType(ll.IntType(32), count), list(range(first, first + count)))
        return self.builder.shuffle_vector(v, v, mask)

    def _concat(self, parts: list[ll.Value]) -> ll.Value:
        while len(parts) > 1:
            merged = []
            for x, y in zip(parts[::2], parts[1::2]):
                n = x.type.count
                merged.append(self.builder.shuffle_vector(x, y, ll.Constant(ll.VectorType(ll.IntType(32), 2 * n),
                                                                            list(range(2 * n)))))
            parts = merged
        return parts[0]

    def allocate(self, buffer: Buffer):
        if buffer.scope == "local" and buffer.size * max(1, bits(buffer.dtype) // 8) <= MAX_STACK_BYTES:
            return super().allocate(buffer)
        if buffer.scope not in ("global", "local"):
            return super().allocate(buffer)
        # Main memory (and local arrays too large for a thread's stack): 64-byte aligned
        # from the C library, freed after the scope.
        b = self.builder
        nbytes = -(-max(1, buffer.size) * max(1, bits(buffer.dtype) // 8) // 64) * 64
        aligned_alloc = self.intrinsic("aligned_alloc", ll.PointerType(), [I64, I64])
        free = self.intrinsic("free", ll.VoidType(), [ll.PointerType()])
        ptr = b.call(aligned_alloc, [ll.Constant(I64, 64), ll.Constant(I64, nbytes)], name=buffer.name)

        def release() -> None:
            self.builder.call(free, [ptr])
        return ptr, release

    def emit_parallel(self, loop: For) -> None:
        if self._in_parallel or self.vector is not None:
            # No nested thread pools: an inner parallel loop runs serially.
            return self.counted_loop(loop.var, simplify(loop.extent), lambda: self.stmt(loop.body))
        captured_vars = [(v, val) for v, val in self.vars.items()]
        captured_bufs = [(buf, ptr) for buf, ptr in self.buffers.items()]
        fields = [val.type for _, val in captured_vars] + [ptr.type for _, ptr in captured_bufs]
        closure_type = ll.LiteralStructType(fields or [I64])
        # The caller: fill the closure, call the runner.
        b = self.builder
        closure = self.entry_alloca(closure_type, f"{loop.var.name}.closure")
        values = [val for _, val in captured_vars] + [ptr for _, ptr in captured_bufs]
        for i, value in enumerate(values):
            slot = b.gep(closure, [ll.Constant(ll.IntType(32), 0), ll.Constant(ll.IntType(32), i)], inbounds=True,
                         source_etype=closure_type)
            b.store(value, slot)
        extent = self.index(simplify(loop.extent))
        self._outlined += 1
        outer = (self.fn, self.builder, self._alloca_builder, dict(self.vars), dict(self.buffers),
                 dict(self.ranges))
        body_fn = self._outline(loop, closure_type, captured_vars, captured_bufs)
        self.fn, self.builder, self._alloca_builder, self.vars, self.buffers, self.ranges = outer
        runner = self.intrinsic("gf_parallel_for", ll.VoidType(), [ll.PointerType(), ll.PointerType(), I64])
        self.builder.call(runner, [body_fn, closure, extent])

    def _outline(self, loop: For, closure_type, captured_vars, captured_bufs) -> ll.Function:
        name = f"{self.func.name}.parallel{self._outlined}"
        fn = self.begin_function(name, [ll.PointerType(), I64, I64], linkage="internal")
        closure, begin, end = fn.args
        b = self.builder
        self.vars, self.buffers = {}, {}
        for i, (var, _) in enumerate(captured_vars):
            slot = b.gep(closure, [ll.Constant(ll.IntType(32), 0), ll.Constant(ll.IntType(32), i)], inbounds=True,
                         source_etype=closure_type)
            self.vars[var] = b.load(slot, typ=closure_type.elements[i])
        offset = len(captured_vars)
        for i, (buf, _) in enumerate(captured_bufs):
            slot = b.gep(closure, [ll.Constant(ll.IntType(32), 0), ll.Constant(ll.IntType(32), offset + i)],
                         inbounds=True, source_etype=closure_type)
            self.buffers[buf] = b.load(slot, typ=closure_type.elements[offset + i])
        self._in_parallel = True
        try:
            self._range_loop(loop, begin, end)
        finally:
            self._in_parallel = False
        self.builder.ret_void()
        return fn

    def _range_loop(self, loop: For, begin: ll.Value, end: ll.Value) -> None:
        """``for var in [begin, end)``: the chunk of the parallel loop one thread runs."""
        bound = Var(f"{loop.var.name}.end", "int64")
        self.vars[bound] = end
        self.counted_loop(loop.var, bound, lambda: self.stmt(loop.body), start=begin, range_of=loop.extent)
        self.vars.pop(bound, None)
