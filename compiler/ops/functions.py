"""The element-wise float functions, each defined once: its numpy meaning and its kernel expression.

A `FloatFunction` is everything the stack needs to know about one function of one float32
tensor: the graph's reference (`numpy`, in float64, rounded to float32 once by the caller),
the loop IR expression the CPU and GPU kernels compute (`expression`), whether it takes a
parameter ``alpha`` and whether the GPU back end can compile it (it has no exp, log or tanh:
no libdevice). The graph's operators (`compiler.graph.operators`), the element-wise kernel
(`nn.elementwise_te`) and the host compiler's checks (`host.compile_elementwise`) all read
`FLOAT_FUNCTIONS`; adding a function is one entry here, its ONNX import and a test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ir import Call, Cmp, Const, Expr, Max, Min, Select

__all__ = ["FloatFunction", "FLOAT_FUNCTIONS"]


@dataclass(frozen=True)
class FloatFunction:
    """One element-wise function of a float32 tensor."""

    name: str
    #: What it computes, for the graph's operator table.
    doc: str
    #: float64 array (and ``alpha``) → float64 array: the reference, rounded to float32 by the caller.
    numpy: Callable[[np.ndarray, float | None], np.ndarray]
    #: Expr (and ``alpha``) → Expr: what the kernel computes, in the input's float type.
    expression: Callable[[Expr, float | None], Expr]
    #: Whether it takes the parameter ``alpha`` (a slope, a scale).
    alpha: bool = False
    #: Whether the GPU back end compiles it (it has no exp, log or tanh).
    gpu: bool = True


def _sigmoid(x: Expr, alpha=None) -> Expr:
    """1 / (1 + e^-x) from e = e^-|x|, which cannot overflow: 1 / (1 + e) for x ≥ 0 and
    e / (1 + e) below, each within a few ulps (1 − 1/(1 + e^x) would cancel for x ≪ 0)."""
    e = Call("exp", (-Call("fabs", (x,)),))
    s = Const(1.0, x.dtype) / (Const(1.0, x.dtype) + e)
    return Select(Cmp("<", x, Const(0.0, x.dtype)), e * s, s)


#: erf(x) = x · P(x²) / Q(x²) on [−4, 4] (beyond, ±1 in float32): the odd and even
#: polynomials' coefficients, lowest power first, of the rational approximation that Eigen and
#: XLA evaluate for float32 (a few ulps from the true erf).
_ERF_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
          -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10)
_ERF_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
          -1.45660718464996e-05)


def _polynomial(t: Expr, coefficients) -> Expr:
    """Σ c_k t^k by Horner's rule."""
    result = Const(coefficients[-1], t.dtype)
    for c in reversed(coefficients[:-1]):
        result = result * t + Const(c, t.dtype)
    return result


def _erf(x: Expr, alpha=None) -> Expr:
    bounded = Max(Min(x, Const(4.0, x.dtype)), Const(-4.0, x.dtype))
    t = bounded * bounded
    return bounded * _polynomial(t, _ERF_P) / _polynomial(t, _ERF_Q)


def _call(name: str) -> Callable[[Expr, float | None], Expr]:
    return lambda x, alpha=None: Call(name, (x,))


def _below_zero(x: Expr, below: Expr) -> Expr:
    return Select(Cmp("<", x, Const(0.0, x.dtype)), below, x)


_FUNCTIONS = (
    FloatFunction("sigmoid", "1 / (1 + e^−x)", lambda v, a: 1 / (1 + np.exp(-v)), _sigmoid, gpu=False),
    FloatFunction("tanh", "tanh x", lambda v, a: np.tanh(v), _call("tanh"), gpu=False),
    FloatFunction("exp", "e^x", lambda v, a: np.exp(v), _call("exp"), gpu=False),
    FloatFunction("log", "ln x", lambda v, a: np.log(v), _call("log"), gpu=False),
    FloatFunction("sqrt", "√x", lambda v, a: np.sqrt(v), _call("sqrt")),
    FloatFunction("abs", "the absolute value", lambda v, a: np.abs(v), _call("fabs")),
    # log(1 + e^x) = max(x, 0) + log(1 + e^−|x|), which cannot overflow.
    FloatFunction("softplus", "log(1 + e^x)", lambda v, a: np.logaddexp(0, v),
                  lambda x, a=None: Max(x, Const(0.0, x.dtype))
                  + Call("log", (Const(1.0, x.dtype) + Call("exp", (-Call("fabs", (x,)),)),)), gpu=False),
    # numpy has no erf: Python's, element by element (float64, correctly rounded to float32 after).
    FloatFunction("erf", "the error function", np.vectorize(lambda v, a: math.erf(v), otypes=[np.float64],
                                                            excluded={1}), _erf),
    FloatFunction("leaky_relu", "x, and alpha · x below 0", lambda v, a: np.where(v < 0, v * a, v),
                  lambda x, a: _below_zero(x, x * Const(a, x.dtype)), alpha=True),
    FloatFunction("elu", "x, and alpha · (e^x − 1) below 0",
                  lambda v, a: np.where(v < 0, a * np.expm1(np.minimum(v, 0)), v),
                  lambda x, a: _below_zero(x, Const(a, x.dtype) * (Call("exp", (x,)) - Const(1.0, x.dtype))),
                  alpha=True, gpu=False),
    FloatFunction("thresholded_relu", "x above alpha, else 0", lambda v, a: np.where(v > a, v, 0.0),
                  lambda x, a: Select(Cmp("<", Const(a, x.dtype), x), x, Const(0.0, x.dtype)), alpha=True),
)

#: Every float function by name, in the order the operator table lists them.
FLOAT_FUNCTIONS: dict[str, FloatFunction] = {f.name: f for f in _FUNCTIONS}
