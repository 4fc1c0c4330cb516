"""Default GPU schedules: shared-memory tiled matrix products, one thread per element otherwise.

Dense and (ungrouped) conv2d are matrix products tiled for a thread block:
the block computes a ``BM × BN`` output tile with ``TY × TX`` threads, each
thread ``TM × TN`` outputs in registers (a ``local`` tile, unrolled); the
reduction runs in chunks of ``BK``, each chunk's operand tiles staged in
``shared`` memory by all threads of the block together (the copy loops fused
and bound to the thread indices, consecutive threads reading consecutive
addresses), with barriers between the copies and their use. Operands are
zero-padded to whole tiles as they are read (conv2d builds its im2col
operand on the fly: implicit GEMM), outputs are padded and the host drops the
padding. Grouped and depthwise convolutions, pooling and element-wise
operators give each thread one output element.
"""

from __future__ import annotations

from ..ir import BufferLoad
from ..schedule import Schedule, create_schedule
from ..te import Tensor, compute, pad, placeholder, reduce_axis, sum_
from .common import Epilogue, out_size
from .nn import ConvLayout, accumulator_dtype, round_up, window_pixel

__all__ = ["dense", "conv2d", "schedule_elementwise", "schedule_pool", "TILE", "LARGE_TILE", "plan_tile"]

#: (BM, BN, BK, TM, TN): block tile, reduction chunk, per-thread tile (16 × 16 threads).
TILE = (64, 64, 16, 4, 4)
#: The tile of large products: 8 × 8 outputs per thread, twice the arithmetic per shared-memory load.
LARGE_TILE = (128, 128, 8, 8, 8)


def plan_tile(rows: int, cols: int) -> tuple[int, int, int, int, int]:
    """`LARGE_TILE` when the output has enough tiles to fill the GPU with it (and the
    padding stays small), else `TILE`."""
    bm, bn = LARGE_TILE[:2]
    tiles = -(-rows // bm) * -(-cols // bn)
    waste = (round_up(rows, bm) * round_up(cols, bn)) / (rows * cols)
    return LARGE_TILE if tiles >= 128 and waste <= 1.1 else TILE
#: Threads per block of the one-element-per-thread schedules.
THREADS = 256


def _schedule_tiled(s: Schedule, out: Tensor, acc: Tensor, operands: list[Tensor], inline: list[Tensor],
                    tile: tuple[int, int, int, int, int]) -> None:
    """The shared-memory tiled product (see the module docstring); ``out``'s last two axes
    are rows and columns, a leading batch axis goes to ``blockIdx.z``."""
    bm, bn, bk, tm, tn = tile
    ty_n, tx_n = bm // tm, bn // tn
    so = s[out]
    *batch, rows, cols = so.leaf
    bi, bj, ii, jj = so.tile(rows, cols, bm, bn)
    # A thread's outputs lie a thread-row apart (row ti·TY + ty, column tj·TX + tx): its
    # neighbours read neighbouring shared-memory words (no bank conflicts) and store
    # neighbouring addresses (coalesced).
    ti, ty = so.split(ii, ty_n)
    tj, tx = so.split(jj, tx_n)
    so.reorder(*batch, bi, bj, ty, tx, ti, tj)
    if batch:
        so.bind(batch[0], "blockIdx.z")
    so.bind(bi, "blockIdx.y")
    so.bind(bj, "blockIdx.x")
    so.bind(ty, "threadIdx.y")
    so.bind(tx, "threadIdx.x")
    sa = s[acc]
    sa.set_scope("local")
    sa.compute_at(so, tx)
    *_, ci, cj, red = sa.leaf
    ko, ki = sa.split(red, bk)
    sa.reorder(ko, ki, ci, cj)
    sa.unroll(ci)
    sa.unroll(cj)
    staged = [s.cache_read(t, "shared", [acc]) for t in operands]
    for t in inline:
        s[t].compute_inline()
    for t in staged:
        st = s[t]
        st.compute_at(sa, ko)
        *outer, r, c = st.leaf
        flat = st.fuse(r, c)
        rest, x = st.split(flat, tx_n)
        _, y = st.split(rest, ty_n)
        st.bind(y, "threadIdx.y")
        st.bind(x, "threadIdx.x")


def dense(m: int, k: int, n: int, dtype: str, epilogue: Epilogue, tile=None):
    """(tensors, schedule, plan) of ``out = epilogue(a @ w)`` on the GPU; ``out`` and
    ``bias`` are padded to whole column tiles, ``out`` also to whole row tiles.
    ``tile`` overrides `plan_tile`."""
    tile = tile or plan_tile(m, n)
    bm, bn, bk, _, _ = tile
    acc = accumulator_dtype(dtype)
    mp, np_, kp = round_up(m, bm), round_up(n, bn), round_up(k, bk)
    a = placeholder((m, k), dtype, "a")
    w = placeholder((k, n), dtype, "w")
    ap = pad(a, (0, 0), (mp - m, kp - k), "a.pad")
    wp = pad(w, (0, 0), (kp - k, np_ - n), "w.pad")
    r = reduce_axis(kp, "k")
    c = compute((mp, np_), lambda i, j: sum_(ap[i, r].astype(acc) * wp[r, j].astype(acc), [r]), name="c")
    tensors = {"a": a, "w": w, "c": c}
    bias = None
    if epilogue.bias:
        bias = tensors["bias"] = placeholder((np_,), acc, "bias")
    out = tensors["out"] = compute((mp, np_), lambda i, j: epilogue.apply(c[i, j], bias[j] if bias else None),
                                   name="out", dtype=epilogue.out_dtype(acc))
    s = create_schedule(out)
    _schedule_tiled(s, out, c, [ap, wp], [ap, wp], tile)
    return tensors, s, {"tile": list(tile), "padded": [mp, kp, np_]}


def _residual(tensors: dict, epilogue: Epilogue, shape: tuple[int, ...], dtype: str):
    """The fused residual add's operand (N, O, pixels), where the epilogue has one."""
    if not epilogue.residual:
        return None
    tensors["residual"] = placeholder(shape, dtype, "residual")
    return tensors["residual"]


def conv2d(shape, weight, stride: int, padding: int, groups: int, dtype: str, epilogue: Epilogue):
    """(tensors, schedule, plan) of conv2d on the GPU: implicit GEMM (one group) or one
    thread per output element (grouped, depthwise). ``out`` is (N, O, pixels padded)."""
    n, c, h, wd = shape
    o, cg, kh, kw = weight
    acc = accumulator_dtype(dtype)
    oh, ow = out_size(h, kh, stride, padding), out_size(wd, kw, stride, padding)
    pixels = oh * ow
    taps = kh * kw
    x = placeholder((n, c, h, wd), dtype, "x")
    w = placeholder((o, cg * taps), dtype, "w")
    tensors = {"x": x, "w": w}
    bias = None
    xp = pad(x, (0, 0, padding, padding), (0, 0, padding, padding), "xp") if padding else x

    def image(b, ch, y, xx):
        # Reads past the channels (padded reduction) are zeros too.
        if xp is x:
            return BufferLoad(x.buffer, (b, ch, y, xx), zero_outside=True)
        return xp[b, ch, y, xx]
    if groups == 1:
        tile = plan_tile(o, n * pixels)
        bm, bn, bk, _, _ = tile
        red = cg * taps
        op, pp, rp = round_up(o, bm), round_up(pixels, bn), round_up(red, bk)
        wpad = pad(w, (0, 0), (op - o, rp - red), "w.pad")
        col = compute((n, rp, pp), lambda b, r, q: image(b, r // taps, *window_pixel(q, r, ow, kh, kw, stride)),
                      name="col")
        rr = reduce_axis(rp, "r")
        cc = compute((n, op, pp), lambda b, oc, q: sum_(wpad[oc, rr].astype(acc) * col[b, rr, q].astype(acc), [rr]),
                     name="c")
        if epilogue.bias:
            bias = tensors["bias"] = placeholder((op,), acc, "bias")
        residual = _residual(tensors, epilogue, (n, o, pixels), acc)
        out = compute((n, op, pp), lambda b, oc, q: epilogue.apply(
            cc[b, oc, q], bias[oc] if bias else None,
            BufferLoad(residual.buffer, (b, oc, q), zero_outside=True) if residual else None),
            name="out", dtype=epilogue.out_dtype(acc))
        s = create_schedule(out)
        inline = [wpad, col] + ([xp] if xp is not x else [])
        _schedule_tiled(s, out, cc, [wpad, col], inline, tile)
        plan = {"tile": list(tile), "method": "implicit_gemm"}
    else:
        og = o // groups
        rc, rh, rw = reduce_axis(cg, "rc"), reduce_axis(kh, "rh"), reduce_axis(kw, "rw")
        cc = compute((n, o, pixels), lambda b, oc, q: sum_(
            w[oc, (rc * kh + rh) * kw + rw].astype(acc)
            * image(b, (oc // og) * cg + rc, (q // ow) * stride + rh, (q % ow) * stride + rw).astype(acc),
            [rc, rh, rw]), name="c")
        if epilogue.bias:
            bias = tensors["bias"] = placeholder((o,), acc, "bias")
        residual = _residual(tensors, epilogue, (n, o, pixels), acc)
        out = compute((n, o, pixels), lambda b, oc, q: epilogue.apply(
            cc[b, oc, q], bias[oc] if bias else None, residual[b, oc, q] if residual else None),
            name="out", dtype=epilogue.out_dtype(acc))
        s = create_schedule(out)
        if xp is not x:
            s[xp].compute_inline()
        thread = _one_per_thread(s, out)
        s[cc].set_scope("local")
        s[cc].compute_at(s[out], thread)
        plan = {"method": "direct", "threads": THREADS}
    tensors.update(c=cc, out=out, layout=ConvLayout(plan["method"], ow))
    return tensors, s, plan


def _one_per_thread(s: Schedule, out: Tensor):
    """All of ``out``'s axes fused, blocks of `THREADS` threads; returns the thread loop."""
    so = s[out]
    axes = list(so.leaf)
    fused = axes[0]
    for axis in axes[1:]:
        fused = so.fuse(fused, axis)
    block, thread = so.split(fused, THREADS)
    so.bind(block, "blockIdx.x")
    so.bind(thread, "threadIdx.x")
    return thread


def schedule_elementwise(s: Schedule, out: Tensor) -> None:
    """One thread per element."""
    _one_per_thread(s, out)


def schedule_pool(s: Schedule, tensors: dict, kind: str) -> None:
    """One thread per output element, its window reduced in a register (the framed input, split
    by column phase or not, read inline)."""
    if tensors.get("xp") is not None and tensors["xp"] is not tensors["x"]:
        s[tensors["xp"]].compute_inline()
    if "xs" in tensors:
        s[tensors["xs"]].compute_inline()
    out = tensors["out"]
    if kind == "max":
        so = s[out]
        n, c, y, x, rh, rw = so.leaf
        fused = so.fuse(so.fuse(so.fuse(n, c), y), x)
        block, thread = so.split(fused, THREADS)
        so.bind(block, "blockIdx.x")
        so.bind(thread, "threadIdx.x")
        return
    thread = _one_per_thread(s, out)
    total = s[tensors["sum"]]
    total.set_scope("local")
    total.compute_at(s[out], thread)
