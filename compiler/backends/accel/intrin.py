"""Tensor intrinsics declared from an `AccelConfig`.

The GEMM intrinsic is the computation of one micro-op,
``acc[B][BO] += inp[B][BI] · wgt[BO][BI]ᵀ``, described as a tensor
expression so that `passes.tensorize` can check a loop nest against it
before replacing the nest by a `GemmIntrin`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemforge.hw.config import AccelConfig

from ...te import Tensor, compute, placeholder, reduce_axis, sum_

__all__ = ["TensorIntrin", "gemm_intrin"]


@dataclass(frozen=True, eq=False)
class TensorIntrin:
    """A hardware tensor operation: its declaration and the scopes of its operands."""

    name: str
    config: AccelConfig
    decl: Tensor               # the computation one call performs
    inp_scope: str = "inp"
    wgt_scope: str = "wgt"
    out_scope: str = "acc"

    @property
    def shape(self) -> tuple[int, int, int]:
        """(batch, block_out, block_in): the extents of the loops it replaces, read
        from the declaration (its output axes and its reduction axis)."""
        batch, block_out = self.decl.shape
        (k,) = self.decl.op.reduce_axes
        return batch, block_out, int(k.extent.value)


def gemm_intrin(config: AccelConfig) -> TensorIntrin:
    """The GEMM micro-op of ``config`` as a tensor intrinsic."""
    c = config
    inp = placeholder((c.batch, c.block_in), f"int{c.inp_width}", "inp", tile_dims=2)
    wgt = placeholder((c.block_out, c.block_in), f"int{c.wgt_width}", "wgt", tile_dims=2)
    k = reduce_axis(c.block_in, "k")
    acc = f"int{c.acc_width}"
    out = compute((c.batch, c.block_out),
                  lambda b, o: sum_(inp[b, k].astype(acc) * wgt[o, k].astype(acc), [k]),
                  name="gemm", dtype=acc)
    return TensorIntrin(f"gemm_{c.batch}x{c.block_in}x{c.block_out}", config, out)
