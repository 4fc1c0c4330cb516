"""How fsim runs an ALU loop fast: in batches whose result equals running its micro-ops one
at a time, in order.

An ALU micro-op reads the accumulator after the previous one's write (the pipeline forwards
it), so the obvious execution is one micro-op at a time, which is far too slow for loops of
2^28 micro-ops. `AluBatching` finds batches with the same result: per-entry reductions when
the operands do not change during the instruction (`_alu_constant_operands`); a loop that
repeats one body as a matrix power (ADD, MUL) or up to a cycle of its values
(`_alu_periodic`); otherwise blocks of micro-ops that read nothing written earlier in the
block (`_alu_in_order`). None of this is semantics: `Fsim._alu` says which batching applies,
and `Fsim._alu_op` is the one definition of what each op computes. The tests compare every
path with the reference model's one-micro-op-at-a-time loop (tests/sim/test_fsim.py).
"""

from __future__ import annotations

import numpy as np

from gemforge.hw.isa import Alu, AluOp

from .integers import matrix_power, pow_u64, wrap, wrap_u64

__all__ = ["AluBatching", "MATRIX_ENTRIES", "CYCLE_SEARCH", "STEP_BODY"]

# An ALU loop that repeats one body (`AluBatching._alu_periodic`): ADD and MUL bodies touching at
# most this many accumulator entries are raised to their repeat count as a k×k matrix, k^3
# work per squaring (numpy's integer matmul has no BLAS: about 6 ms at 128, 50 ms at 256).
MATRIX_ENTRIES = 128
# Repetitions watched for a repeated state before the rest run as an ordinary loop.
CYCLE_SEARCH = 1024
# Bodies of up to this many micro-ops repeat one micro-op at a time: below about 16,
# planning their batches each repetition (`AluBatching._alu_in_order`) costs more (measured).
STEP_BODY = 16


class AluBatching:
    """fsim's ALU fast paths, as a base of `Fsim`: they read ``config``, ``acc``,
    ``_alu_chunk`` and ``uop`` loops through `Fsim._index_chunks`, compute with
    `Fsim._alu_op` and write with `Fsim._write_acc`."""

    def _alu_sources_written(self, insn: Alu, uops: np.ndarray) -> bool:
        """Whether any micro-op's src entry is also some micro-op's dst entry."""
        written = np.zeros(self.config.acc_depth, bool)
        read = np.zeros(self.config.acc_depth, bool)
        for (dst, src), _ in self._index_chunks(insn, uops, self._alu_chunk, collapse=True):
            written[dst] = True
            read[src] = True
        return bool((written & read).any())

    def _alu_constant_operands(self, insn: Alu, uops: np.ndarray) -> bool:
        """Run an ALU instruction whose operands do not change while it runs (an immediate, or
        src entries it never writes) as one reduction per destination entry, over the distinct
        (dst, src) pairs with their counts. Returns False, having done nothing, for a SHR whose
        register amounts for one entry differ in sign (their order then matters)."""
        depth = self.config.acc_depth
        keys, counts = [], []
        for (dst, src), repeat in self._index_chunks(insn, uops, self._alu_chunk, collapse=True):
            key = dst if insn.imm is not None else dst * depth + src
            uniq, count = np.unique(key, return_counts=True)
            keys.append(uniq)
            counts.append(count * repeat)
        uniq, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        count = np.zeros(uniq.size, np.int64)
        np.add.at(count, inverse, np.concatenate(counts))
        dst, src = (uniq, uniq) if insn.imm is not None else (uniq // depth, uniq % depth)
        if insn.op == AluOp.SHR and insn.imm is None:     # checked before any batch writes
            b = self.acc[src]
            order = np.argsort(dst, kind="stable")
            starts = np.flatnonzero(np.r_[True, dst[order][1:] != dst[order][:-1]])
            if ((np.minimum.reduceat(b[order], starts) < 0) & (np.maximum.reduceat(b[order], starts) > 0)).any():
                return False
        lo = 0
        while lo < dst.size:        # in batches of whole destination entries (pairs are sorted by dst)
            hi = min(dst.size, lo + self._alu_chunk)
            while hi < dst.size and dst[hi] == dst[hi - 1]:
                hi += 1
            assert self._alu_grouped(insn.op, insn.imm, dst[lo:hi], src[lo:hi], count[lo:hi])
            lo = hi
        return True

    def _alu_periodic(self, insn: Alu, uops: np.ndarray) -> bool:
        """Run an ALU loop whose outer factors are 0, so each outer iteration applies the same
        body (the inner loop; with inner factors of 0 too, each inner iteration: the micro-op
        range), without running every repetition. The body maps the accumulator entries it
        touches to new values from those alone, so ADD and MUL take a matrix power
        (`_alu_matrix`), and the others stop at a fixed point or skip whole cycles of the
        touched values (`_alu_until_cycle`); repetitions still left then run as an ordinary
        loop. Returns False, having done nothing, when the loop does not repeat a body of at
        most one batch (`_alu_chunk`) at least twice."""
        if insn.dst_factor_out or insn.src_factor_out:
            return False
        inner_steps = insn.dst_factor_in or insn.src_factor_in
        body_uops = uops.shape[0] * (insn.iter_in if inner_steps else 1)
        times = insn.iter_out * (1 if inner_steps else insn.iter_in)
        if times < 2 or body_uops > self._alu_chunk:
            return False
        (dst, src), repeat = next(self._index_chunks(insn, uops, body_uops, collapse=True))
        assert repeat == times and dst.size == body_uops
        if insn.op in (AluOp.ADD, AluOp.MUL) and self._alu_matrix(insn.op, dst, src, times):
            return True
        left = self._alu_until_cycle(insn.op, dst, src, times)
        per_batch = max(1, self._alu_chunk // dst.size)
        while left:
            count = min(left, per_batch)
            self._alu_in_order(insn.op, np.tile(dst, count), np.tile(src, count))
            left -= count
        return True

    def _alu_matrix(self, op: AluOp, dst: np.ndarray, src: np.ndarray, times: int) -> bool:
        """``times`` repetitions of an ADD or MUL body of register micro-ops (dst, src). On
        the k entries it touches an ADD body is linear: its matrix M starts as the identity and
        each micro-op adds row s to row d, and the repetitions are M^times modulo 2^64, exact
        modulo 2^acc_width (`matrix_power`). A MUL body makes each entry a product of powers
        of the entries' old values, with the same M as exponents. An exponent below acc_width
        is used as it is; a larger one makes any even base 0 and is taken modulo 2^(acc_width-2),
        which every odd value's order divides, plus 2^(acc_width-2) (still at least acc_width).
        Returns False, having done nothing, when the body touches more than `MATRIX_ENTRIES`
        entries."""
        touched, local = np.unique(np.concatenate((dst, src)), return_inverse=True)
        k = touched.size
        if k > MATRIX_ENTRIES:
            return False
        width = self.config.acc_width
        m = np.eye(k, dtype=np.uint64)
        capped = np.eye(k, dtype=np.int64)              # MUL: M saturated at acc_width
        for d, s in zip(local[:dst.size].tolist(), local[dst.size:].tolist()):
            m[d] += m[s]
            if op == AluOp.MUL:
                capped[d] = np.minimum(capped[d] + capped[s], width)
        written = np.unique(local[:dst.size])
        old = self.acc[touched]
        power = matrix_power(m, times)[written]
        if op == AluOp.ADD:
            new = (power @ old.reshape(k, -1).view(np.uint64)).reshape((-1,) + old.shape[1:])
        else:
            order = 1 << (width - 2)
            capped = matrix_power(capped, times, cap=width)[written]
            exponents = np.where(capped < width, capped, (power & np.uint64(order - 1)).view(np.int64) + order)
            rows = max(1, (1 << 20) // old.size)        # destinations per batch: ~2^20 powers
            new = np.concatenate([np.multiply.reduce(pow_u64(old, exponents[r:r + rows, :, None, None]), axis=1)
                                  for r in range(0, len(exponents), rows)])
        self._write_acc(touched[written], wrap_u64(new, width))
        return True

    def _alu_until_cycle(self, op: AluOp, dst: np.ndarray, src: np.ndarray, times: int) -> int:
        """Up to ``times`` repetitions of a body of register micro-ops (dst, src), one at a
        time, watching the entries it touches: once their values equal those after an earlier
        repetition, the remaining repetitions are whole cycles of that length and a remainder.
        Each repetition is compared with the one before (a fixed point) and with the one saved
        at the last power of two (Brent's cycle finding, which needs no store of past states).
        MIN and MAX are watched to the end: each entry only moves one way among the values
        present, so they reach a fixed point. Other ops are watched for `CYCLE_SEARCH`
        repetitions; returns how many repetitions are left (0 when done)."""
        touched = np.unique(np.concatenate((dst, src)))
        pairs = list(zip(dst.tolist(), src.tolist())) if dst.size <= STEP_BODY else None

        def body() -> None:
            if pairs is None:
                self._alu_in_order(op, dst, src)
                return
            for d, s in pairs:
                self._write_acc(d, self._alu_op(op, self.acc[d], self.acc[s]))

        search = times if op in (AluOp.MIN, AluOp.MAX) else min(times, CYCLE_SEARCH)
        previous = saved = self.acc[touched]
        saved_at = 0
        for step in range(1, search + 1):
            body()
            state = self.acc[touched]
            if np.array_equal(state, previous):
                period = 1
            elif np.array_equal(state, saved):
                period = step - saved_at
            else:
                if step & (step - 1) == 0:
                    saved, saved_at = state, step
                previous = state
                continue
            for _ in range((times - step) % period):
                body()
            return 0
        return times - search

    def _alu_grouped(self, op: AluOp, imm: int | None, dst: np.ndarray, src: np.ndarray,
                     count: np.ndarray) -> bool:
        """Apply micro-ops whose operands are all read before any of them writes: ``count[t]``
        micro-ops ``acc[dst[t]] = op(acc[dst[t]], imm or acc[src[t]])``. The ops are commutative
        and associative modulo 2^acc_width (SHR while its amounts for an entry share a sign), so
        each entry's micro-ops reduce to one operand in any order. Returns False, having written
        nothing, for SHR amounts of mixed sign."""
        width = self.config.acc_width
        order = np.argsort(dst, kind="stable")
        dst, src, count = dst[order], src[order], count[order]
        starts = np.flatnonzero(np.concatenate(([True], dst[1:] != dst[:-1])))
        targets = dst[starts]
        a = self.acc[targets]
        if imm is not None:
            n = np.add.reduceat(count, starts)[:, None, None]
            if op in (AluOp.MIN, AluOp.MAX):
                new = self._alu_op(op, a, np.int64(imm))
            elif op == AluOp.ADD:
                new = wrap_u64(a.view(np.uint64) + n.view(np.uint64) * np.int64(imm).view(np.uint64), width)
            elif op == AluOp.MUL:
                new = wrap_u64(a.view(np.uint64) * pow_u64(np.full(n.shape, imm, np.int64), n), width)
            else:   # SHR: shifts by amounts of one sign add up (saturating past the width)
                new = self._alu_op(op, a, np.clip(np.minimum(n, 64) * imm, -64, 64))
        else:
            b = self.acc[src]
            c = count[:, None, None]
            if op == AluOp.MIN:
                new = np.minimum(a, np.minimum.reduceat(b, starts))
            elif op == AluOp.MAX:
                new = np.maximum(a, np.maximum.reduceat(b, starts))
            elif op == AluOp.ADD:
                terms = b.view(np.uint64) if (count == 1).all() else b.view(np.uint64) * c.view(np.uint64)
                new = wrap_u64(a.view(np.uint64) + np.add.reduceat(terms, starts), width)
            elif op == AluOp.MUL:
                new = wrap_u64(a.view(np.uint64) * np.multiply.reduceat(pow_u64(b, c), starts), width)
            else:
                if ((np.minimum.reduceat(b, starts) < 0) & (np.maximum.reduceat(b, starts) > 0)).any():
                    return False
                amount = np.add.reduceat(np.clip(b, -64, 64) * np.minimum(c, 64), starts)
                new = self._alu_op(op, a, np.clip(amount, -64, 64))
        self._write_acc(targets, new)
        return True

    def _alu_in_order(self, op: AluOp, dst: np.ndarray, src: np.ndarray) -> None:
        """Register-operand micro-ops, in order, in blocks: a block ends before the first
        micro-op whose src entry an earlier micro-op of the block wrote, so every operand of a
        block can be read before its writes (`_alu_grouped`); a run of one micro-op
        ``acc[d] = op(acc[d], acc[d])`` repeated is computed in closed form."""
        m = dst.size
        pos = np.arange(m, dtype=np.int64)
        # last_write[k]: the last position before k whose dst is src[k] (-1: none).
        order = np.argsort(dst, kind="stable")
        writes = dst[order] * m + order              # ascending: by entry, then position
        at = np.searchsorted(writes, src * m + pos) - 1
        hit = writes[at.clip(0)]
        last_write = np.where((at >= 0) & (hit // m == src), hit % m, -1)
        # block_end[p]: the first k with last_write[k] >= p (the micro-op a block from p stops at).
        first = np.full(m + 1, m, np.int64)
        valid = last_write >= 0
        values, where = np.unique(last_write[valid], return_index=True)
        first[values] = pos[valid][where]
        block_end = np.minimum.accumulate(first[::-1])[::-1].tolist()
        # run_end[k]: one past the run of micro-ops identical to micro-op k.
        change = np.r_[True, (dst[1:] != dst[:-1]) | (src[1:] != src[:-1])]
        run_starts = np.flatnonzero(change)
        run_end = np.r_[run_starts[1:], m][np.cumsum(change) - 1].tolist()
        d_list, s_list = dst.tolist(), src.tolist()
        blocks, p = 0, 0
        while p < m and blocks * 16 <= m:          # count blocks, up to a sixteenth of the micro-ops
            p = run_end[p] if d_list[p] == s_list[p] and run_end[p] - p > 1 else block_end[p]
            blocks += 1
        if p < m:
            self._alu_waves(op, d_list, s_list, run_starts.tolist(), run_end)
            return
        p = 0
        while p < m:
            d = d_list[p]
            if d == s_list[p] and run_end[p] - p > 1:
                self._write_acc(slice(d, d + 1), self._alu_repeat_self(op, self.acc[d:d + 1], run_end[p] - p))
                p = run_end[p]
                continue
            q = block_end[p]
            if q - p == 1:
                self._write_acc(d, self._alu_op(op, self.acc[d], self.acc[s_list[p]]))
            elif not self._alu_grouped(op, None, dst[p:q], src[p:q], np.ones(q - p, np.int64)):
                operands = self.acc[src[p:q]]          # SHR amounts of mixed sign: one by one
                for k in range(p, q):
                    self._write_acc(d_list[k], self._alu_op(op, self.acc[d_list[k]], operands[k - p]))
            p = q

    def _alu_waves(self, op: AluOp, dst: list[int], src: list[int], run_starts: list[int],
                   run_end: list[int]) -> None:
        """Register-operand micro-ops with many short dependence chains, in waves: each run of
        identical micro-ops goes into the first wave after those that wrote its dst or src
        entry, and no earlier than the micro-ops that read its dst entry's old value; within a
        wave destinations differ, and every read comes before the wave's writes in program
        order, so a wave reads all its operands, then writes."""
        written: dict[int, int] = {}       # entry -> wave of its last write
        read: dict[int, int] = {}          # entry -> latest wave that read it as a source
        wave_of = []
        for start in run_starts:
            d, s = dst[start], src[start]
            wave = max(written.get(d, -1), written.get(s, -1)) + 1
            wave = max(wave, read.get(d, 0))
            written[d] = wave
            read[s] = max(read.get(s, 0), wave)
            wave_of.append(wave)
        order = np.argsort(np.array(wave_of), kind="stable")
        firsts = np.array(run_starts, np.int64)[order]
        d_all, s_all = np.array(dst, np.int64)[firsts], np.array(src, np.int64)[firsts]
        t_all = np.array(run_end, np.int64)[firsts] - firsts
        bounds = np.searchsorted(np.array(wave_of)[order], np.arange(max(wave_of) + 2)).tolist()
        plain = bool((t_all == 1).all())
        for lo, hi in zip(bounds, bounds[1:]):
            if plain and hi - lo == 1:      # a chain: one micro-op per wave
                d, s = int(d_all[lo]), int(s_all[lo])
                self._write_acc(d, self._alu_op(op, self.acc[d], self.acc[s]))
                continue
            d, s, times = d_all[lo:hi], s_all[lo:hi], t_all[lo:hi]
            if plain:
                self._write_acc(d, self._alu_op(op, self.acc[d], self.acc[s]))
                continue
            repeated_self = (d == s) & (times > 1)
            rest = ~repeated_self
            if rest.any():   # one run per entry here, so a SHR's amounts cannot mix signs
                assert self._alu_grouped(op, None, d[rest], s[rest], times[rest])
            # Then the runs of acc[d] = op(acc[d], acc[d]) (rare), which read only their own entry.
            for k, n in zip(d[repeated_self].tolist(), times[repeated_self].tolist()):
                self._write_acc(slice(k, k + 1), self._alu_repeat_self(op, self.acc[k:k + 1], n))

    def _alu_repeat_self(self, op: AluOp, a: np.ndarray, times: int) -> np.ndarray:
        """``a`` after ``times`` micro-ops ``a = op(a, a)``."""
        width = self.config.acc_width
        if op in (AluOp.MIN, AluOp.MAX):
            return a
        if op == AluOp.ADD:        # doubling: a · 2^times
            return wrap(a << min(times, width), width)
        # MUL squares: after `width` squarings every value is 0 or 1 mod 2^width (odd a:
        # a^(2^k) = 1 mod 2^(k+2)), which squaring keeps. SHR by itself reaches 0 within a
        # few steps (a positive amount clears a smaller value; a left shift by s leaves s low
        # zero bits, so the next amount, if negative, is at least 2^s).
        for _ in range(times if op == AluOp.SHR else min(times, width)):
            new = self._alu_op(op, a, a)
            if np.array_equal(new, a):
                break
            a = new
        return a


    @staticmethod
    def _alu_is_parallel(insn: Alu, dst: np.ndarray, src: np.ndarray) -> bool:
        """True when executing all micro-ops at once equals executing them in order:
        every destination is written once, and no operand is read after an earlier write."""
        uniq, first = np.unique(dst, return_index=True)
        if uniq.size != dst.size:
            return False
        if insn.imm is not None:
            return True
        pos = np.searchsorted(uniq, src).clip(0, uniq.size - 1)
        written_before = (uniq[pos] == src) & (first[pos] < np.arange(src.size))
        return not written_before.any()
