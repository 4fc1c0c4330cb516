"""An area and Fmax model fitted to synthesized configs: resources without running Yosys.

Synthesis of a `default`-sized accelerator takes minutes, so a sweep of many points
synthesizes a spread-out sample, fits each resource as a non-negative linear function of the
config's structure (`FEATURES`: what each part of the gateware scales with), predicts the
rest, and synthesizes the points the prediction puts on the Pareto front to confirm them
(`gemforge.driver.tools.sweep`). The fit's own error (leave-one-out over the sample) and its error on
the confirmed points are reported beside its predictions, as the cycle model's error is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..config import AccelConfig
from .synth import buffer_bits

__all__ = ["FEATURES", "features", "AreaModel", "fit_area_model"]


#: The structural terms a resource is a combination of: (name, what scales with it, value).
FEATURES = (
    ("fixed", "control: fetch, engines, queues, registers, counters",
     lambda c: 1.0),
    ("multiplier_bits", "the GEMM core's multipliers (batch × block_in × block_out × inp × wgt bits)",
     lambda c: c.macs_per_uop * c.inp_width * c.wgt_width),
    ("adder_bits", "the adder trees and accumulator lanes (batch × block_out × acc bits × log2 block_in)",
     lambda c: c.batch * c.block_out * c.acc_width * (1 + math.log2(c.block_in))),
    ("bus_bits", "the DMA datapaths, beat packing and banked buffer ports (bus bits)",
     lambda c: c.bus_width),
    ("buffer_bits", "on-chip buffer bits",
     lambda c: buffer_bits(c)),
)

#: Fmax is fitted on the logic depth's terms instead (not constrained to be positive).
FMAX_FEATURES = (
    ("fixed", lambda c: 1.0),
    ("log2_block_in", lambda c: math.log2(c.block_in)),
    ("log2_lanes", lambda c: math.log2(c.batch * c.block_out)),
    ("log2_bus", lambda c: math.log2(c.bus_width)),
)


def features(config: AccelConfig) -> np.ndarray:
    return np.array([f(config) for _, _, f in FEATURES], dtype=np.float64)


def _fmax_features(config: AccelConfig) -> np.ndarray:
    return np.array([f(config) for _, f in FMAX_FEATURES], dtype=np.float64)


def _fit(x: np.ndarray, y: np.ndarray, positive: bool) -> np.ndarray:
    from sklearn.linear_model import LinearRegression
    # The columns differ by orders of magnitude: fit on scaled columns, return raw coefficients.
    scale = np.where(np.abs(x).max(axis=0) > 0, np.abs(x).max(axis=0), 1.0)
    model = LinearRegression(fit_intercept=False, positive=positive).fit(x / scale, y)
    return model.coef_ / scale


@dataclass
class AreaModel:
    """Per-resource coefficients over `FEATURES` (and over `FMAX_FEATURES` for Fmax), with the
    leave-one-out relative error of each over the sample it was fitted to."""

    resources: dict[str, np.ndarray]
    fmax: np.ndarray | None
    loo_error: dict[str, float]
    samples: int

    def predict(self, config: AccelConfig) -> tuple[dict[str, int], float | None]:
        x = features(config)
        used = {name: max(0, int(round(float(x @ coef)))) for name, coef in self.resources.items()}
        fmax = float(_fmax_features(config) @ self.fmax) if self.fmax is not None else None
        return used, (round(max(1.0, fmax), 2) if fmax is not None else None)

    def to_json(self) -> dict:
        return {"samples": self.samples, "features": [name for name, _, _ in FEATURES],
                "coefficients": {name: [float(v) for v in coef] for name, coef in self.resources.items()},
                "fmax_features": [name for name, _ in FMAX_FEATURES] if self.fmax is not None else None,
                "fmax_coefficients": [float(v) for v in self.fmax] if self.fmax is not None else None,
                "leave_one_out_error": {k: round(v, 4) for k, v in self.loo_error.items()}}


def fit_area_model(configs: list[AccelConfig], resources: list[dict[str, int]],
                   fmax: list[float | None] | None = None) -> AreaModel:
    """Fit every resource the samples all report (and Fmax where every sample has one)."""
    if len(configs) < 2:
        raise ValueError("an area model needs at least two synthesized samples")
    x = np.stack([features(c) for c in configs])
    names = sorted(set.intersection(*(set(r) for r in resources)))
    coefs, loo = {}, {}
    for name in names:
        y = np.array([r[name] for r in resources], dtype=np.float64)
        coefs[name] = _fit(x, y, positive=True)
        errors = []
        for k in range(len(configs)):
            keep = np.arange(len(configs)) != k
            coef = _fit(x[keep], y[keep], positive=True)
            errors.append(abs(float(x[k] @ coef) / y[k] - 1) if y[k] else 0.0)
        loo[name] = max(errors)
    fcoef = None
    if fmax is not None and all(f for f in fmax):
        xf = np.stack([_fmax_features(c) for c in configs])
        yf = np.array(fmax, dtype=np.float64)
        fcoef = _fit(xf, yf, positive=False)
        loo["fmax_mhz"] = max(abs(float(xf[k] @ _fit(xf[np.arange(len(configs)) != k],
                                                      yf[np.arange(len(configs)) != k], False)) / yf[k] - 1)
                              for k in range(len(configs)))
    return AreaModel(coefs, fcoef, loo, len(configs))
