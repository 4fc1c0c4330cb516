"""What the accelerator's default schedules share: the pipeline cost model that picks
their tilings, the thread-count fallback, the output-tile schedule, bias packing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from gemforge.hw.timing import COMPUTE_FIXED, LOAD_FIXED
from gemforge.sim.cycle_model import run_cycle_model

from ...backends.accel.layout import pack_bias
from ...schedule import VTHREAD_ORDERS
from ...errors import CompileError
from ..common import Epilogue, OpError, int8_clamp_steps

__all__ = ["check_footprint", "TilingCost", "CANDIDATE_PLANS", "CANDIDATE_SLACK", "best_by_cycle_model", "divisors",
           "plan_with_fallback", "schedule_output_tile", "schedule_image_tiles", "bias_input",
           "DMA_OVERHEAD", "COMPUTE_OVERHEAD", "epilogue_alu_ops", "store_entry_bytes", "accel_epilogue"]


def accel_epilogue(config, op: str, bias: bool, shift: int | None, relu: bool, hi: int | None = None) -> Epilogue:
    """The epilogue of an accelerator operator: a shift requantizes to int8 outputs, which the
    store engine writes only where the config's out_width is 8 (clamped to ``hi`` if given)."""
    epilogue = Epilogue(bias, shift, relu, None, hi)
    if shift is not None and config.out_width != 8:
        raise OpError(f"{op} with a shift writes int8 outputs, but config {config.name!r} has {config.out_width}-bit "
                      f"outputs; use a config with out_width = 8, or leave out the shift for the "
                      f"int{config.acc_width} results")
    return epilogue


def epilogue_alu_ops(epilogue: Epilogue) -> int:
    """Micro-ops per output entry that a tile spends outside its reduction: the bias
    addition and ReLU of int32 outputs. The accumulator reset and a requantized (int8)
    output's whole epilogue cost none: the first reduction step overwrites and the STORE
    adds the bias, shifts and clamps (`gemforge.compiler.backends.accel.fusion`) — except below
    an upper bound (``hi``), which the ALU applies before the shift, with the bias and the part
    of the shift its immediate needs (`int8_clamp_steps`)."""
    if epilogue.shift is not None:
        first, cap, _ = int8_clamp_steps(epilogue.shift, 127 if epilogue.hi is None else epilogue.hi)
        return 0 if cap is None else int(epilogue.bias) + int(first > 0) + 1
    return int(epilogue.bias) + int(epilogue.relu)


def store_entry_bytes(epilogue: Epilogue, config) -> int:
    """Bytes per stored entry: the output buffer's (int8) after a shift, else the accumulator's."""
    return config.out_entry_bytes if epilogue.shift is not None else config.acc_entry_bytes


def check_footprint(config, op: str, entries: dict[str, int], epilogue: Epilogue) -> None:
    """Refuse an operator whose packed tensors (``entries`` of each buffer's entry size) would
    not fit the accelerator's 32-bit DRAM address space, before its tiling is planned (each
    instruction is built, so a huge operator would otherwise compile for hours)."""
    from gemforge.hw.program import MAX_ARENA_BYTES
    need = sum(count * (store_entry_bytes(epilogue, config) if buffer == "out" else config.entry_bytes(buffer))
               for buffer, count in entries.items())
    if need > MAX_ARENA_BYTES:
        raise OpError(f"{op}'s packed tensors need {need:,} bytes of DRAM, beyond the {MAX_ARENA_BYTES:,} the "
                      "accelerator can address; split the operator")


def bias_input(op: str, epilogue: Epilogue, config, bias: np.ndarray | None, channels: int) -> dict:
    """The packed ``bias`` input of an operator compiled with ``epilogue`` (empty without
    bias), refusing a missing, unexpected or wrongly shaped bias."""
    if not epilogue.bias:
        if bias is not None:
            raise OpError(f"{op} was compiled without bias")
        return {}
    if bias is None or bias.shape != (channels,):
        raise OpError(f"{op} with bias needs a bias of shape ({channels},)")
    return {"bias": pack_bias(config, bias)}


#: The planner's per-instruction costs beyond the data (`gemforge.hw.timing`, the one
#: definition the cycle model shares): a LOAD or STORE that cannot overlap the previous one
#: (back-to-back DMAs of one client chain at 2–3 cycles, but only while no other client wants
#: the bus, which is the common case in a tiled operator), a GEMM/ALU's dispatch and drain.
DMA_OVERHEAD = LOAD_FIXED
COMPUTE_OVERHEAD = COMPUTE_FIXED


@dataclass(frozen=True)
class TilingCost:
    """The work of one tiling, per reduction chunk and per output tile, in bytes,
    micro-ops and instructions; `cycles` estimates its run time on the accelerator."""

    tiles: int
    chunks: int              # reduction chunks per tile
    chunk_read_bytes: int    # input + weight bytes loaded per chunk
    chunk_loads: int         # LOAD instructions per chunk
    chunk_uops: int          # GEMM micro-ops per chunk
    tile_uops: int           # micro-ops per tile outside the chunks (the epilogue's)
    tile_read_bytes: int     # bytes loaded once per tile (bias)
    tile_store_bytes: int
    tile_stores: int         # STORE instructions per tile

    def cycles(self, config, threads: int, order: str = "interleaved") -> float:
        """Estimated cycles with ``threads`` virtual threads issued in ``order``
        (`Stage.vthread`): a closed-form simplification of the cycle model
        (`gemforge.sim.cycle_model`) from the same timing (`gemforge.hw.timing`), cheap
        enough to rank every candidate tiling.

        Loads use the read channel, stores the write channel, micro-ops the
        compute pipeline; each engine is in order. With one thread everything
        adds up. Interleaved pairs of tiles: a chunk costs the longer of its GEMM
        and its loads (the other thread's loads run under it); a thread's store
        runs while the other thread finishes, and a store longer than a chunk
        delays the next reset, or — when stores dominate — the store engine idles
        while the next pair computes up to its first finished tile. Sequential:
        a thread's chunks load and compute in turn (its first load ran under the
        other thread's tile), and its store runs under the next thread's tile.
        Both pay the first loads (fill) and the last store (drain)."""
        bus = config.bus_bytes
        read = self.chunk_read_bytes / bus + self.chunk_loads * DMA_OVERHEAD
        gemm = self.chunk_uops + COMPUTE_OVERHEAD
        store = self.tile_store_bytes / bus + self.tile_stores * DMA_OVERHEAD
        fixed = self.tile_uops + 2 * COMPUTE_OVERHEAD + self.tile_read_bytes / bus + \
            (DMA_OVERHEAD if self.tile_read_bytes else 0)
        if threads == 1:
            return self.tiles * (self.chunks * (read + gemm) + fixed + store)
        if order == "sequential":
            per_tile = max(self.chunks * gemm + (self.chunks - 1) * read + fixed, store, self.chunks * read)
        else:
            chunk = max(gemm, read)
            compute = self.chunks * chunk + fixed
            per_pair = max(2 * compute + max(0.0, store - chunk),
                           2 * store + max(0.0, 2 * (compute - fixed - chunk)))
            per_tile = per_pair / 2
        return read + self.tiles * per_tile + store

    def best_order(self, config, threads: int) -> tuple[float, str]:
        """(cycles, order) of the faster thread order."""
        return min((self.cycles(config, threads, order), order) for order in VTHREAD_ORDERS)


#: Tilings `TilingCost` ranks best whose programs are built and timed with the cycle model
#: (`best_by_cycle_model`): the closed form treats a chunk's loads as fully hidden when they
#: are shorter than its GEMM, so near-ties between tilings are decided by the model.
CANDIDATE_PLANS = 8
#: ... among those the closed form estimates within this fraction of the best.
CANDIDATE_SLACK = 0.03


def best_by_cycle_model(plans: list, build_plan: Callable[[Any], Any]) -> tuple[Any, Any]:
    """(plan, program) of the plan whose program the cycle model
    (`gemforge.sim.cycle_model`) runs fastest; the first plan's wins ties."""
    best = None
    for k, plan in enumerate(plans):
        try:
            program = build_plan(plan)
        except CompileError:
            if k == 0:
                raise               # the planner's choice must build; a runner-up may not
            continue
        cycles = run_cycle_model(program.instructions, program.config).cycles if len(plans) > 1 else 0
        if best is None or cycles < best[0]:
            best = (cycles, plan, program)
    return best[1], best[2]


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order (tile sizes without partial tiles)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def plan_with_fallback(plan: Callable[[int], Any], latency_hiding: bool) -> Any:
    """``plan(threads)`` with two virtual threads when latency hiding is asked for;
    if double buffering does not fit the buffers, one thread (the operator still
    runs, without overlap) — an explicit choice recorded in the plan."""
    if latency_hiding:
        try:
            return plan(2)
        except OpError:
            pass
    return plan(1)


def schedule_image_tiles(s, out, plan: dict, acc_stages: list, readers: list) -> None:
    """An NCHW-blocked output ``(N/B, C/BO, H, W, B, BO)`` cut into tiles of ``plan``'s ``toc``
    channel blocks × ``toh`` rows × ``tow`` columns, the tile loops fused, then
    `schedule_output_tile` with ``plan``'s threads and order."""
    so = s[out]
    n, oc, y, xx, _, _ = so.leaf
    oco, oci = so.split(oc, plan["toc"])
    yo, yi = so.split(y, plan["toh"])
    xo, xi = so.split(xx, plan["tow"])
    so.reorder(n, oco, yo, xo, oci, yi, xi)
    tile = so.fuse(so.fuse(so.fuse(n, oco), yo), xo)
    schedule_output_tile(s, out, tile, oci, plan["threads"], acc_stages, readers, plan.get("order", "interleaved"))


def schedule_output_tile(s, out, tile, inner, threads: int, acc_stages: list, readers: list,
                         order: str = "interleaved") -> None:
    """The part of every default accelerator schedule around one output tile.

    ``tile`` is the fused loop over output tiles of ``out``'s stage and ``inner``
    the first loop inside a tile. With ``threads`` > 1 the tile loop is split
    into virtual threads (latency hiding). The accumulator stages (GEMM result,
    epilogue) and the ``readers`` (accumulator-scope inputs such as the bias) are
    computed per tile; the readers and the output copy become DMAs and the
    epilogue becomes ALU micro-ops."""
    so = s[out]
    if threads > 1:
        _, tile = so.split(tile, factor=threads)
        so.vthread(tile, order)
    so.pragma(inner, "dma_copy")
    for t in [*readers, *acc_stages]:
        s[t].compute_at(so, tile)
    for t in readers:
        s[t].pragma(s[t].leaf[0], "dma_copy")
    s[acc_stages[-1]].pragma(s[acc_stages[-1]].leaf[0], "alu")
