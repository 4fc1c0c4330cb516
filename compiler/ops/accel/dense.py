"""``dense``: ``C = A @ B`` (int8 × int8 → int32) with an optional fused epilogue.

Tensor expression on packed tiles (see `gemforge.compiler.backends.accel.layout`)::

    c[m, n, b, o]   = Σ_ko,ki a[m, ko, b, ki] · w[n, ko, o, ki]        (accumulator)
    out[m, n, b, o] = epilogue(c[m, n, b, o], bias[n, b, o])

Default schedule (VTA's): tile the output ``tm × tn`` entries, fuse the tile
loops and split off ``V`` virtual threads (V = 2 with latency hiding, 1 if
double buffering does not fit the buffers), compute
the accumulator tile and its epilogue at the thread loop, reduce over ``K`` in
chunks of ``tk`` with the input and weight chunks DMA'd at the chunk loop,
tensorize the entry loops onto the GEMM intrinsic. `plan_dense` picks the
tile sizes for any config: the divisors of the tile counts that fit the
buffers (double-buffered) and minimize DRAM traffic plus instruction count.
"""

from __future__ import annotations

import numpy as np

from gemforge.hw.config import AccelConfig

from ...backends.accel.intrin import gemm_intrin
from ...backends.accel.layout import ceil_div, pack_matrix_a, pack_matrix_b, unpack_matrix
from ...pipeline import build
from ...schedule import Schedule, create_schedule
from ...te import Tensor, compute, placeholder, reduce_axis, sum_
from ..common import CompiledOp, Epilogue, OpError
from .common import (
    TilingCost, accel_epilogue, bias_input, check_footprint, divisors, epilogue_alu_ops, plan_with_fallback, schedule_output_tile,
    store_entry_bytes,
)

__all__ = ["dense_te", "dense_schedule", "plan_dense", "compile_dense"]



def dense_te(config: AccelConfig, mt: int, kt: int, nt: int, epilogue: Epilogue) -> dict[str, Tensor]:
    """The dense tensor expression on ``mt × kt`` input and ``nt × kt`` weight tiles."""
    c = config
    acc = f"int{c.acc_width}"
    a = placeholder((mt, kt, c.batch, c.block_in), f"int{c.inp_width}", "a", tile_dims=2)
    w = placeholder((nt, kt, c.block_out, c.block_in), f"int{c.wgt_width}", "w", tile_dims=2)
    ko, ki = reduce_axis(kt, "ko"), reduce_axis(c.block_in, "ki")
    acc_t = compute((mt, nt, c.batch, c.block_out),
                    lambda m, n, b, o: sum_(a[m, ko, b, ki].astype(acc) * w[n, ko, o, ki].astype(acc), [ko, ki]),
                    name="c", dtype=acc, tile_dims=2)
    tensors = {"a": a, "w": w, "c": acc_t}
    bias = None
    if epilogue.bias:
        bias = placeholder((nt, c.batch, c.block_out), acc, "bias", tile_dims=2)
        tensors["bias"] = bias
    out = compute((mt, nt, c.batch, c.block_out),
                  lambda m, n, b, o: epilogue.apply(acc_t[m, n, b, o], bias[n, b, o] if bias else None),
                  name="out", dtype=epilogue.out_dtype(acc), tile_dims=2)
    tensors["out"] = out
    return tensors


def plan_dense(config: AccelConfig, mt: int, kt: int, nt: int, *, threads: int,
               epilogue: Epilogue) -> dict[str, int]:
    """Tile sizes (in entries) ``tm, tn, tk`` and the thread order for the default schedule,
    minimizing the run time `TilingCost.cycles` estimates."""
    c = config
    best = None
    for tk in divisors(kt):
        if threads * tk > min(c.inp_depth, c.wgt_depth):
            break
        for tm in divisors(mt):
            if threads * tm * tk > c.inp_depth or tm > c.max_loop_iterations:
                break
            for tn in divisors(nt):
                if threads * tn * tk > c.wgt_depth or tn > c.max_loop_iterations or \
                        threads * (tm * tn + (tn if epilogue.bias else 0)) > c.acc_depth:
                    break
                work = TilingCost(
                    tiles=(mt // tm) * (nt // tn), chunks=kt // tk,
                    chunk_read_bytes=tm * tk * c.inp_entry_bytes + tn * tk * c.wgt_entry_bytes, chunk_loads=2,
                    chunk_uops=tm * tn * tk, tile_uops=tm * tn * epilogue_alu_ops(epilogue),
                    tile_read_bytes=tn * c.acc_entry_bytes if epilogue.bias else 0,
                    tile_store_bytes=tm * tn * store_entry_bytes(epilogue, c), tile_stores=1)
                cost, order = work.best_order(c, threads)
                if best is None or cost < best[0]:
                    best = (cost, tm, tn, tk, order)
    if best is None:
        # The smallest tile (one entry of each) and what it needs of each buffer.
        needs = {"input": (threads, c.inp_depth), "weight": (threads, c.wgt_depth),
                 "accumulator": (threads * (2 if epilogue.bias else 1), c.acc_depth)}
        short = [f"the {name} buffer holds {depth} entries and needs {need}"
                 for name, (need, depth) in needs.items() if need > depth]
        raise OpError(f"dense cannot be tiled for config {c.name!r}: even one entry per tile does not fit "
                      f"{threads} virtual thread(s) ({'; '.join(short) or 'its loop limits'})")
    return {"tm": best[1], "tn": best[2], "tk": best[3], "threads": threads, "order": best[4]}


def dense_schedule(config: AccelConfig, tensors: dict[str, Tensor], plan: dict[str, int]) -> Schedule:
    """The default accelerator schedule of `dense_te` for a tiling ``plan``."""
    a, w, c, out = tensors["a"], tensors["w"], tensors["c"], tensors["out"]
    s = create_schedule(out)
    s[c].set_scope("acc")
    out_acc = s.cache_write(out, "acc")
    a_inp = s.cache_read(a, "inp", [c])
    w_wgt = s.cache_read(w, "wgt", [c])
    readers = []
    if "bias" in tensors:
        readers.append(s.cache_read(tensors["bias"], "acc", [out_acc]))

    so = s[out]
    m, n, _, _ = so.leaf
    mo, no, mi, ni = so.tile(m, n, plan["tm"], plan["tn"])
    tile = so.fuse(mo, no)
    schedule_output_tile(s, out, tile, mi, plan["threads"], [c, out_acc], readers,
                         plan.get("order", "interleaved"))

    sc = s[c]
    cm, cn, cb, co, ko, ki = sc.leaf
    kzo, kzi = sc.split(ko, plan["tk"])
    sc.reorder(kzo, cm, cn, kzi, cb, co, ki)
    sc.tensorize(cb, gemm_intrin(config))
    for t in (a_inp, w_wgt):
        s[t].compute_at(sc, kzo)
        s[t].pragma(s[t].leaf[0], "dma_copy")
    return s


def compile_dense(config: AccelConfig, m: int, k: int, n: int, *, bias: bool = False, shift: int | None = None,
                  relu: bool = False, latency_hiding: bool = True) -> CompiledOp:
    """Compile ``(M×K) @ (K×N)`` (+ bias, >> shift, clip/ReLU) for ``config``.

    Inputs of the result: ``a`` (M, K) int8, ``b`` (K, N) int8, and with
    ``bias`` a (N,) int32 ``bias``. The output is (M, N) int8 with ``shift``,
    else int32."""
    for name, v in (("M", m), ("K", k), ("N", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise OpError(f"dense dimension {name} must be a positive integer, not {v!r}")
    epi = accel_epilogue(config, "dense", bias, shift, relu)
    c = config
    mt, kt, nt = ceil_div(m, c.batch), ceil_div(k, c.block_in), ceil_div(n, c.block_out)
    if max(kt, nt) > c.max_dma_size:
        # A row of A's tiles (kt) and of the output's (nt) is one DMA row: its stride field bounds them.
        raise OpError(f"dense with K = {k} and N = {n} needs rows of {kt} and {nt} tiles; config {c.name!r} "
                      f"moves rows of at most {c.max_dma_size} (K and N up to {c.max_dma_size * c.block_in} and "
                      f"{c.max_dma_size * c.block_out})")
    check_footprint(c, "dense", {"inp": mt * kt, "wgt": kt * nt, "out": mt * nt}, epi)
    plan = plan_with_fallback(lambda threads: plan_dense(c, mt, kt, nt, threads=threads, epilogue=epi),
                              latency_hiding)
    tensors = dense_te(c, mt, kt, nt, epi)
    sch = dense_schedule(c, tensors, plan)
    inputs = ["a", "w"] + (["bias"] if bias else [])
    program = build(sch, c, [tensors[x] for x in inputs] + [tensors["out"]])

    def pack(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if a.shape != (m, k) or b.shape != (k, n):
            raise OpError(f"dense was compiled for A{[m, k]} @ B{[k, n]}, not A{list(a.shape)} @ B{list(b.shape)}")
        return {"a": pack_matrix_a(c, a), "w": pack_matrix_b(c, b), **bias_input("dense", epi, c, bias, n)}

    return CompiledOp("dense", program, inputs, "out", pack, lambda t: unpack_matrix(t, m, n),
                      plan=dict(plan, mt=mt, kt=kt, nt=nt))
