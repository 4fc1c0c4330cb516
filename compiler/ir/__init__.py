"""The loop IR every gemforge back end consumes: target-neutral by construction.

- `dtypes`: data types (int8…int64, float32, bool) and the promotion rule;
- `expr`: expressions (arithmetic, comparisons, logic, selects, casts, loads,
  intrinsic calls, reductions);
- `stmt`: statements (loops with a `ForKind` the schedule sets, sequences,
  allocations, stores, conditionals, attributes, bindings), buffers and
  `PrimFunc`, the function lowering produces;
- `traversal`: one generic, field-based traversal (`walk`, `StmtMutator`,
  `map_expr`, substitution);
- `arith`: simplification, intervals, evaluation;
- `printer`: `format_ir`; `verify`: the well-formedness check.

What exists only on one target (the accelerator's buffer entries, DMA copies,
GEMM/ALU micro-ops, hardware loops) is defined by that back end, as
subclasses of `Stmt` and `Node` the generic traversal handles.
"""

from .arith import (
    compile_expr, const_upper_bound, evaluate, extremes, interval, linear_coefficient, same_expr, simplify,
    simplify_in, substitute_stmt, wrap_int,
)
from .dtypes import BOOL, FLOAT_TYPES, INT_TYPES, DTypeError, bits, check_dtype, is_float, is_int, promote
from .expr import (
    INTRINSICS, Add, And, BinOp, BufferLoad, Call, Cast, Cmp, Const, Div, Expr, FloorDiv, FloorMod, Max, Min, Mul,
    Not, Or, Reduce, Select, Shr, Sub, Var, as_expr, const, eq, ne, reduction_identity, register_intrinsic,
)
from .printer import format_ir
from .stmt import (
    Allocate, AttrStmt, Buffer, BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, Node, PrimFunc, Seq, Stmt,
    seq,
)
from .traversal import (
    StmtMutator, free_vars, map_expr, replace_buffers, substitute, walk, walk_expr,
)
from .verify import VerifyError, verify

__all__ = [
    # data types
    "BOOL", "INT_TYPES", "FLOAT_TYPES", "DTypeError", "bits", "check_dtype", "is_float", "is_int", "promote",
    # expressions
    "Expr", "Var", "Const", "BinOp", "Add", "Sub", "Mul", "Div", "FloorDiv", "FloorMod", "Min", "Max", "Shr",
    "And", "Or", "Not", "Cmp", "Select", "Cast", "BufferLoad", "Call", "Reduce", "reduction_identity", "const", "as_expr", "eq", "ne",
    "INTRINSICS", "register_intrinsic",
    # statements and functions
    "Stmt", "Node", "Buffer", "ForKind", "For", "Seq", "Allocate", "BufferStore", "IfThenElse", "AttrStmt",
    "LetStmt", "Evaluate", "PrimFunc", "seq",
    # traversal
    "walk", "walk_expr", "StmtMutator", "map_expr", "substitute", "free_vars", "replace_buffers",
    # arithmetic
    "simplify", "same_expr", "simplify_in", "linear_coefficient", "interval", "const_upper_bound", "evaluate",
    "extremes", "compile_expr", "wrap_int", "substitute_stmt",
    # printing and checking
    "format_ir", "verify", "VerifyError",
]
