"""A hand-built matrix-product program: ``C = A @ B`` on any config.

This is the foundation's end-to-end path, small on purpose; the operator
compiler replaces it with a general lowering. It tiles the product to fit the
on-chip buffers, moves tiles with 2-D DMA, multiplies with one GEMM
instruction per tile step (two loop levels over ``block_in`` micro-ops), and
stores the full-width accumulators.

Device layouts (entries of the config's buffers, row-major):

* ``a``: ``(M/B, K/BI, B, BI)`` — input tiles, A padded with zeros;
* ``b``: ``(N/BO, K/BI, BO, BI)`` — weight tiles of ``Bᵀ``;
* ``c``: ``(M/B, N/BO, B, BO)`` — accumulator tiles.

Tokens: single-buffered. Each tile load waits for the GEMM that used the
previous tile (compute→load), each GEMM waits for its tiles (load→compute),
the store of a block waits for its last GEMM (compute→store), and the reset
of the next block waits for that store (store→compute); FINISH takes the
last store's token, so every queue ends empty.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gemforge.hw.config import DMA_SIZE_BITS, LOOP_ITER_BITS, AccelConfig
from gemforge.hw.isa import Finish, Gemm, Instruction, Load, MemType, Store, Uop
from gemforge.hw.program import Program, TensorRegion, arena_alignment

__all__ = [
    "GemmShapeError", "GemmPlan", "plan_gemm", "build_gemm_program", "pack_a", "pack_b", "unpack_c", "run_gemm",
]


class GemmShapeError(ValueError):
    """The operands cannot be multiplied (shape, dtype or size limits)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _int_dtype(bits: int) -> np.dtype:
    return np.dtype(f"<i{bits // 8}")


@dataclass(frozen=True)
class GemmPlan:
    """Tile counts of the product and of one on-chip block (all in entries)."""

    m: int
    k: int
    n: int
    m_tiles: int
    k_tiles: int
    n_tiles: int
    block_m: int
    block_k: int
    block_n: int


def plan_gemm(config: AccelConfig, m: int, k: int, n: int) -> GemmPlan:
    """Choose block sizes that fit the buffers and the instruction fields."""
    for name, value in (("M", m), ("K", k), ("N", n)):
        if value < 1:
            raise GemmShapeError(f"matrix dimension {name} must be at least 1, not {value}")
    c = config
    mt, kt, nt = _ceil_div(m, c.batch), _ceil_div(k, c.block_in), _ceil_div(n, c.block_out)
    max_dma = (1 << DMA_SIZE_BITS) - 1
    max_iter = (1 << LOOP_ITER_BITS) - 1
    if kt > max_dma or nt > max_dma:
        raise GemmShapeError(
            f"K={k} and N={n} give {kt} and {nt} tiles per row; a DMA row stride is at most {max_dma} "
            "tiles, so K and N must be at most "
            f"{max_dma * c.block_in} and {max_dma * c.block_out} on this config")
    bk = min(kt, c.uop_depth, c.inp_depth, c.wgt_depth, max_dma)
    bm = min(mt, c.inp_depth // bk, c.acc_depth, max_iter)
    bn = min(nt, c.wgt_depth // bk, c.acc_depth // bm, max_iter)
    return GemmPlan(m, k, n, mt, kt, nt, bm, bk, bn)


def pack_a(config: AccelConfig, a: np.ndarray) -> np.ndarray:
    """(M, K) → (M/B, K/BI, B, BI) input tiles, zero-padded."""
    b, bi = config.batch, config.block_in
    mt, kt = _ceil_div(a.shape[0], b), _ceil_div(a.shape[1], bi)
    padded = np.zeros((mt * b, kt * bi), _int_dtype(config.inp_width))
    padded[:a.shape[0], :a.shape[1]] = a
    return padded.reshape(mt, b, kt, bi).transpose(0, 2, 1, 3).copy()


def pack_b(config: AccelConfig, bmat: np.ndarray) -> np.ndarray:
    """(K, N) → (N/BO, K/BI, BO, BI) weight tiles of Bᵀ, zero-padded."""
    bo, bi = config.block_out, config.block_in
    kt, nt = _ceil_div(bmat.shape[0], bi), _ceil_div(bmat.shape[1], bo)
    padded = np.zeros((nt * bo, kt * bi), _int_dtype(config.wgt_width))
    padded[:bmat.shape[1], :bmat.shape[0]] = bmat.T
    return padded.reshape(nt, bo, kt, bi).transpose(0, 2, 1, 3).copy()


def unpack_c(config: AccelConfig, tiles: np.ndarray, m: int, n: int) -> np.ndarray:
    """(M/B, N/BO, B, BO) accumulator tiles → (M, N) int32."""
    mt, nt, b, bo = tiles.shape
    full = tiles.transpose(0, 2, 1, 3).reshape(mt * b, nt * bo)
    return full[:m, :n].astype(np.int32)


def build_gemm_program(config: AccelConfig, m: int, k: int, n: int) -> Program:
    """The program computing ``C (M×N) = A (M×K) @ B (K×N)``; tensors 'a', 'b' in, 'c' out."""
    plan = plan_gemm(config, m, k, n)
    c = config
    align = arena_alignment(c)

    def aligned(size: int) -> int:
        return _ceil_div(size, align) * align

    uops = [Uop(dst=0, src=kk, wgt=kk) for kk in range(plan.block_k)]
    a_region = TensorRegion("a", aligned(len(uops) * c.uop_entry_bytes),
                            (plan.m_tiles, plan.k_tiles, c.batch, c.block_in), _int_dtype(c.inp_width).name)
    b_region = TensorRegion("b", aligned(a_region.offset + a_region.nbytes),
                            (plan.n_tiles, plan.k_tiles, c.block_out, c.block_in), _int_dtype(c.wgt_width).name)
    c_region = TensorRegion("c", aligned(b_region.offset + b_region.nbytes),
                            (plan.m_tiles, plan.n_tiles, c.batch, c.block_out), _int_dtype(c.acc_width).name)
    arena = aligned(c_region.offset + c_region.nbytes)
    a_base = a_region.offset // c.inp_entry_bytes
    b_base = b_region.offset // c.wgt_entry_bytes
    c_base = c_region.offset // c.acc_entry_bytes

    insns: list[Instruction] = [
        Load(mem=MemType.UOP, sram_base=0, dram_base=0, y_size=1, x_size=len(uops), x_stride=len(uops))]
    first_load, first_block = True, True
    for m0 in range(0, plan.m_tiles, plan.block_m):
        bm = min(plan.block_m, plan.m_tiles - m0)
        for n0 in range(0, plan.n_tiles, plan.block_n):
            bn = min(plan.block_n, plan.n_tiles - n0)
            # Zero the accumulator block, once the previous block's store has read it.
            insns.append(Gemm(reset=True, uop_bgn=0, uop_end=1, iter_out=bm, iter_in=bn,
                              dst_factor_out=bn, dst_factor_in=1, pop_next=not first_block))
            first_block = False
            k_steps = list(range(0, plan.k_tiles, plan.block_k))
            for step, k0 in enumerate(k_steps):
                bk = min(plan.block_k, plan.k_tiles - k0)
                last_k = step == len(k_steps) - 1
                insns.append(Load(mem=MemType.INP, sram_base=0, dram_base=a_base + m0 * plan.k_tiles + k0,
                                  y_size=bm, x_size=bk, x_stride=plan.k_tiles, pop_next=not first_load))
                insns.append(Load(mem=MemType.WGT, sram_base=0, dram_base=b_base + n0 * plan.k_tiles + k0,
                                  y_size=bn, x_size=bk, x_stride=plan.k_tiles, push_next=True))
                first_load = False
                # acc[i·bn + j] += Σ_k inp[i·bk + k] · wgt[j·bk + k]
                insns.append(Gemm(uop_bgn=0, uop_end=bk, iter_out=bm, iter_in=bn,
                                  dst_factor_out=bn, dst_factor_in=1, src_factor_out=bk, src_factor_in=0,
                                  wgt_factor_out=0, wgt_factor_in=bk, pop_prev=True,
                                  push_prev=True, push_next=last_k))
            insns.append(Store(mem=MemType.ACC, sram_base=0, dram_base=c_base + m0 * plan.n_tiles + n0,
                               y_size=bm, x_size=bn, x_stride=plan.n_tiles, pop_prev=True, push_prev=True))
    # The last GEMM's compute→load token has no load to take it.
    last_gemm = max(i for i, insn in enumerate(insns) if isinstance(insn, Gemm) and insn.push_prev)
    insns[last_gemm] = replace(insns[last_gemm], push_prev=False)
    insns.append(Finish(pop_next=True))
    return Program(config, insns, uops, uop_offset=0, arena_bytes=arena,
                   tensors={r.name: r for r in (a_region, b_region, c_region)})


def run_gemm(device, a: np.ndarray, b: np.ndarray):
    """Run ``A @ B`` on ``device``; returns the (M, N) int32 product and the run's result."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise GemmShapeError(f"A must be (M, K) and B (K, N); got A{list(a.shape)} and B{list(b.shape)}")
    config = device.config
    program = build_gemm_program(config, a.shape[0], a.shape[1], b.shape[1])
    outputs, result = device.run_program(
        program, {"a": pack_a(config, a), "b": pack_b(config, b)}, ["c"])
    return unpack_c(config, outputs["c"], a.shape[0], b.shape[1]), result
