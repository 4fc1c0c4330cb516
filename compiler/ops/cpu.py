"""Default CPU schedules: register-blocked, vectorized, parallel.

Matrix products (dense, and conv2d as im2col products) compute output tiles
of ``mb`` rows × ``nb`` columns in registers: the accumulator tile is a
``local`` array whose row loop is unrolled and whose column loop is unrolled
by vectors and vectorized, so after LLVM's scalar replacement each
accumulator is one vector register; the reduction loop runs outside them, so
each step loads ``nb / lanes`` vectors of the packed right operand and
broadcasts ``mb`` scalars of the left one (the BLIS micro-kernel shape).
Tiles run in parallel, column panels outermost so consecutive tiles of a
thread reuse the panel from cache. `plan_tile` picks ``mb`` × ``nb`` for the
vector width and the output's shape.

Element-wise operators, pooling and softmax parallelize their outer axes
and vectorize the innermost one.
"""

from __future__ import annotations

from ..schedule import Schedule
from ..te import Tensor

__all__ = ["vector_lanes", "plan_tile", "tile_shapes", "tile_cost", "TILE_ORDERS", "TILE_EFFICIENCY",
           "BLOCKED_TILE_EFFICIENCY", "ROWS_FIRST_WEIGHT_BYTES",
           "schedule_matmul", "schedule_panels", "schedule_im2col", "schedule_flat_image", "schedule_blocked_image",
           "schedule_blocked_window",
           "schedule_rows",
           "schedule_elementwise", "schedule_pool", "schedule_mean", "schedule_softmax", "MAX_ACCUMULATORS"]

#: The orders a product's output tiles may run in (`schedule_matmul`).
TILE_ORDERS = ("columns", "rows")

#: Accumulator vector registers a micro-kernel may use with 32 registers (AVX-512,
#: AArch64); the rest hold the right operand's vectors and the broadcast.
MAX_ACCUMULATORS = 24


def vector_lanes(vector_bits: int, dtype_bits: int = 32) -> int:
    """Lanes of one vector register for elements of ``dtype_bits``."""
    return max(1, vector_bits // dtype_bits)


#: Relative speed of the register-tile shapes (rows, vectors) for each register file size,
#: measured on a 1024³ float32 GEMM (and, with 32 registers, the ResNet-18 convolutions,
#: float32 and int8 alike). With 32 registers (AVX-512): 8 rows × 2 vectors was within 4%
#: of the best everywhere; wider or narrower tiles lose to load pressure or to too few rows
#: per loaded vector. With 16 (AVX2, znver3; 1024³ and 960³, runs ±15% apart): 6 × 2 (BLIS's
#: Haswell kernel: 12 accumulators, 2 loaded vectors and the broadcast, 15 registers) and
#: 4 × 3 ran at 140-175 GFLOP/s, 8 × 2 at 46: its 16 accumulators alone fill the register
#: file and spill every step. Other shapes get a generic estimate.
TILE_EFFICIENCY = {
    32: {(8, 2): 1.0, (16, 1): 0.93, (4, 4): 0.9, (8, 3): 0.9, (6, 4): 0.85, (12, 2): 0.8},
    16: {(6, 2): 1.0, (4, 3): 1.0, (3, 3): 0.95, (2, 4): 0.92, (5, 2): 0.87, (3, 2): 0.78, (2, 3): 0.77,
         (4, 2): 0.74, (6, 1): 0.72, (7, 1): 0.72, (9, 1): 0.55, (10, 1): 0.53, (2, 2): 0.52, (1, 4): 0.51,
         (8, 1): 0.41, (12, 1): 0.33, (1, 2): 0.3},
}


#: The same for the blocked convolution (`nn.conv2d_rows_te` reading and writing 16-channel blocks),
#: measured over 14 layers of ResNet-18 and MobileNetV2 (7×7 to 112×112 images, 16 to 960 output
#: channels; AVX-512, 2 cores): 7 × 2 was within 6% of the best on all but one, 8 × 2 lost 8–13%
#: on the 3×3 layers; other register files use `TILE_EFFICIENCY`'s.
BLOCKED_TILE_EFFICIENCY = {
    32: {(7, 2): 1.0, (4, 4): 0.94, (5, 4): 0.94, (8, 2): 0.93, (6, 4): 0.92, (12, 2): 0.9, (14, 1): 0.88,
         (16, 1): 0.85, (8, 3): 0.85, (6, 3): 0.85},
}


#: The largest weights (bytes) for which a blocked 1×1 convolution runs its tiles row block by row
#: block (`schedule_matmul`'s ``rows`` order): a block of pixels is read into L1 once for all the
#: column panels while the weights stay in L2. Measured on the 1×1 layers of MobileNetV2 and
#: ResNet-18 (znver3, AVX2, 2 cores): up to 216 KiB of weights rows first was faster on all 16
#: (1.00–1.29×), beyond it mixed (0.91–1.7×); 3×3 layers mixed at every size, so they keep columns.
ROWS_FIRST_WEIGHT_BYTES = 256 * 1024


def tile_shapes(rows: int, registers: int = 32) -> list[tuple[int, int]]:
    """Every register tile (rows ``mb``, vectors) a product of ``rows`` output rows may use on a
    CPU with ``registers`` vector registers: its accumulators, its loaded vectors and the broadcast
    fit the registers, with at most `MAX_ACCUMULATORS` accumulators."""
    shapes = []
    for vectors in (4, 3, 2, 1):
        for mb in range(1, min(16, rows) + 1):
            if mb * vectors > min(MAX_ACCUMULATORS, registers - vectors - 1):
                break
            shapes.append((mb, vectors))
    return shapes


def tile_cost(rows: int, cols: int, lanes: int, registers: int, mb: int, vectors: int,
              efficiencies: dict = TILE_EFFICIENCY) -> float:
    """An estimate of the micro-kernel's time for an ``mb`` × ``vectors`` tile (arbitrary units):
    the padded output's elements over the tile's `TILE_EFFICIENCY` (others by their
    accumulator count: about half the registers hide the FMA latency). A last, partial row tile
    runs the general code, about three times slower per row."""
    nb = vectors * lanes
    padded_cols = -(-cols // nb) * nb
    full, rest = divmod(rows, mb)
    accumulators = mb * vectors
    table = efficiencies.get(registers) or TILE_EFFICIENCY.get(registers, {})
    efficiency = table.get((mb, vectors), 0.75 * min(1.0, accumulators / (registers // 2)))
    return (full * mb + 3 * rest) * padded_cols / efficiency


def plan_tile(rows: int, cols: int, lanes: int, registers: int = 32, padding_cost: float = 0.0,
              column_multiple: int = 1, efficiencies: dict = TILE_EFFICIENCY) -> tuple[int, int]:
    """(mb, nb): register tile rows and columns (``nb`` a multiple of ``lanes``) for an
    output of ``rows`` × ``cols`` on a CPU with ``registers`` vector registers: of
    `tile_shapes`, the one `tile_cost` estimates fastest (then the one with more
    accumulators, then wider). Columns are padded to ``nb`` (the padding is computed and
    dropped; ``padding_cost``, a fraction of the tiles' cost, is what padding costs besides,
    a 1×1 convolution's copies of its input and output); rows are not. ``column_multiple``: ``nb``
    a multiple of it too (a blocked layout's whole channel blocks); ``efficiencies``: the kernel's
    table of tile speeds (`TILE_EFFICIENCY`, `BLOCKED_TILE_EFFICIENCY`).
    `gemforge.compiler.tuning` measures the others instead."""
    def cost(t):
        padded = cols % (t[1] * lanes) != 0
        return tile_cost(rows, cols, lanes, registers, *t, efficiencies) * (1 + (padding_cost if padded else 0))
    shapes = [t for t in tile_shapes(rows, registers) if t[1] * lanes % column_multiple == 0]
    best = min(shapes, key=lambda t: (cost(t), -t[0] * t[1], -t[1]))
    return best[0], best[1] * lanes


def schedule_matmul(s: Schedule, out: Tensor, acc: Tensor, *, mb: int, nb: int, lanes: int,
                    inline: list[Tensor] = (), taps: tuple[int, int] | None = None,
                    order: str = "columns", transposed: bool = False, block: int | None = None,
                    block_in: int | None = None) -> None:
    """Register-blocked matrix product: ``out``'s last two axes are rows × columns (any
    axes before them are batch axes), ``acc`` the reduction ``out`` reads element-wise.
    With ``taps`` = (KH, KW) the reduction (a convolution's channels × kernel taps)
    is split into its three loops, so the operands' indices are affine in each.
    ``order`` = ``columns`` runs the tiles column panel by column panel (a thread's
    consecutive tiles reuse the right operand's panel), ``rows`` row block by row block
    (they reuse the left operand's rows). ``transposed``: ``out``'s last two axes are
    columns × rows, the transpose of ``acc``'s (`nn.conv2d_rows_te`), so its vector stores
    scatter; ``block``: ``out`` is (…, column blocks, rows, ``block``), the blocked image layout
    (`nn.CHANNEL_BLOCK`), whose tile rows store whole vectors. ``block_in``: the reduction's
    innermost ``block_in`` steps are the channels of a blocked input (inside the taps)."""
    if order not in TILE_ORDERS:
        raise ValueError(f"a product's tile order is {' or '.join(TILE_ORDERS)}, not {order!r}")
    for t in inline:
        s[t].compute_inline()
    so = s[out]
    if block is not None:
        *batch, blocks, rows, lane = so.leaf
        co, cb = so.split(blocks, nb // block)
        ro, ri = so.split(rows, mb)
        inner = [ri, cb, lane]
        ci = lane
    else:
        *batch, rows, cols = so.leaf
        if transposed:
            rows, cols = cols, rows
        ro, co, ri, ci = so.tile(rows, cols, mb, nb)
        inner = [ri, ci]
    outer = [*batch, co, ro] if order == "columns" else [*batch, ro, co]
    so.reorder(*outer, *inner)
    tile = outer[0]
    for axis in outer[1:]:
        tile = so.fuse(tile, axis)
    so.parallel(tile)
    if block is not None:
        so.unroll(ri)
        so.unroll(cb)
    so.vectorize(ci)
    sa = s[acc]
    sa.set_scope("local")
    sa.compute_at(so, tile)
    *abatch, arow, acol, red = sa.leaf
    cvo, cvi = sa.split(acol, lanes)
    reduction = [red]
    if block_in is not None:
        red, channel = sa.split(red, block_in)
        reduction = [red, channel]
    if taps is not None:
        rest, rkw = sa.split(red, taps[1])
        rc, rkh = sa.split(rest, taps[0])
        reduction = [rc, rkh, rkw, *reduction[1:]]
    sa.reorder(*abatch, *reduction, arow, cvo, cvi)
    sa.unroll(arow)
    sa.unroll(cvo)
    sa.vectorize(cvi)


def schedule_panels(s: Schedule, packed: Tensor) -> None:
    """A weight-packing stage ``(panels, K, panel)``: panels in parallel, each row vectorized."""
    sp = s[packed]
    o, r, i = sp.leaf
    sp.parallel(o)
    sp.vectorize(i)


def schedule_im2col(s: Schedule, col: Tensor, kernel: tuple[int, int], out_width: int) -> None:
    """The im2col packing stage: loops over (batch, group, channel, kernel row, kernel
    column) in parallel, then output rows and columns, columns vectorized."""
    sc = s[col]
    b, g, r, q = sc.leaf
    kh, kw = kernel
    r1, rkw = sc.split(r, kw)
    rc, rkh = sc.split(r1, kh)
    y, x = sc.split(q, out_width)
    outer = sc.fuse(sc.fuse(sc.fuse(sc.fuse(b, g), rc), rkh), rkw)
    sc.parallel(outer)
    sc.vectorize(x)


def schedule_flat_image(s: Schedule, flat: Tensor, pitch: int) -> None:
    """The row-by-row copy of a padded image (`nn.conv2d_te`'s ``shifted`` method):
    images and channels in parallel, each row vectorized."""
    sf = s[flat]
    *outer, f = sf.leaf
    row, col = sf.split(f, pitch)
    fused = outer[0]
    for axis in outer[1:]:
        fused = sf.fuse(fused, axis)
    sf.parallel(fused)
    sf.vectorize(col)


def schedule_blocked_image(s: Schedule, image: Tensor) -> None:
    """A copy of an image in the blocked layout (N, C/16, H, W, 16), padded: rows of each
    channel block in parallel, each pixel's 16 channels one vector."""
    si = s[image]
    b, k, y, x, lane = si.leaf
    si.parallel(si.fuse(si.fuse(b, k), y))
    si.vectorize(lane)


def schedule_rows(s: Schedule, t: Tensor) -> None:
    """A 2-D packing stage: rows in parallel, each row vectorized."""
    st = s[t]
    row, col = st.leaf
    st.parallel(row)
    st.vectorize(col)


def schedule_elementwise(s: Schedule, out: Tensor) -> None:
    """Outer axes fused and parallel, the innermost vectorized (a 1-D tensor is cut
    into parallel chunks)."""
    so = s[out]
    axes = list(so.leaf)
    if len(axes) == 1:
        outer, inner = so.split(axes[0], 4096)
        so.parallel(outer)
        so.vectorize(inner)
        return
    outer = axes[0]
    for axis in axes[1:-1]:
        outer = so.fuse(outer, axis)
    so.parallel(outer)
    so.vectorize(axes[-1])


def schedule_pool(s: Schedule, tensors: dict[str, Tensor], kind: str) -> None:
    """Pooling: (batch, channel) fused and parallel, one output row at a time with its
    window loops outside the vectorized output columns. A padded max pool in NCHW frames its
    channel first (``xp``, made in the channel loop), so that every tap reads in bounds: inlined,
    each tap tested the image's edges (64 channels of 56×56, stride 1: int8 3×3 1.22 → 0.16 ms,
    5×5 3.4 → 0.20 ms; float32 5×5 1.26 → 0.37 ms on znver3)."""
    out = tensors["out"]
    framed = tensors.get("xp") is not None and tensors["xp"] is not tensors["x"]
    if framed and not (kind == "max" and len(out.shape) == 4):
        s[tensors["xp"]].compute_inline()
        framed = False
    so = s[out]
    if len(out.shape) == 5:          # the blocked layout: a pixel's 16 channels one vector
        if kind == "max":
            b, k, y, x, lane, rh, rw = so.leaf
            so.reorder(b, k, y, x, rh, rw, lane)
        else:
            b, k, y, x, lane = so.leaf
            total = s[tensors["sum"]]
            total.set_scope("local")
            total.compute_at(so, x)
            tb, tk, ty, tx, tl, rh, rw = total.leaf
            total.reorder(tb, tk, ty, tx, rh, rw, tl)
            total.vectorize(tl)
        so.parallel(so.fuse(so.fuse(b, k), y))
        so.vectorize(lane)
        return
    if kind == "max":
        n, c, y, x, rh, rw = so.leaf
        nc = so.fuse(n, c)
        so.reorder(nc, y, rh, rw, x)
        so.parallel(nc)
        so.vectorize(x)
        if framed:                   # the padded image, channel by channel
            padded = s[tensors["xp"]]
            padded.compute_at(so, nc)
            padded.vectorize(padded.leaf[-1])
        if "xs" in tensors:          # strided: the input split by column phase, channel by channel
            split = s[tensors["xs"]]
            split.compute_at(so, nc)
            split.vectorize(split.leaf[-1])
        return
    _row_sums(s, out, tensors["sum"])


def schedule_depthwise(s: Schedule, tensors: dict[str, Tensor]) -> None:
    """A depthwise convolution (`nn.depthwise_conv2d_te`): window sums row by row (`_row_sums`),
    the padded input computed inline, or with a stride, split by column phase channel by
    channel (``xs``, made in the parallel channel loop, vectorized along its rows)."""
    if "xs" in tensors:
        split = s[tensors["xs"]]
        _row_sums(s, tensors["out"], tensors["sum"])
        so = s[tensors["out"]]
        if "xp" in tensors:                     # an int8 input's padded float copy, then its split
            padded = s[tensors["xp"]]
            padded.compute_at(so, so.leaf[0])
            padded.vectorize(padded.leaf[-1])
        split.compute_at(so, so.leaf[0])
        split.vectorize(split.leaf[-1])
        return
    _row_sums(s, tensors["out"], tensors["sum"])
    if tensors["xp"] is not tensors["x"]:
        padded = s[tensors["xp"]]
        so = s[tensors["out"]]
        padded.compute_at(so, so.leaf[0])
        padded.vectorize(padded.leaf[-1])


#: Output pixels a blocked window operator (depthwise convolution) keeps in registers: a vector
#: of 16 channels each, a tap's weights loaded once for all of them.
BLOCKED_WINDOW_PIXELS = 8
#: The most pixels of a padded channel block a blocked window operator copies before its sums (the
#: copy then fits the L1 cache with room to spare); a larger or strided one reads its input in place,
#: each tap's load checked against the image's edges. MobileNetV2's depthwise layers, stride 1:
#: 28×28 and 14×14 5–20% faster copied, 56×56 and 112×112 30–35% faster in place; stride 2: 1.4–2.8×
#: faster in place (the copy reads 4 input pixels an output pixel).
BLOCKED_COPY_PIXELS = 1024


def schedule_blocked_window(s: Schedule, tensors: dict[str, Tensor], stride: int) -> None:
    """A window operator in the blocked layout (`nn.depthwise_blocked_te`): channel blocks in
    parallel, a small block's padded copy made there (`BLOCKED_COPY_PIXELS`), a large one read in
    place; per output row, tiles of `BLOCKED_WINDOW_PIXELS` pixels whose sums stay in registers
    while the taps run, each pixel's 16 channels one vector."""
    so = s[tensors["out"]]
    b, k, y, x, lane = so.leaf
    xo, xi = so.split(x, BLOCKED_WINDOW_PIXELS)
    block = so.fuse(b, k)
    so.reorder(block, y, xo, xi, lane)
    so.parallel(block)
    so.unroll(xi)
    so.vectorize(lane)
    total = s[tensors["sum"]]
    total.set_scope("local")
    total.compute_at(so, xo)
    tb, tk, ty, tx, tl, rh, rw = total.leaf
    total.reorder(tb, tk, ty, rh, rw, tx, tl)
    total.unroll(tx)
    total.vectorize(tl)
    if "padded" in tensors:
        padded = s[tensors["padded"]]
        _, _, height, width, _ = tensors["padded"].shape
        if stride > 1 or height * width > BLOCKED_COPY_PIXELS:
            padded.compute_inline()
        else:
            padded.compute_at(so, block)
            padded.vectorize(padded.leaf[-1])


def _row_sums(s: Schedule, out: Tensor, sums: Tensor) -> None:
    """An (N, C, OH, OW) output of window sums (average pooling, a depthwise convolution):
    (batch, channel) fused and parallel, one output row at a time, the row's sums kept in a
    local row and accumulated tap by tap with the columns vectorized."""
    so = s[out]
    n, c, y, x = so.leaf
    nc = so.fuse(n, c)
    so.parallel(nc)
    so.vectorize(x)
    total = s[sums]
    total.set_scope("local")
    total.compute_at(so, y)
    tn, tc, ty, tx, rh, rw = total.leaf
    total.reorder(tn, tc, ty, rh, rw, tx)
    total.vectorize(tx)


#: Softmax keeps a row of exponentials in a local array up to this length (on the
#: stack); longer rows use a main-memory workspace.
SOFTMAX_LOCAL_ROW = 16384


def schedule_mean(s: Schedule, tensors: dict[str, Tensor]) -> None:
    """Rows in parallel, each row's sum in a register."""
    out = s[tensors["out"]]
    out.parallel(out.leaf[0])
    total = s[tensors["sum"]]
    total.set_scope("local")
    total.compute_at(out, out.leaf[0])


def schedule_softmax(s: Schedule, tensors: dict[str, Tensor]) -> None:
    """Rows in parallel; per row the maximum, the exponentials, their sum and the
    quotients, the element loops vectorized."""
    out = s[tensors["out"]]
    row, col = out.leaf
    out.parallel(row)
    out.vectorize(col)
    for name in ("max", "exp", "sum"):
        stage = s[tensors[name]]
        if name != "exp" or tensors["exp"].shape[1] <= SOFTMAX_LOCAL_ROW:
            stage.set_scope("local")
        stage.compute_at(out, row)
    exp = s[tensors["exp"]]
    exp.vectorize(exp.leaf[-1])

