"""The loop-IR passes and the accelerator back end, pass by pass."""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.compiler.backends import stages
from gemforge.compiler.backends.accel import AccelCompileError, Emitted, deduplicate_uops, insert_dependency_tokens
from gemforge.compiler.backends.accel.intrin import gemm_intrin
from gemforge.compiler.backends.accel.nodes import DmaCopy, GemmIntrin, HwLoopTask
from gemforge.compiler.ir import Allocate, AttrStmt, format_ir, walk
from gemforge.compiler.lower import schedule_to_ir as _schedule_to_ir
from gemforge.compiler.ops.common import Epilogue
from gemforge.compiler.ops.accel.dense import dense_schedule, dense_te
from gemforge.compiler.ops import compile_conv2d, compile_dense
from gemforge.compiler.backends.accel.passes import (
    AluInjectionError, CapacityError, TensorizeError, flatten_storage, fold_uop_loops, inject_alu, inject_dma,
    tensorize,
)
from gemforge.compiler.pipeline import build, lower, run_stages
from gemforge.compiler.target import AccelTarget
from gemforge.compiler.schedule import create_schedule
from gemforge.compiler.te import compute, placeholder, reduce_axis, sum_
from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Gemm, Load, MemType, Store, Uop

TINY = PRESETS["tiny"]
ACCEL = AccelTarget(TINY)


def schedule_to_ir(s):
    return _schedule_to_ir(s, target=ACCEL)


def _dense_ir(plan, epi=Epilogue(True, 4, True), shape=(8, 4, 8)):
    t = dense_te(TINY, *shape, epi)
    return t, dense_schedule(TINY, t, plan)


def _after_passes(t, s, uop_budget=None):
    """The dense function's body after the accelerator's IR passes (before emission)."""
    target = AccelTarget(TINY, uop_budget)
    args = [t[k] for k in ("a", "w", "bias", "out") if k in t]
    return run_stages(lower(s, target, args), target, until="allocate_storage").body


def _nodes(stmt, kind):
    found = []
    walk(stmt, lambda s: found.append(s) if isinstance(s, kind) else None)
    return found


def test_stages_are_one_explicit_ordered_list():
    names = list(stages(ACCEL))
    assert names == ["tensorize", "inject_alu", "inject_dma", "flatten_storage", "fold_uop_loops",
                     "inject_virtual_threads", "allocate_storage", "layout_dram", "emit_instructions",
                     "fuse_accumulator_init", "fuse_requant_store", "deduplicate_uops", "finish", "insert_dependency_tokens"]
    assert all(callable(run) for run in stages(ACCEL).values())
    seen = []
    t, s = _dense_ir(dict(tm=4, tn=4, tk=2, threads=2))
    program = build(s, ACCEL, [t["a"], t["w"], t["bias"], t["out"]], trace=seen.append)
    assert [x.splitlines()[0] for x in seen] == ["== lower"] + [f"== {n}" for n in names]
    assert "func main(a: int8" in seen[0] and "FINISH" in seen[-2].upper()
    assert len(program.instructions) > 4


def test_tensorize_replaces_the_entry_loops():
    _, s = _dense_ir(dict(tm=4, tn=4, tk=2, threads=1))
    ir = tensorize(schedule_to_ir(s))
    gemms = _nodes(ir, GemmIntrin)
    assert {g.reset for g in gemms} == {True, False}
    update = next(g for g in gemms if not g.reset)
    assert (update.dst.buffer.scope, update.src.buffer.scope, update.wgt.buffer.scope) == ("acc", "inp", "wgt")
    assert not [a for a in _nodes(ir, AttrStmt) if a.key.startswith("tensorize")]


def test_tensorize_refuses_a_nest_that_is_not_the_intrinsic():
    a = placeholder((2, 3, 1, 8), "int8", "a")   # block_in 8 on a 4-wide core
    w = placeholder((2, 3, 4, 8), "int8", "w")
    ko, ki = reduce_axis(3, "ko"), reduce_axis(8, "ki")
    c = compute((2, 2, 1, 4), lambda m, n, b, o: sum_(a[m, ko, b, ki].astype("int32") * w[n, ko, o, ki].astype("int32"),
                                                      [ko, ki]), name="c")
    s = create_schedule(c)
    s[c].set_scope("acc")
    s.cache_read(a, "inp", [c])
    s.cache_read(w, "wgt", [c])
    s[c].reorder(*s[c].leaf[:2], s[c].leaf[4], *s[c].leaf[2:4], s[c].leaf[5])
    s[c].tensorize(s[c].leaf[3], gemm_intrin(TINY))
    with pytest.raises(TensorizeError, match="differ from the intrinsic"):
        tensorize(schedule_to_ir(s))


def test_alu_injection_maps_the_epilogue_in_place():
    _, s = _dense_ir(dict(tm=4, tn=4, tk=2, threads=1))
    ir = inject_alu(tensorize(schedule_to_ir(s)), TINY)
    text = "\n".join(line.strip() for line in format_ir(ir).splitlines())
    ops = [line.split()[0] for line in text.splitlines() if line.startswith("alu.")]
    assert ops == ["alu.add", "alu.shr", "alu.max", "alu.min"]  # bias, shift, ReLU clip to [0, 127]
    # The epilogue stage became an alias of the accumulator: no storage of its own.
    assert [a.buffer.name for a in _nodes(ir, Allocate)] == ["c", "bias.acc", "a.inp", "w.wgt"]


def test_alu_injection_refuses_what_the_alu_cannot_do():
    x = placeholder((4, 1, 4), "int32", "x")
    y = compute((4, 1, 4), lambda i, b, o: x[i, b, o] // 3, name="y")
    s = create_schedule(y)
    yc = s.cache_write(y, "acc")
    xc = s.cache_read(x, "acc", [yc])
    for t in (xc, yc):
        s[t].compute_at(s[y], s[y].leaf[0])
    s[yc].pragma(s[yc].leaf[0], "alu")
    with pytest.raises(AluInjectionError, match="not a chain of ALU operations"):
        inject_alu(schedule_to_ir(s), TINY)


def test_dma_injection_gives_border_tiles_zero_padding():
    op = compile_conv2d(TINY, (1, 4, 40, 6), (4, 4, 3, 3), padding=1, latency_hiding=False)
    loads = [i for i in op.program.instructions if isinstance(i, Load) and i.mem == MemType.INP]
    assert {(i.y_pad0, i.y_pad1) for i in loads} >= {(1, 0), (0, 1)}  # top and bottom tiles
    assert {(i.x_pad0, i.x_pad1) for i in loads} == {(1, 1)}          # full-width rows
    assert all(i.x_stride == 6 for i in loads)                        # DRAM row pitch: the image width


def test_dma_copies_become_single_2d_transfers():
    t, s = _dense_ir(dict(tm=4, tn=4, tk=2, threads=1))
    ir = inject_dma(inject_alu(tensorize(schedule_to_ir(s)), TINY), TINY)
    copies = _nodes(ir, DmaCopy)
    assert {c.direction for c in copies} == {"load", "store"}
    a_copy = next(c for c in copies if c.sram.buffer.scope == "inp")
    assert a_copy.x_stride == 4 and a_copy.x_size.value == 2 and a_copy.y_size.value == 4


def test_fold_respects_the_uop_budget():
    _, s = _dense_ir(dict(tm=4, tn=4, tk=4, threads=1), shape=(4, 4, 4))
    big = _after_passes(_, s, uop_budget=64)
    tasks = [t for t in _nodes(big, HwLoopTask) if t.kind == "gemm" and not t.body.reset]
    assert len(tasks) == 1 and len(tasks[0].hw_loops) == 2 and len(tasks[0].uop_loops) == 1
    _, s = _dense_ir(dict(tm=4, tn=4, tk=4, threads=1), shape=(4, 4, 4))
    small = fold_uop_loops(flatten_storage(inject_dma(inject_alu(tensorize(schedule_to_ir(s)), TINY), TINY)), TINY,
                           uop_budget=1)
    tasks = [t for t in _nodes(small, HwLoopTask) if t.kind == "gemm" and not t.body.reset]
    assert tasks[0].uop_loops == []  # the third loop stays a host loop around the instruction


def test_virtual_threads_double_the_buffers():
    one = _after_passes(*_dense_ir(dict(tm=2, tn=4, tk=2, threads=1)))
    two = _after_passes(*_dense_ir(dict(tm=2, tn=4, tk=2, threads=2)))
    assert two.value.used["inp"] == 2 * one.value.used["inp"]
    assert two.value.used["acc"] == 2 * one.value.used["acc"]


def test_capacity_error_names_buffer_need_and_capacity():
    t, s = _dense_ir(dict(tm=16, tn=8, tk=16, threads=2), shape=(32, 16, 8))
    with pytest.raises(CapacityError, match=r"needs 512 entries of the input buffer \(a.inp: 512\) but config "
                                            r"'tiny' has 256"):
        build(s, TINY, [t["a"], t["w"], t["bias"], t["out"]])


def test_uop_kernels_are_deduplicated():
    program = compile_dense(TINY, 64, 64, 64).program
    gemms = [i for i in program.instructions if isinstance(i, Gemm)]
    ranges = {(g.uop_bgn, g.uop_end) for g in gemms}
    assert len(gemms) > 2 * len(ranges)  # kernels are shared between instructions
    assert len(set(program.uops)) == len(program.uops) or len(program.uops) <= sum(e - b for b, e in ranges)


def test_uop_cache_mode_reloads_kernels():
    from gemforge.hw.config import AccelConfig
    small = AccelConfig(name="u", batch=1, block_in=4, block_out=4, inp_buffer_bytes=1024, wgt_buffer_bytes=4096,
                        acc_buffer_bytes=4096, out_buffer_bytes=1024, uop_buffer_bytes=8)
    records = [Emitted(Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), kernel=(Uop(k, 0, 0),))
               for k in (0, 1, 2, 0, 1)]
    out, table, _ = deduplicate_uops(small, records)
    assert len(table) == 3
    loads = [r for r in out if isinstance(r.insn, Load)]
    assert len(loads) >= 3 and all(r.insn.x_size <= small.uop_depth for r in loads)


def test_dependency_tokens_follow_the_dataflow():
    recs = [
        Emitted(Load(mem=MemType.INP, sram_base=0, dram_base=0, y_size=1, x_size=4, x_stride=4),
                writes=[("inp", 0, 3)]),
        Emitted(Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), reads=[("inp", 0, 3)], writes=[("acc", 0, 0)]),
        Emitted(Store(mem=MemType.ACC, sram_base=0, dram_base=0, y_size=1, x_size=1, x_stride=1),
                reads=[("acc", 0, 0)]),
        Emitted(Load(mem=MemType.INP, sram_base=4, dram_base=0, y_size=1, x_size=4, x_stride=4),
                writes=[("inp", 4, 7)]),   # other half: no wait
        Emitted(Load(mem=MemType.INP, sram_base=0, dram_base=0, y_size=1, x_size=4, x_stride=4),
                writes=[("inp", 0, 3)]),   # overwrites what the GEMM read: waits for it
        Emitted(Gemm(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, reset=True), writes=[("acc", 0, 0)]),
    ]
    insns = insert_dependency_tokens(recs, depth=4)
    assert insns[0].push_next and insns[1].pop_prev             # load → compute (read after write)
    assert insns[1].push_next and insns[2].pop_prev             # compute → store
    assert not insns[3].pop_next                                # double buffering: no wait
    assert insns[1].push_prev and insns[4].pop_next             # compute → load (write after read)
    assert insns[2].push_prev and insns[5].pop_next             # store → compute (write after read)


def test_backend_refuses_parallel_loops():
    t, s = _dense_ir(dict(tm=4, tn=4, tk=2, threads=1))
    st = s[t["out"]]
    st.parallel(st.leaf[0])
    with pytest.raises(AccelCompileError, match="parallel"):
        build(s, TINY, [t["a"], t["w"], t["bias"], t["out"]])


def test_programs_balance_tokens_on_fsim():
    """Every push is popped: fsim reports leftovers or deadlocks, so running is the check."""
    from compiler_helpers import device_for
    rng = np.random.default_rng(0)
    op = compile_dense(TINY, 13, 17, 11, bias=True, shift=2)
    a, b = rng.integers(-128, 128, (13, 17), dtype=np.int8), rng.integers(-128, 128, (17, 11), dtype=np.int8)
    op.run(device_for(TINY), a=a, b=b, bias=np.zeros(11, np.int32))
    pushes = sum(i.push_next + i.push_prev for i in op.program.instructions)
    pops = sum(i.pop_next + i.pop_prev for i in op.program.instructions)
    assert pushes == pops > 0
