"""Loop IR → LLVM IR, shared by the CPU and GPU back ends.

`LLVMCodegen` emits one LLVM function for a `PrimFunc`: buffer parameters
become pointers (``noalias``: every parameter is its own array), buffers are
row-major, loops become counted LLVM loops. Loop kinds:

- ``serial``: a loop (LLVM's own vectorizer may still vectorize it);
- ``unroll``: the body once per iteration, the variable a constant (so local
  accumulator arrays get constant indices and live in registers);
- ``vectorize``: the body once, with the loop variable a vector of lanes
  (`_Vector`): contiguous loads and stores become vector loads and stores,
  loads that do not depend on the variable stay scalar and are broadcast, loads
  a small constant stride apart (a stride-2 convolution's windows) read the span
  as one wide vector and keep every stride-th lane, other accesses gather and
  scatter. Bodies that cannot be vectorized that way (a
  loop-carried store, a branch on the lanes) stay a loop;
- ``parallel`` and ``thread_binding``: hooks the CPU and GPU back ends
  implement (`emit_parallel`, `thread_index`).

Index arithmetic is emitted in 64 bits with ``nsw`` (loop variables are
64-bit), data arithmetic in its own type with the IR's semantics: integers
wrap, ``//`` and ``%`` floor, ``>>`` is arithmetic with negative amounts
shifting left, float→int conversion saturates. Float arithmetic carries
fast-math flags that allow contraction to FMA and reassociation, never
assuming away NaN or infinity (min/max propagate NaN, as numpy's do).

A load inside a `Select` branch, or with ``zero_outside``, clamps its indices
into the buffer (both sides of a select are evaluated), so generated code
never reads outside an array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import llvmlite.ir as ll

from ...errors import CompileError
from ...ir import (
    Add, Allocate, And, AttrStmt, BinOp, Buffer, BufferLoad, BufferStore, Call, Cast, Cmp, Const, Div, Evaluate,
    Expr, FloorDiv, FloorMod, For, ForKind, IfThenElse, LetStmt, Max, Min, Mul, Not, Or, PrimFunc, Reduce, Select,
    Seq, Shr, Stmt, Sub, Var, bits, const_upper_bound, free_vars, interval, is_float, is_int, linear_coefficient,
    simplify, simplify_in, substitute, walk, walk_expr,
)
from ...ir.dtypes import is_signed

__all__ = ["LLVMCodegen", "CodegenError", "llvm_type", "MAX_VECTOR_LANES"]

I1, I8, I32, I64 = ll.IntType(1), ll.IntType(8), ll.IntType(32), ll.IntType(64)

#: A vectorized loop longer than this is strip-mined into vectors of this many lanes.
MAX_VECTOR_LANES = 64
#: The largest constant lane stride a vector load reads as one span and a shuffle (wider
#: strides gather: the span would hold more elements skipped than kept).
MAX_LOAD_STRIDE = 4
#: Fast-math flags on float arithmetic: contraction (FMA), reassociation (vectorized
#: reductions), no signed zeros; NaN and infinity keep their meaning.
FAST_MATH = ("reassoc", "nsz", "arcp", "contract", "afn")


class CodegenError(CompileError):
    """The loop IR uses something this back end cannot generate."""


def llvm_type(dtype: str) -> ll.Type:
    if dtype == "bool":
        return I1
    if is_int(dtype):
        return ll.IntType(bits(dtype))
    if dtype == "float32":
        return ll.FloatType()
    if dtype == "float64":
        return ll.DoubleType()
    raise CodegenError(f"no LLVM type for {dtype}")


@dataclass
class _Vector:
    """The vectorized loop being emitted: its variable, lanes and the scalar first lane."""

    var: Var
    lanes: int
    base: Var  # a scalar variable bound to the first lane's value


class LLVMCodegen:
    """Emits one `PrimFunc` into an LLVM module. Subclasses (CPU, GPU) implement the
    hooks: `emit_parallel`, `thread_index`, `barrier`, `allocate`."""

    #: Address space of pointers to parameters (GPU: global memory).
    param_addrspace = 0

    def __init__(self, module: ll.Module, func: PrimFunc) -> None:
        self.module = module
        self.func = func
        self.vars: dict[Var, ll.Value] = {}
        self.ranges: dict[Var, tuple[Expr, Expr]] = {}
        self.buffers: dict[Buffer, ll.Value] = {}
        self.vector: _Vector | None = None
        self._safe_loads = 0
        self.fn: ll.Function | None = None
        self.builder: ll.IRBuilder | None = None
        self._alloca_builder: ll.IRBuilder | None = None

    # ------------------------------------------------------------------ functions

    def ptr_type(self, addrspace: int | None = None) -> ll.PointerType:
        return ll.PointerType(addrspace=self.param_addrspace if addrspace is None else addrspace)

    def begin_function(self, name: str, arg_types: list[ll.Type], *, linkage: str | None = None) -> ll.Function:
        """A new function with an entry block for allocas; makes it the current one."""
        fn = ll.Function(self.module, ll.FunctionType(ll.VoidType(), arg_types), name)
        if linkage:
            fn.linkage = linkage
        entry = fn.append_basic_block("entry")
        body = fn.append_basic_block("body")
        self._alloca_builder = ll.IRBuilder(entry)
        self._alloca_builder.branch(body)
        self._alloca_builder.position_at_start(entry)
        self.fn = fn
        self.builder = ll.IRBuilder(body)
        return fn

    def emit_function(self, name: str | None = None) -> ll.Function:
        """The whole `PrimFunc` as ``void name(ptr param, ...)``."""
        fn = self.begin_function(name or self.func.name, [self.ptr_type() for _ in self.func.params])
        for arg, buf in zip(fn.args, self.func.params):
            arg.name = _ident(buf.name)
            arg.add_attribute("noalias")
            self.buffers[buf] = arg
        self.stmt(self.func.body)
        self.builder.ret_void()
        return fn

    # ------------------------------------------------------------------ hooks

    def emit_parallel(self, loop: For) -> None:
        raise CodegenError(f"loop {loop.var.name} is parallel; this back end runs no parallel loops")

    def thread_index(self, name: str) -> ll.Value:
        raise CodegenError(f"{name} (a GPU thread index) is not available on this back end")

    def barrier(self) -> None:
        raise CodegenError("barriers exist only on the GPU back end")

    def allocate(self, buffer: Buffer) -> tuple[ll.Value, Callable[[], None] | None]:
        """Storage for ``buffer``: its pointer and an optional release to run after its scope."""
        if buffer.scope == "local":
            return self.alloca(buffer), None
        raise CodegenError(f"buffer {buffer.name} is in scope {buffer.scope!r}, which this back end cannot allocate")

    def alloca(self, buffer: Buffer) -> ll.Value:
        """A function-local array (in the entry block, so LLVM promotes it to registers)."""
        return self.entry_alloca(ll.ArrayType(llvm_type(buffer.dtype), max(1, buffer.size)), buffer.name)

    def entry_alloca(self, ty: ll.Type, name: str) -> ll.Value:
        """A stack slot of type ``ty`` in the entry block, as an opaque pointer."""
        slot = self._alloca_builder.alloca(ty, name=_ident(name))
        slot.align = 64
        slot.type = ll.PointerType()  # llvmlite would type it; the IR uses opaque pointers
        return slot

    # ------------------------------------------------------------------ statements

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                self.stmt(c)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, BufferStore):
            self.store(s)
        elif isinstance(s, Allocate):
            ptr, release = self.allocate(s.buffer)
            self.buffers[s.buffer] = ptr
            self.stmt(s.body)
            del self.buffers[s.buffer]  # out of scope: a later parallel loop must not capture it
            if release is not None:
                release()
        elif isinstance(s, IfThenElse):
            self.branch(s)
        elif isinstance(s, LetStmt):
            self.vars[s.var] = self.expr(s.value) if s.value.dtype != "int32" else self.index(s.value)
            self.stmt(s.body)
            del self.vars[s.var]
        elif isinstance(s, AttrStmt):
            self.stmt(s.body)
        elif isinstance(s, Evaluate):
            if isinstance(s.value, Call) and s.value.name == "barrier":
                self.barrier()
            else:
                self.expr(s.value)
        else:
            raise CodegenError(f"the {type(self).__name__.replace('Codegen', '')} back end cannot generate "
                               f"{type(s).__name__} (an IR node of another back end)")

    def branch(self, s: IfThenElse) -> None:
        cond = self.cond(s.cond)
        if isinstance(cond.type, ll.VectorType):
            raise CodegenError(f"condition {s.cond!r} differs between the lanes of a vectorized loop")
        if s.other is None:
            with self.builder.if_then(cond):
                self.stmt(s.then)
        else:
            with self.builder.if_else(cond) as (then, other):
                with then:
                    self.stmt(s.then)
                with other:
                    self.stmt(s.other)

    # ------------------------------------------------------------------ loops

    def loop(self, s: For) -> None:
        extent = simplify(s.extent)
        if s.kind is ForKind.PARALLEL:
            return self.emit_parallel(s)
        if s.kind is ForKind.THREAD_BINDING:
            raise CodegenError(f"loop {s.var.name} is bound to {s.thread}; this back end has no thread indices")
        if s.kind is ForKind.VTHREAD:
            raise CodegenError(f"loop {s.var.name} is a virtual thread, which only the accelerator back end runs")
        if s.kind is ForKind.UNROLLED and isinstance(extent, Const) and self.vector is None:
            return self.unrolled(s, extent.value)
        if s.kind is ForKind.VECTORIZED and isinstance(extent, Const) and self.vector is None:
            self._set_range(s.var, extent)
            ok = self.vectorizable(s)
            self.ranges.pop(s.var, None)
            if ok:
                return self.vectorized(s, extent.value)
        self.counted_loop(s.var, extent, lambda: self.stmt(s.body))

    def counted_loop(self, var: Var, extent: Expr, body: Callable[[], None], start: ll.Value | None = None,
                     range_of: Expr | None = None) -> None:
        """``for var in range(start or 0, extent)`` as an LLVM loop with a 64-bit counter;
        ``range_of`` bounds the variable for range analysis when ``extent`` is not the bound."""
        b = self.builder
        end = self.index(extent)
        begin = start if start is not None else ll.Constant(I64, 0)
        pre = b.block
        header = b.append_basic_block(f"{_ident(var.name)}.header")
        body_block = b.append_basic_block(f"{_ident(var.name)}.body")
        exit_block = b.append_basic_block(f"{_ident(var.name)}.exit")
        b.branch(header)
        b.position_at_end(header)
        counter = b.phi(I64, name=_ident(var.name))
        counter.add_incoming(begin, pre)
        b.cbranch(b.icmp_signed("<", counter, end), body_block, exit_block)
        b.position_at_end(body_block)
        self.vars[var] = counter
        self._set_range(var, extent if range_of is None else range_of)
        body()
        step = b.add(counter, ll.Constant(I64, 1), flags=["nsw"])
        counter.add_incoming(step, b.block)
        b.branch(header)
        b.position_at_end(exit_block)
        self.vars.pop(var, None)
        self.ranges.pop(var, None)

    def _set_range(self, var: Var, extent: Expr) -> None:
        try:
            self.ranges[var] = (Const(0), Const(const_upper_bound(extent) - 1))
        except ValueError:
            self.ranges.pop(var, None)

    def unrolled(self, s: For, n: int) -> None:
        for i in range(n):
            self.vars[s.var] = ll.Constant(I64, i)
            self.ranges[s.var] = (Const(i), Const(i))
            self.stmt(s.body)
        self.vars.pop(s.var, None)
        self.ranges.pop(s.var, None)

    def vectorizable(self, s: For) -> bool:
        """Whether ``s``'s body can run with its variable as a vector: no store that
        every lane would write to the same place, no read-modify-write whose lanes may
        share an element, no branch or loop bound that differs between lanes, no
        allocation, no nested parallelism."""
        var = s.var
        ok = True

        def reads(value: Expr, buffer: Buffer) -> bool:
            found = []
            walk_expr(value, lambda e: found.append(e) if isinstance(e, BufferLoad) and e.buffer is buffer else None)
            return bool(found)

        def visit(x: Stmt) -> None:
            nonlocal ok
            if isinstance(x, BufferStore):
                flat = self.flat_index(x.buffer, x.indices)
                if var not in free_vars(flat) and var in free_vars(x.value):
                    ok = False  # a reduction over the vector lanes
                elif linear_coefficient(flat, var) is None and reads(x.value, x.buffer):
                    ok = False  # lanes may read what another lane writes (e.g. B[i // 2] += A[i])
            elif isinstance(x, IfThenElse) and var in free_vars(x.cond):
                ok = False
            elif isinstance(x, For) and (var in free_vars(x.extent) or x.kind in (
                    ForKind.PARALLEL, ForKind.THREAD_BINDING, ForKind.VTHREAD)):
                ok = False
            elif isinstance(x, (Allocate, Evaluate)):
                ok = False
        walk(s.body, visit)
        return ok

    def vectorized(self, s: For, extent: int) -> None:
        """The body with ``s.var`` a vector of lanes: vectors of a power-of-two width (at
        most `MAX_VECTOR_LANES`), a loop of them when the extent holds several, then
        narrower vectors for the rest (a last single lane as a scalar)."""
        lanes = min(MAX_VECTOR_LANES, 1 << (extent.bit_length() - 1))
        full = extent // lanes
        base = Var(f"{s.var.name}.lane0", "int32")

        def emit(width: int) -> None:
            self.vector = _Vector(s.var, width, base)
            try:
                self.stmt(s.body)
            finally:
                self.vector = None

        if full == 1:
            self._bind_constant(base, 0)
            emit(lanes)
        else:
            chunk = Var(f"{s.var.name}.chunk", "int32")

            def body() -> None:
                self.vars[base] = self.builder.mul(self.vars[chunk], ll.Constant(I64, lanes), flags=["nsw"])
                self.ranges[base] = (Const(0), Const((full - 1) * lanes))
                emit(lanes)
            self.counted_loop(chunk, Const(full), body)
        start, rest = full * lanes, extent - full * lanes
        while rest:
            width = 1 << (rest.bit_length() - 1)
            if width == 1:
                self._bind_constant(s.var, start)
                self.stmt(s.body)
                self.vars.pop(s.var, None)
                self.ranges.pop(s.var, None)
            else:
                self._bind_constant(base, start)
                emit(width)
            start, rest = start + width, rest - width
        self.vars.pop(base, None)
        self.ranges.pop(base, None)

    def _bind_constant(self, var: Var, value: int) -> None:
        self.vars[var] = ll.Constant(I64, value)
        self.ranges[var] = (Const(value), Const(value))

    # ------------------------------------------------------------------ memory

    def flat_index(self, buffer: Buffer, indices) -> Expr:
        """The row-major element offset of ``indices`` in ``buffer``."""
        if len(indices) != len(buffer.shape):
            raise CodegenError(f"{buffer.name} has {len(buffer.shape)} dimensions, indexed with {len(indices)}")
        flat: Expr = Const(0)
        for index, size in zip(indices, buffer.shape):
            flat = flat * int(size) + index
        return simplify_in(flat, self._all_ranges())

    def _pointer(self, buffer: Buffer) -> ll.Value:
        try:
            return self.buffers[buffer]
        except KeyError:
            raise CodegenError(f"buffer {buffer.name} is neither a parameter nor allocated") from None

    def _address(self, buffer: Buffer, flat: ll.Value) -> ll.Value:
        return self.builder.gep(self._pointer(buffer), [flat], inbounds=True, source_etype=llvm_type(buffer.dtype))

    def _lane_split(self, flat: Expr) -> tuple[str, Expr | None]:
        """How an access with element offset ``flat`` varies over the vector lanes:
        ``uniform`` (same for all), ``contiguous`` (consecutive; returns the first
        lane's offset), ``strided`` (`_lane_stride` apart; the first lane's offset)
        or ``gather``."""
        v = self.vector
        if v is None or v.var not in free_vars(flat):
            return "uniform", None
        coefficient = linear_coefficient(flat, v.var)
        if coefficient == 1:
            return "contiguous", simplify(substitute(flat, {v.var: v.base}))
        if coefficient is not None and 2 <= coefficient <= MAX_LOAD_STRIDE:
            return "strided", simplify(substitute(flat, {v.var: v.base}))
        return "gather", None

    def _lane_stride(self, flat: Expr) -> int:
        return linear_coefficient(flat, self.vector.var)

    def _strided_load(self, buffer: Buffer, flat: Expr, first: Expr, lane_mask: ll.Value | None) -> ll.Value:
        """Lanes ``stride`` elements apart as one load of the span they cover and a shuffle
        that keeps every stride-th element (on x86 a permute of two registers, where a
        gather loads element by element). The span's elements between the lanes are
        read too, and past the last lane up to ``stride − 1`` more: where the buffer may
        end there (or ``lane_mask``, a zero-padded read's lanes, is given), a masked load
        reads the kept lanes only."""
        stride, lanes = self._lane_stride(flat), self.vector.lanes
        elem = llvm_type(buffer.dtype)
        span = stride * lanes
        wide = ll.VectorType(elem, span)
        align = max(1, bits(buffer.dtype) // 8)
        keep = ll.Constant(ll.VectorType(I32, lanes), [stride * lane for lane in range(lanes)])
        if lane_mask is None and self._span_inside(buffer, flat, stride):
            value = self.builder.load(self._address(buffer, self.index(first)), typ=wide, align=align)
            return self.builder.shuffle_vector(value, ll.Constant(wide, ll.Undefined), keep)
        if lane_mask is None:
            mask = ll.Constant(ll.VectorType(I1, span), [int(i % stride == 0) for i in range(span)])
        else:
            # Lane l of the result is element stride·l of the span: widen the mask to match.
            spread = self.builder.shuffle_vector(lane_mask, ll.Constant(lane_mask.type, None), ll.Constant(
                ll.VectorType(I32, span), [i // stride if i % stride == 0 else lanes for i in range(span)]))
            mask = spread
        space = self._addrspace(buffer)
        # No inbounds: with a mask the first lane may lie outside the buffer (its lane is off).
        address = self.builder.gep(self._pointer(buffer), [self.index(first)], source_etype=elem)
        load = self.intrinsic(f"llvm.masked.load.v{span}{_suffix(elem)}.p{space}", wide,
                              [self.ptr_type(space), I32, ll.VectorType(I1, span), wide])
        value = self.builder.call(load, [address, ll.Constant(I32, align), mask, ll.Constant(wide, None)])
        return self.builder.shuffle_vector(value, ll.Constant(wide, ll.Undefined), keep)

    def _span_inside(self, buffer: Buffer, flat: Expr, stride: int) -> bool:
        """Whether a strided load's whole span (``stride − 1`` elements past its last lane
        included) lies inside ``buffer``."""
        try:
            lo, hi = interval(flat, self._all_ranges())
        except ValueError:
            return False
        size = 1
        for extent in buffer.shape:
            size *= int(extent)
        return (isinstance(lo, Const) and isinstance(hi, Const) and lo.value >= 0
                and hi.value + stride - 1 < size)

    def _clamped(self, buffer: Buffer, indices) -> tuple[Expr, Expr | None]:
        """Indices clamped into the buffer, and the in-bounds condition (None: always)."""
        conds: list[Expr] = []
        clamped = []
        for index, size in zip(indices, buffer.shape):
            try:
                lo, hi = interval(index, self._all_ranges())
                inside = isinstance(lo, Const) and isinstance(hi, Const) and lo.value >= 0 and hi.value < size
            except ValueError:
                inside = False
            if inside:
                clamped.append(index)
                continue
            conds.append(And(Cmp("<=", Const(0), index), Cmp("<", index, Const(int(size)))))
            clamped.append(Min(Max(index, Const(0)), Const(int(size) - 1)))
        cond = None
        for c in conds:
            cond = c if cond is None else And(cond, c)
        return tuple(clamped), cond

    def _all_ranges(self) -> dict[Var, tuple[Expr, Expr]]:
        ranges = dict(self.ranges)
        if self.vector is not None:
            lo, hi = ranges.get(self.vector.base, (None, None))
            if lo is not None:
                ranges[self.vector.var] = (lo, Const(hi.value + self.vector.lanes - 1))
        return ranges

    def load(self, e: BufferLoad) -> ll.Value:
        buffer, indices, cond = e.buffer, e.indices, None
        if e.zero_outside and self.vector is not None:
            masked = self._masked_load(e)
            if masked is not None:
                return masked
        if e.zero_outside or self._safe_loads:
            indices, cond = self._clamped(buffer, indices)
            if not e.zero_outside:
                cond = None  # clamped only so a select's unused side reads inside the buffer
        value = self._raw_load(buffer, self.flat_index(buffer, indices))
        if cond is None:
            return value
        inside = self.cond(cond)
        zero = ll.Constant(value.type, None)
        if isinstance(inside.type, ll.VectorType) and not isinstance(value.type, ll.VectorType):
            value = self.broadcast(value, inside.type.count)
            zero = ll.Constant(value.type, None)
        elif isinstance(value.type, ll.VectorType) and not isinstance(inside.type, ll.VectorType):
            inside = self.broadcast(inside, value.type.count)
        return self.builder.select(inside, value, zero)

    def _masked_load(self, e: BufferLoad) -> ll.Value | None:
        """A zero-padded read whose lanes are consecutive elements: one masked vector
        load, lanes outside the buffer disabled (they read nothing and give 0)."""
        flat = self.flat_index(e.buffer, e.indices)
        kind, first = self._lane_split(flat)
        if kind not in ("contiguous", "strided"):
            return None
        _, cond = self._clamped(e.buffer, e.indices)
        if cond is None:
            return self._raw_load(e.buffer, flat)
        mask = self.cond(cond)
        lanes = self.vector.lanes
        if not isinstance(mask.type, ll.VectorType):
            mask = self.broadcast(mask, lanes)
        if kind == "strided":
            return self._strided_load(e.buffer, flat, first, mask)
        elem = llvm_type(e.buffer.dtype)
        vec = ll.VectorType(elem, lanes)
        space = self._addrspace(e.buffer)
        # No inbounds: the first lane's address may lie before the buffer (its lane is off).
        address = self.builder.gep(self._pointer(e.buffer), [self.index(first)], source_etype=elem)
        load = self.intrinsic(f"llvm.masked.load.v{lanes}{_suffix(elem)}.p{space}", vec,
                              [self.ptr_type(space), I32, ll.VectorType(I1, lanes), vec])
        align = max(1, bits(e.buffer.dtype) // 8)
        return self.builder.call(load, [address, ll.Constant(I32, align), mask, ll.Constant(vec, None)])

    def _raw_load(self, buffer: Buffer, flat: Expr) -> ll.Value:
        elem = llvm_type(buffer.dtype)
        kind, first = self._lane_split(flat)
        align = max(1, bits(buffer.dtype) // 8)
        if kind == "uniform":
            return self.builder.load(self._address(buffer, self.index(flat)), typ=elem, align=align)
        lanes = self.vector.lanes
        if kind == "contiguous":
            return self.builder.load(self._address(buffer, self.index(first)), typ=ll.VectorType(elem, lanes),
                                     align=align)
        if kind == "strided":
            return self._strided_load(buffer, flat, first, None)
        offsets = self.index(flat)
        ptrs = self.builder.gep(self._pointer(buffer), [offsets], inbounds=True, source_etype=elem)
        ptrs.type = ll.VectorType(self._pointer(buffer).type, lanes)  # a vector of addresses
        vec = ll.VectorType(elem, lanes)
        gather = self.intrinsic(f"llvm.masked.gather.v{lanes}{_suffix(elem)}.v{lanes}p{self._addrspace(buffer)}",
                                vec, [ll.VectorType(self.ptr_type(self._addrspace(buffer)), lanes), I32,
                                      ll.VectorType(I1, lanes), vec])
        mask = ll.Constant(ll.VectorType(I1, lanes), [1] * lanes)
        return self.builder.call(gather, [ptrs, ll.Constant(I32, align), mask, ll.Constant(vec, None)])

    def _addrspace(self, buffer: Buffer) -> int:
        return self._pointer(buffer).type.addrspace

    def store(self, s: BufferStore) -> None:
        flat = self.flat_index(s.buffer, s.indices)
        value = self.expr(s.value)
        kind, first = self._lane_split(flat)
        align = max(1, bits(s.buffer.dtype) // 8)
        if kind == "uniform":
            if isinstance(value.type, ll.VectorType):  # every lane stores the same place: keep the last
                value = self.builder.extract_element(value, ll.Constant(I32, value.type.count - 1))
            self.builder.store(value, self._address(s.buffer, self.index(flat)), align=align)
            return
        lanes = self.vector.lanes
        if not isinstance(value.type, ll.VectorType):
            value = self.broadcast(value, lanes)
        if kind == "contiguous":
            self.builder.store(value, self._address(s.buffer, self.index(first)), align=align)
            return
        offsets = self.index(flat)
        for lane in range(lanes):
            at = self.builder.extract_element(offsets, ll.Constant(I32, lane))
            self.builder.store(self.builder.extract_element(value, ll.Constant(I32, lane)),
                               self._address(s.buffer, at), align=align)

    # ------------------------------------------------------------------ expressions: helpers

    def intrinsic(self, name: str, ret: ll.Type, args: list[ll.Type]) -> ll.Function:
        """The declaration of an external function (an LLVM intrinsic or a runtime symbol),
        declared in the module on first use."""
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ll.Function(self.module, ll.FunctionType(ret, args), name)
        return fn

    def broadcast(self, value: ll.Value, lanes: int) -> ll.Value:
        if isinstance(value, ll.Constant) and not isinstance(value.type, ll.VectorType):
            return ll.Constant(ll.VectorType(value.type, lanes), [value.constant] * lanes)
        b = self.builder
        vec = ll.VectorType(value.type, lanes)
        one = b.insert_element(ll.Constant(vec, ll.Undefined), value, ll.Constant(I32, 0))
        return b.shuffle_vector(one, ll.Constant(vec, ll.Undefined), ll.Constant(ll.VectorType(I32, lanes),
                                                                                   [0] * lanes))

    def _match(self, a: ll.Value, b: ll.Value) -> tuple[ll.Value, ll.Value]:
        """Broadcast a scalar operand to the other's vector width."""
        va, vb = isinstance(a.type, ll.VectorType), isinstance(b.type, ll.VectorType)
        if va and not vb:
            b = self.broadcast(b, a.type.count)
        elif vb and not va:
            a = self.broadcast(a, b.type.count)
        return a, b

    def _vector_var(self) -> ll.Value:
        v = self.vector
        base = self.broadcast(self.vars[v.base], v.lanes)
        ramp = ll.Constant(ll.VectorType(I64, v.lanes), list(range(v.lanes)))
        return self.builder.add(base, ramp, flags=["nsw"])

    def _call_intrinsic(self, base: str, value_type: ll.Type, args: list[ll.Value]) -> ll.Value:
        fn = self.intrinsic(f"{base}.{_suffix(value_type)}", value_type, [value_type] * len(args))
        return self.builder.call(fn, args)

    # ------------------------------------------------------------------ expressions: indices (i64)

    def index(self, e: Expr) -> ll.Value:
        """An integer expression as 64-bit values (scalar or vector): addresses, bounds."""
        if isinstance(e, Const):
            return ll.Constant(I64, int(e.value))
        if isinstance(e, Var):
            if self.vector is not None and e is self.vector.var:
                return self._vector_var()
            value = self._var(e)
            if value.type == I64 or (isinstance(value.type, ll.VectorType) and value.type.element == I64):
                return value
            return self._extend(value, e.dtype, I64)
        if isinstance(e, (Add, Sub, Mul)) and is_int(e.dtype):
            a, b = self._match(self.index(e.a), self.index(e.b))
            op = {Add: self.builder.add, Sub: self.builder.sub, Mul: self.builder.mul}[type(e)]
            return op(a, b, flags=["nsw"])
        if isinstance(e, (FloorDiv, FloorMod)):
            return self._floor_divmod(e, self.index(e.a), self.index(e.b), I64, True)
        if isinstance(e, (Min, Max)) and is_int(e.dtype):
            a, b = self._match(self.index(e.a), self.index(e.b))
            return self._call_intrinsic("llvm.smin" if isinstance(e, Min) else "llvm.smax", a.type, [a, b])
        if isinstance(e, Select):
            cond = self.cond(e.cond)
            a, b = self._match(self.index(e.then), self.index(e.other))
            cond, a = self._match(cond, a)
            a, b = self._match(a, b)
            return self.builder.select(cond, a, b)
        if isinstance(e, Cast) and is_int(e.value.dtype) and is_int(e.to) and bits(e.to) >= 32:
            return self.index(e.value)
        value = self.expr(e)
        if not is_int(e.dtype) and e.dtype != "bool":
            raise CodegenError(f"index {e!r} is {e.dtype}, not an integer")
        return self._extend(value, e.dtype, I64)

    def _extend(self, value: ll.Value, dtype: str, to: ll.IntType) -> ll.Value:
        target = ll.VectorType(to, value.type.count) if isinstance(value.type, ll.VectorType) else to
        width = value.type.element.width if isinstance(value.type, ll.VectorType) else value.type.width
        if width == to.width:
            return value
        if width > to.width:
            return self.builder.trunc(value, target)
        return self.builder.sext(value, target) if is_signed(dtype) else self.builder.zext(value, target)

    def _var(self, v: Var) -> ll.Value:
        try:
            return self.vars[v]
        except KeyError:
            raise CodegenError(f"variable {v.name} is used outside the loops that define it") from None

    def _nonnegative(self, e: Expr) -> bool:
        try:
            lo, _ = interval(e, self._all_ranges())
        except ValueError:
            return False
        return isinstance(lo, Const) and lo.value >= 0

    def _floor_divmod(self, e: Expr, a: ll.Value, b: ll.Value, ty: ll.IntType, signed: bool) -> ll.Value:
        """Floor division or modulo (the IR's ``//`` and ``%``): the remainder takes
        the divisor's sign; ``x // 0`` and ``x % 0`` are 0 and the one overflowing
        quotient wraps (as the constant folder computes them) — never a trap.
        Positive constant divisors and operands known non-negative need no fix-up."""
        builder = self.builder
        a, b = self._match(a, b)
        div = isinstance(e, FloorDiv)
        divisor = simplify(e.b)
        positive = isinstance(divisor, Const) and divisor.value > 0
        if not positive:
            return self._guarded_divmod(e, a, b, signed)
        if not signed or self._nonnegative(e.a):
            return builder.udiv(a, b) if div else builder.urem(a, b)
        q, r = builder.sdiv(a, b), builder.srem(a, b)
        zero = ll.Constant(a.type, None)
        # r != 0 and sign(r) != sign(b): adjust toward -infinity.
        fix = builder.and_(builder.icmp_signed("!=", r, zero),
                           builder.icmp_signed("!=", builder.icmp_signed("<", r, zero),
                                               builder.icmp_signed("<", b, zero)))
        if div:
            return builder.sub(q, builder.zext(fix, a.type))
        return builder.select(fix, builder.add(r, b), r)

    def _guarded_divmod(self, e: Expr, a: ll.Value, b: ll.Value, signed: bool) -> ll.Value:
        """Floor ``//``/``%`` by a divisor that may be 0 (result 0) or −1 (quotient −a,
        wrapping): the hardware divide only ever sees a safe divisor."""
        builder = self.builder
        zero, one = self._splat(a.type, 0), self._splat(a.type, 1)
        is_zero = builder.icmp_signed("==", b, zero)
        special = builder.or_(is_zero, builder.icmp_signed("==", b, self._splat(a.type, -1))) if signed else is_zero
        safe = builder.select(special, one, b)
        if not signed:
            q, r = builder.udiv(a, safe), builder.urem(a, safe)
        else:
            q, r = builder.sdiv(a, safe), builder.srem(a, safe)
            fix = builder.and_(builder.icmp_signed("!=", r, zero),
                               builder.icmp_signed("!=", builder.icmp_signed("<", r, zero),
                                                   builder.icmp_signed("<", safe, zero)))
            q = builder.sub(q, builder.zext(fix, a.type))
            r = builder.select(fix, builder.add(r, safe), r)
        if isinstance(e, FloorDiv):
            # b = −1: −a (wraps for the most negative a); b = 0: 0.
            negated = builder.sub(zero, a)
            return builder.select(is_zero, zero, builder.select(special, negated, q)) if signed else \
                builder.select(is_zero, zero, q)
        return builder.select(special, zero, r)

    # ------------------------------------------------------------------ expressions: values

    def _pure_index(self, *exprs: Expr) -> bool:
        """Integer arithmetic on loop variables and constants only (no data): safe to
        compute in 64 bits, where data would have to wrap at its own width."""
        pure = True

        def visit(x: Expr) -> None:
            nonlocal pure
            if isinstance(x, (BufferLoad, Call)):
                pure = False
        for e in exprs:
            walk_expr(e, visit)
        return pure

    def cond(self, e: Expr) -> ll.Value:
        """A truth value (i1 or a vector of i1)."""
        value = self.index(e) if e.dtype == "int32" and self._pure_index(e) else self.expr(e)
        width = value.type.element.width if isinstance(value.type, ll.VectorType) else value.type.width
        if isinstance(value.type, (ll.IntType, ll.VectorType)) and width == 1:
            return value
        return self.builder.icmp_unsigned("!=", value, ll.Constant(value.type, None))

    def expr(self, e: Expr) -> ll.Value:
        b = self.builder
        if isinstance(e, Const):
            return ll.Constant(llvm_type(e.dtype), e.value if is_float(e.dtype) else int(e.value))
        if isinstance(e, Var):
            return self._extend(self.index(e), "int64", llvm_type(e.dtype)) if is_int(e.dtype) else self._var(e)
        if isinstance(e, BufferLoad):
            return self.load(e)
        if isinstance(e, Cmp):
            if e.a.dtype == "int32" and self._pure_index(e.a, e.b):
                x, y = self._match(self.index(e.a), self.index(e.b))
                return b.icmp_signed(e.op, x, y)
            x, y = self._match(self.expr(e.a), self.expr(e.b))
            if is_float(e.a.dtype):
                return b.fcmp_ordered(e.op, x, y) if e.op != "!=" else b.fcmp_unordered("!=", x, y)
            return b.icmp_signed(e.op, x, y) if is_signed(e.a.dtype) else b.icmp_unsigned(e.op, x, y)
        if isinstance(e, (And, Or)):
            x, y = self._match(self.cond(e.a), self.cond(e.b))
            return b.and_(x, y) if isinstance(e, And) else b.or_(x, y)
        if isinstance(e, Not):
            x = self.cond(e.value)
            return b.xor(x, self._splat(x.type, 1))
        if isinstance(e, Select):
            cond = self.cond(e.cond)
            self._safe_loads += 1
            try:
                x, y = self._match(self.expr(e.then), self.expr(e.other))
            finally:
                self._safe_loads -= 1
            cond, x = self._match(cond, x)
            x, y = self._match(x, y)
            return b.select(cond, x, y)
        if isinstance(e, Cast):
            return self.cast(self.expr(e.value), e.value.dtype, e.to)
        if isinstance(e, BinOp):
            return self.binary(e)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Reduce):
            raise CodegenError("a reduction survived lowering")
        raise CodegenError(f"cannot generate code for {type(e).__name__}")

    def binary(self, e: BinOp) -> ll.Value:
        b = self.builder
        dtype = e.dtype
        if isinstance(e, Shr):
            return self.shift(e)
        if isinstance(e, Add):
            for acc, other in ((e.a, e.b), (e.b, e.a)):
                if isinstance(other, Call) and other.name in ("dot4_u8s8", "dot4_u7s8"):
                    # An accumulation into a dot product: one instruction where the target has it.
                    return self.dot4(self.expr(acc), *(self.expr(x) for x in other.args),
                                     below_128=other.name == "dot4_u7s8")
        x, y = self._match(self.expr(e.a), self.expr(e.b))
        if is_float(dtype):
            if isinstance(e, (Add, Sub, Mul, Div)):
                op = {Add: b.fadd, Sub: b.fsub, Mul: b.fmul, Div: b.fdiv}[type(e)]
                return op(x, y, flags=FAST_MATH)
            if isinstance(e, (Min, Max)):
                # minimum/maximum propagate NaN, as numpy's do (minnum/maxnum would drop it).
                return self._call_intrinsic("llvm.minimum" if isinstance(e, Min) else "llvm.maximum", x.type, [x, y])
        elif is_int(dtype):
            signed = is_signed(dtype)
            if isinstance(e, (Add, Sub, Mul)):
                return {Add: b.add, Sub: b.sub, Mul: b.mul}[type(e)](x, y)
            if isinstance(e, (FloorDiv, FloorMod)):
                return self._floor_divmod(e, x, y, x.type, signed)
            if isinstance(e, (Min, Max)):
                name = ("llvm.smin" if isinstance(e, Min) else "llvm.smax") if signed else \
                    ("llvm.umin" if isinstance(e, Min) else "llvm.umax")
                return self._call_intrinsic(name, x.type, [x, y])
        raise CodegenError(f"cannot generate {type(e).__name__} on {dtype}")

    def shift(self, e: Shr) -> ll.Value:
        """``a >> b``: arithmetic for signed ``a`` (logical for unsigned); a negative ``b``
        shifts left; amounts of the width or more give the sign fill (signed right), 0
        (unsigned right, left) — never LLVM's poison."""
        b = self.builder
        x = self.expr(e.a)
        width = bits(e.dtype)
        signed = is_signed(e.dtype)
        amount = simplify(e.b)
        if isinstance(amount, Const):
            n = amount.value
            if n >= 0:
                if n >= width and not signed:
                    return ll.Constant(x.type, None)
                return (b.ashr if signed else b.lshr)(x, self._splat(x.type, min(n, width - 1)))
            if -n >= width:
                return ll.Constant(x.type, None)
            return b.shl(x, self._splat(x.type, -n))
        # The amount, in 64 bits so that no value of it wraps before it is clamped.
        amt = self._extend(self.expr(e.b), e.b.dtype, I64)
        x, amt = self._match(x, amt)
        zero64 = self._splat(amt.type, 0)
        negative = b.icmp_signed("<", amt, zero64)
        magnitude = b.select(negative, b.sub(zero64, amt), amt)
        past = b.icmp_unsigned(">=", magnitude, self._splat(amt.type, width))
        clamped = self._call_intrinsic("llvm.umin", amt.type, [magnitude, self._splat(amt.type, width - 1)])
        by = self._extend(clamped, "int64", x.type.element if isinstance(x.type, ll.VectorType) else x.type)
        zero = ll.Constant(x.type, None)
        right = b.ashr(x, by) if signed else b.select(past, zero, b.lshr(x, by))
        left = b.select(past, zero, b.shl(x, by))
        return b.select(negative, left, right)

    def cast(self, value: ll.Value, src: str, dst: str) -> ll.Value:
        if src == dst:
            return value
        b = self.builder
        vec = value.type.count if isinstance(value.type, ll.VectorType) else None
        target = llvm_type(dst)
        ty = ll.VectorType(target, vec) if vec else target
        if dst == "bool":
            return b.icmp_unsigned("!=", value, ll.Constant(value.type, None)) if is_int(src) else \
                b.fcmp_unordered("!=", value, ll.Constant(value.type, None))
        if src == "bool":
            return b.zext(value, ty) if is_int(dst) else b.uitofp(value, ty)
        if is_int(src) and is_int(dst):
            return self._extend(value, src, target)
        if is_int(src) and is_float(dst):
            return b.sitofp(value, ty) if is_signed(src) else b.uitofp(value, ty)
        if is_float(src) and is_int(dst):
            if vec and is_signed(dst):
                return self._saturating_vector_fptosi(value, ty, bits(dst))
            name = "llvm.fptosi.sat" if is_signed(dst) else "llvm.fptoui.sat"
            fn = self.intrinsic(f"{name}.{_suffix(ty)}.{_suffix(value.type)}", ty, [value.type])
            return b.call(fn, [value])
        if is_float(src) and is_float(dst):
            return b.fpext(value, ty) if bits(dst) > bits(src) else b.fptrunc(value, ty)
        raise CodegenError(f"cannot convert {src} to {dst}")

    def _saturating_vector_fptosi(self, value: ll.Value, ty: ll.VectorType, width: int) -> ll.Value:
        """``llvm.fptosi.sat`` of a vector, spelled out: x86's back end turns the intrinsic into
        a compare-and-convert per lane (a scalar loop of 16), where this is six vector
        instructions. Lanes in range truncate; from 2^(width−1) up, the largest integer; below
        −2^(width−1), the smallest; NaN, 0."""
        b = self.builder
        limit = float(1 << (width - 1))
        big = b.fcmp_ordered(">=", value, self._splat(value.type, limit))
        small = b.fcmp_ordered("<", value, self._splat(value.type, -limit))
        nan = b.fcmp_unordered("uno", value, value)
        outside = b.or_(b.or_(big, small), nan)
        inside = b.select(outside, ll.Constant(value.type, None), value)
        result = b.fptosi(inside, ty)
        result = b.select(big, self._splat(ty, (1 << (width - 1)) - 1), result)
        return b.select(small, self._splat(ty, -(1 << (width - 1))), result)

    def call(self, e: Call) -> ll.Value:
        if e.name in ("exp", "log", "sqrt", "fabs", "roundeven"):
            x = self.expr(e.args[0])
            return self._call_intrinsic(f"llvm.{e.name}", x.type, [x])
        if e.name in ("fma", "fmax"):
            args = [self.expr(a) for a in e.args]
            lanes = max((a.type.count for a in args if isinstance(a.type, ll.VectorType)), default=None)
            if lanes:
                args = [a if isinstance(a.type, ll.VectorType) else self.broadcast(a, lanes) for a in args]
            # maxnum ignores a NaN operand (the minimum/maximum of `binary` propagate it).
            return self._call_intrinsic("llvm.fma" if e.name == "fma" else "llvm.maxnum", args[0].type, args)
        if e.name == "tanh":
            return self.tanh(self.expr(e.args[0]))
        if e.name.startswith(("threadIdx.", "blockIdx.")):
            return self.thread_index(e.name)
        if e.name in ("dot4_u8s8", "dot4_u7s8"):
            return self.dot4(None, *(self.expr(a) for a in e.args), below_128=e.name == "dot4_u7s8")
        raise CodegenError(f"intrinsic {e.name} is not available on this back end")

    def dot4(self, acc: ll.Value | None, a: ll.Value, b: ll.Value, below_128: bool = False) -> ll.Value:
        """``acc + dot4_u8s8(a, b)`` (``acc`` may be None) from byte extractions; back ends
        with a dot-product instruction override it (``below_128``: ``a``'s bytes are, `dot4_u7s8`)."""
        bld = self.builder
        a, b = self._match(a, b)
        total = None
        for j in range(4):
            ua = bld.and_(bld.lshr(a, self._splat(a.type, 8 * j)), self._splat(a.type, 255))   # unsigned byte of a
            sb = bld.ashr(bld.shl(b, self._splat(b.type, 24 - 8 * j)), self._splat(b.type, 24))  # signed byte of b
            term = bld.mul(ua, sb)
            total = term if total is None else bld.add(total, term)
        if acc is None:
            return total
        acc, total = self._match(acc, total)
        return bld.add(acc, total)

    def _splat(self, ty: ll.Type, value: int | float) -> ll.Value:
        """``value`` as a constant of ``ty``, in every lane when ``ty`` is a vector."""
        if isinstance(ty, ll.VectorType):
            return ll.Constant(ty, [value] * ty.count)
        return ll.Constant(ty, value)

    def tanh(self, x: ll.Value) -> ll.Value:
        """tanh(x): 1 − 2 / (exp(2x) + 1), or its odd Taylor series for |x| < 0.1, where the
        difference would cancel (relative error below 1e-6 everywhere; no libm call)."""
        b = self.builder
        ty = x.type

        def c(value: float) -> ll.Value:
            return self._splat(ty, value)
        e2 = self._call_intrinsic("llvm.exp", ty, [b.fmul(x, c(2.0), flags=FAST_MATH)])
        wide = b.fsub(c(1.0), b.fdiv(c(2.0), b.fadd(e2, c(1.0), flags=FAST_MATH), flags=FAST_MATH), flags=FAST_MATH)
        x2 = b.fmul(x, x, flags=FAST_MATH)
        series = c(62.0 / 2835.0)
        for coefficient in (-17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0, 1.0):
            series = b.fadd(b.fmul(series, x2, flags=FAST_MATH), c(coefficient), flags=FAST_MATH)
        small = b.fcmp_ordered("<", self._call_intrinsic("llvm.fabs", ty, [x]), c(0.1))
        return b.select(small, b.fmul(series, x, flags=FAST_MATH), wide)


def _suffix(ty: ll.Type) -> str:
    """LLVM's overload suffix of a type (``f32``, ``i64``, ``v16f32``)."""
    if isinstance(ty, ll.VectorType):
        return f"v{ty.count}{_suffix(ty.element)}"
    if isinstance(ty, ll.FloatType):
        return "f32"
    if isinstance(ty, ll.DoubleType):
        return "f64"
    if isinstance(ty, ll.IntType):
        return f"i{ty.width}"
    raise CodegenError(f"no intrinsic suffix for {ty}")


def _ident(name: str) -> str:
    """A readable LLVM value name from an IR name."""
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name)
