"""fsim: the bit-exact functional simulator, gemforge's executable ISA specification.

`Fsim` holds the on-chip state of one accelerator (the five buffers) and runs
instruction streams read from a DRAM image with the semantics documented in
`gemforge.hw.isa`. The three engines (load, compute, store), their command
queues and the four dependency-token queues are modelled with blocking
semantics, so a program whose tokens do not balance stops with a report of
each engine's next instruction and every token count instead of hanging.

Every instruction is executed as a whole with numpy: a GEMM gathers all its
micro-op operands at once and multiplies them in one batched product, so no
Python code runs per multiply-accumulate. An ALU loop that repeats one chained
body (2^28 repetitions of acc[1] += acc[0]; acc[0] += acc[1], say) is not run
repetition by repetition either: ADD and MUL take a matrix power, and the other
ops run until the values repeat.

The execution rules it enforces are those of the `gemforge.hw.isa` module
docstring. Internally the accumulator buffer is int64 holding values already
wrapped to ``acc_width`` bits.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from gemforge.hw.config import ENTRY_LAYOUTS, AccelConfig
from gemforge.hw.regmap import ADDRESS_TOP, Fault
from gemforge.hw.isa import (
    Alu,
    AluOp,
    EncodingError,
    Engine,
    Finish,
    Gemm,
    Instruction,
    Load,
    MemType,
    Store,
    TOKEN_POPS,
    TOKEN_PUSHES,
    TOKEN_QUEUES,
    decode,
    engine_of,
    insn_bytes,
    mnemonic,
    uop_fields,
)

__all__ = [
    "Fsim", "FsimError", "DeadlockError", "OutOfBoundsError", "check_dispatch",
    "check_token_balance", "check_loop_indices", "check_micro_op_loops",
    "COUNTER_NAMES",
]


class FsimError(RuntimeError):
    """A program did something the ISA does not allow (reported, never a hang).

    ``fault`` is the `Fault` the hardware reports for the same program in its
    ERROR register (`gemforge.hw.regmap`)."""

    default_fault = Fault.INVALID_INSTRUCTION

    def __init__(self, message: str, fault: Fault | None = None):
        super().__init__(message)
        self.fault = self.default_fault if fault is None else fault


class DeadlockError(FsimError):
    """No engine can make progress, or the program ended with work or tokens left over."""

    default_fault = Fault.DEADLOCK


class OutOfBoundsError(FsimError):
    """An instruction addressed SRAM or DRAM outside its bounds (SRAM: `Fault.BUFFER_RANGE`;
    DRAM past the 32-bit address space: `Fault.DRAM_RANGE`, or `Fault.PROGRAM_RANGE` for the
    instruction stream, found before the access; DRAM below that top but beyond the simulated
    DRAM: `Fault.BUS_ERROR`, as the memory answers such an access with an error response)."""

    default_fault = Fault.BUFFER_RANGE


_ENGINE_ORDER = (Engine.LOAD, Engine.STORE, Engine.COMPUTE)

#: Every event counter fsim reports, in a stable order.
COUNTER_NAMES = (
    "insns", "load_insns", "store_insns", "gemm_insns", "alu_insns", "finish_insns",
    "load_bytes_inp", "load_bytes_wgt", "load_bytes_acc", "load_bytes_uop",
    "store_bytes_out", "store_bytes_acc",
    "gemm_uops", "gemm_reset_uops", "macs", "alu_uops",
)

# GEMM/ALU loops are executed in chunks of at most this many micro-ops, which
# bounds the memory of the gathered operands.
_CHUNK_UOPS = 1 << 16

# An ALU loop that repeats one body (`Fsim._alu_periodic`): ADD and MUL bodies touching at
# most this many accumulator entries are raised to their repeat count as a k×k matrix, k^3
# work per squaring (numpy's integer matmul has no BLAS: about 6 ms at 128, 50 ms at 256).
_MATRIX_ENTRIES = 128
# Repetitions watched for a repeated state before the rest run as an ordinary loop.
_CYCLE_SEARCH = 1024
# Bodies of up to this many micro-ops repeat one micro-op at a time: below about 16,
# planning their batches each repetition (`Fsim._alu_in_order`) costs more (measured).
_STEP_BODY = 16


def _wrap(values: np.ndarray, bits: int) -> np.ndarray:
    """Reduce int64 values to signed ``bits``-bit two's complement."""
    half = np.int64(1 << (bits - 1))
    return ((values + half) & np.int64((1 << bits) - 1)) - half


def _wrap_u64(values: np.ndarray, bits: int) -> np.ndarray:
    """Signed ``bits``-bit two's complement of uint64 values computed modulo 2^64 (sums and
    products of wrapped values: unsigned overflow is exact modulo 2^bits)."""
    half = np.uint64(1 << (bits - 1))
    return ((values + half) & np.uint64((1 << bits) - 1)).view(np.int64) - np.int64(1 << (bits - 1))


def _pow_u64(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """``base ** exponent`` modulo 2^64 (uint64), element-wise, by repeated squaring."""
    shape = np.broadcast_shapes(np.shape(base), np.shape(exponent))
    base = np.broadcast_to(np.asarray(base, np.int64), shape).view(np.uint64)
    exponent = np.broadcast_to(np.asarray(exponent, np.int64), shape).copy()
    result = np.ones(shape, np.uint64)
    while exponent.any():
        odd = (exponent & 1).astype(bool)
        result = np.where(odd, result * base, result)
        base = base * base
        exponent >>= 1
    return result


def _matrix_power(m: np.ndarray, times: int, cap: int | None = None) -> np.ndarray:
    """``m ** times`` (``times`` >= 1) by repeated squaring. A uint64 ``m`` gives the power
    modulo 2^64, exact modulo any 2^b with b <= 64: numpy's integer matmul wraps, and reducing
    modulo 2^b keeps sums and products. With ``cap``, ``m`` holds non-negative integers at most
    ``cap`` and the power is saturated at ``cap``: min(·, cap) keeps sums and products of
    non-negative integers too, and the int64 sums stay below k·cap²."""
    result = None
    while True:
        if times & 1:
            result = m if result is None else result @ m
            if cap is not None:
                result = np.minimum(result, cap)
        times >>= 1
        if not times:
            return result
        m = m @ m
        if cap is not None:
            m = np.minimum(m, cap)


def _int_dtype(bits: int) -> np.dtype:
    return np.dtype(f"<i{bits // 8}")


@dataclass
class _Queued:
    index: int
    insn: Instruction


@dataclass
class _EngineState:
    queue: collections.deque = field(default_factory=collections.deque)
    pending_pushes: list[str] = field(default_factory=list)
    # Remembered for the deadlock report: the instruction whose pushes are pending.
    last: _Queued | None = None


def check_dispatch(instructions: list[Instruction], config: AccelConfig) -> None:
    """Each instruction's dispatch checks (`Fsim._check_static`: zero sizes and loop counts,
    buffer ranges, FINISH's place), in program order."""
    checker = Fsim(config, np.zeros(0, np.uint8))      # the checks read the config only
    for index, insn in enumerate(instructions):
        checker._check_static(insn, index, len(instructions))


def check_micro_op_loops(instructions: list[Instruction], config: AccelConfig, dram: np.ndarray) -> None:
    """Every GEMM/ALU loop's buffer indices are in range (`check_loop_indices`) with the
    micro-ops that the program's LOADs into the micro-op buffer place there from ``dram`` (the
    DRAM image the instructions address). Those LOADs and the loops all run on the compute
    engine, in program order, so replaying them in that order gives each loop its micro-ops.
    Raises `FsimError` (its subclasses) naming the first fault, as running the program would."""
    sim = Fsim(config, dram)
    for index, insn in enumerate(instructions):
        if isinstance(insn, Load) and insn.mem == MemType.UOP:
            sim._load(insn, index)
        elif isinstance(insn, (Gemm, Alu)):
            sim._loop_uops(insn, index)


def check_token_balance(instructions: list[Instruction]) -> None:
    """Every dependency-token queue gets as many pushes as pops over the program."""
    balance: dict[str, int] = {}
    for insn in instructions:
        engine = engine_of(insn)
        for flag, queue in TOKEN_PUSHES[engine].items():
            balance[queue] = balance.get(queue, 0) + int(getattr(insn, flag))
        for flag, queue in TOKEN_POPS[engine].items():
            balance[queue] = balance.get(queue, 0) - int(getattr(insn, flag))
    unbalanced = {queue: n for queue, n in balance.items() if n}
    if unbalanced:
        left_over = any(n > 0 for n in unbalanced.values())
        raise DeadlockError("the program's dependency tokens do not balance: " + ", ".join(
            f"{queue} gets {abs(n)} more {'pushes than pops' if n > 0 else 'pops than pushes'}"
            for queue, n in unbalanced.items()), Fault.TOKEN_IMBALANCE if left_over else Fault.DEADLOCK)


def _loop_fields(insn: Gemm | Alu, config: AccelConfig) -> list[tuple[str, str, int, int]]:
    """(name, buffer, factor_out, factor_in) of each index a GEMM/ALU micro-op computes, in
    micro-op column order (dst, src[, wgt])."""
    is_gemm = isinstance(insn, Gemm)
    fields = [("dst", "acc", insn.dst_factor_out, insn.dst_factor_in),
              ("src", "inp" if is_gemm else "acc", insn.src_factor_out, insn.src_factor_in)]
    if is_gemm:
        fields.append(("wgt", "wgt", insn.wgt_factor_out, insn.wgt_factor_in))
    return fields


def check_loop_indices(insn: Gemm | Alu, uops: np.ndarray, config: AccelConfig, where: str) -> None:
    """Every buffer index a GEMM/ALU loop computes, ``u.field + i·factor_out + j·factor_in``,
    lies inside its buffer; else `OutOfBoundsError` naming the first offending field and micro-op
    in execution order (i, then j, then the micro-op), the hardware's BUFFER_RANGE fault.

    ``uops`` are the instruction's micro-ops (rows of dst, src, wgt). Found in closed form: the
    indices grow with i and j (the factors are unsigned), so no index array is built, and a
    loop of 2^28 micro-ops is checked as fast as one of a few."""
    iters_in = insn.iter_in
    for col, (name, buffer, f_out, f_in) in enumerate(_loop_fields(insn, config)):
        base = uops[:, col]
        depth = config.depth(buffer)
        top = int(base.max())
        if top + (insn.iter_out - 1) * f_out + (iters_in - 1) * f_in < depth:
            continue
        # The first outer iteration with a bad index, then its first inner one, then the micro-op.
        short = depth - top - (iters_in - 1) * f_in
        i = 0 if short <= 0 else -(-short // f_out)
        short = depth - top - i * f_out
        j = 0 if short <= 0 else -(-short // f_in)
        idx = base + i * f_out + j * f_in
        u = int(np.flatnonzero(idx >= depth)[0])
        raise OutOfBoundsError(
            f"{where}: {name} index {int(idx[u])} is outside the {depth}-entry {buffer} buffer "
            f"(at i={i}, j={j}, micro-op {insn.uop_bgn + u})")


class Fsim:
    """On-chip state and instruction semantics of one accelerator instance.

    Parameters
    ----------
    config:
        The design point; buffer shapes and widths come from it.
    dram:
        The DRAM image (a 1-D uint8 array) that LOAD and STORE address and the
        instruction stream is read from. It is used in place, not copied.
    """

    def __init__(self, config: AccelConfig, dram: np.ndarray) -> None:
        if dram.dtype != np.uint8 or dram.ndim != 1:
            raise TypeError("dram must be a 1-D uint8 array")
        self.config = config
        self.dram = dram
        c = config
        # Each data buffer holds entries of its layout (the accumulator's as int64, wrapped to
        # acc_width where the hardware wraps); `_dram_dtype` is one entry as DRAM stores it.
        self._dram_dtype: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        buffers = {}
        for buffer in ENTRY_LAYOUTS:
            rows, cols, bits = c.entry_layout(buffer)
            self._dram_dtype[buffer] = (_int_dtype(bits), (rows, cols))
            buffers[buffer] = np.zeros((c.depth(buffer), rows, cols), np.int64 if buffer == "acc" else _int_dtype(bits))
        self._dram_dtype["uop"] = (np.dtype(f"<u{c.uop_bits // 8}"), ())
        self.inp, self.wgt, self.acc, self.out = (buffers[b] for b in ("inp", "wgt", "acc", "out"))
        self.uop = np.zeros((c.uop_depth, 3), np.int64)  # (dst, src, wgt)
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        # GEMM products are summed over block_in in floating point, which is exact
        # while every partial sum stays below the mantissa: float32 (2^24) when the
        # operand widths allow, float64 (2^53) otherwise.
        mac_bits = c.inp_width + c.wgt_width - 2 + (c.block_in - 1).bit_length() + 1
        self._mac_dtype = np.float32 if mac_bits <= 24 else np.float64
        # Chunks of micro-ops are summed in float64: keep each chunk's sum below 2^53.
        self._chunk_uops = min(_CHUNK_UOPS, 1 << max(0, 52 - mac_bits))
        # ALU micro-ops per batch: index arrays and gathered operands of about 32 MiB.
        self._alu_chunk = max(1 << 12, (1 << 22) // (c.batch * c.block_out))
    # ------------------------------------------------------------------ running

    def run(self, insn_address: int, insn_count: int) -> dict[str, int]:
        """Run the ``insn_count`` instructions at byte ``insn_address`` until FINISH retires.

        Returns the counters of this run. Raises `DeadlockError` when no engine
        can make progress or the program ends unbalanced, `OutOfBoundsError` on
        a bad address, and `FsimError` for any other illegal program."""
        c = self.config
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        if insn_count < 1:
            raise FsimError("a program needs at least one instruction (FINISH)", Fault.EMPTY_PROGRAM)
        if insn_address % insn_bytes(c):
            raise FsimError(f"the instruction address {insn_address:#x} is not a multiple of the "
                            f"{insn_bytes(c)}-byte instruction size", Fault.MISALIGNED_PROGRAM)
        end = insn_address + insn_count * insn_bytes(c)
        if end > ADDRESS_TOP:
            raise OutOfBoundsError(f"the {insn_count}-instruction program at {insn_address:#x} ends at byte "
                                   f"{end:#x}, past the {ADDRESS_TOP:#x}-byte address space",
                                   Fault.PROGRAM_RANGE)
        if insn_address < 0 or end > self.dram.size:
            raise OutOfBoundsError(f"instruction stream bytes {insn_address:#x}..{end:#x} lie outside "
                                   f"the {self.dram.size}-byte DRAM", Fault.BUS_ERROR)
        stream = self.dram[insn_address:end].tobytes()

        def fetch(index: int) -> Instruction:
            raw = int.from_bytes(stream[index * insn_bytes(c):(index + 1) * insn_bytes(c)], "little")
            try:
                insn = decode(raw, c)
            except EncodingError as exc:
                raise FsimError(f"instruction {index} (at {insn_address + index * insn_bytes(c):#x}) "
                                f"is invalid: {exc}") from None
            self._check_static(insn, index, insn_count)
            return insn

        engines = {e: _EngineState() for e in Engine}
        tokens = dict.fromkeys((q.name for q in TOKEN_QUEUES), 0)
        pc = 0
        finished = False

        def try_pushes(state: _EngineState) -> bool:
            while state.pending_pushes:
                name = state.pending_pushes[0]
                if tokens[name] >= c.token_queue_depth:
                    return False
                tokens[name] += 1
                state.pending_pushes.pop(0)
            return True

        while not finished:
            progress = False
            # Fetch dispatches in program order and stalls on a full command queue.
            while pc < insn_count:
                insn = fetch(pc)
                state = engines[engine_of(insn)]
                if len(state.queue) >= c.cmd_queue_depth:
                    break
                state.queue.append(_Queued(pc, insn))
                pc += 1
                progress = True
            for engine in _ENGINE_ORDER:
                state = engines[engine]
                while state.queue or state.pending_pushes:
                    if not try_pushes(state) or not state.queue:
                        break
                    head = state.queue[0]
                    pops = [q for flag, q in TOKEN_POPS[engine].items() if getattr(head.insn, flag)]
                    if any(tokens[q] == 0 for q in pops):
                        break
                    # FINISH waits until the other engines have done all they can, so
                    # work they still hold when it retires is work that can never run.
                    if isinstance(head.insn, Finish) and progress:
                        break
                    for q in pops:
                        tokens[q] -= 1
                    state.queue.popleft()
                    self.execute(head.insn, head.index)
                    state.last = head
                    state.pending_pushes = [q for flag, q in TOKEN_PUSHES[engine].items()
                                            if getattr(head.insn, flag)]
                    progress = True
                    if isinstance(head.insn, Finish):
                        finished = True
                        try_pushes(state)
                        break
                if finished:
                    break
            if not progress and not finished:
                if pc == insn_count and not any(st.queue or st.pending_pushes for st in engines.values()):
                    raise DeadlockError(f"every one of the {insn_count} instructions ran but none was FINISH",
                                        Fault.NO_FINISH)
                raise DeadlockError(self._report(
                    "deadlock: no engine can make progress", engines, tokens, pc, insn_count))
        finish_index = engines[Engine.COMPUTE].last.index
        if finish_index != insn_count - 1:
            raise FsimError(f"FINISH is instruction {finish_index} but must be the last one "
                            f"(instruction {insn_count - 1})", Fault.FINISH_NOT_LAST)
        leftovers = pc < insn_count or any(s.queue or s.pending_pushes for s in engines.values()) \
            or any(tokens.values())
        if leftovers:
            raise DeadlockError(self._report(
                f"program ended unbalanced: FINISH (instruction {finish_index}) "
                "retired with work or tokens left over", engines, tokens, pc, insn_count), Fault.TOKEN_IMBALANCE)
        return dict(self.counters)

    @staticmethod
    def _report(title: str, engines: dict, tokens: dict, pc: int, count: int) -> str:
        lines = [title + "."]
        for engine in Engine:
            state = engines[engine]
            if state.pending_pushes:
                what = (f"finished instruction {state.last.index} ({mnemonic(state.last.insn)}) but "
                        f"cannot push to full queue {state.pending_pushes[0]}")
            elif state.queue:
                head = state.queue[0]
                pops = [f"{flag} ({q})" for flag, q in TOKEN_POPS[engine].items() if getattr(head.insn, flag)]
                wait = f", waiting on {', '.join(pops)}" if pops else ""
                what = f"next instruction {head.index} ({mnemonic(head.insn)}){wait}; {len(state.queue)} queued"
            else:
                what = "idle, nothing queued"
            lines.append(f"  {engine.value:8s} {what}")
        lines.append("  tokens   " + ", ".join(f"{q}={n}" for q, n in tokens.items()))
        lines.append(f"  fetch    {pc} of {count} instructions dispatched")
        return "\n".join(lines)

    # ------------------------------------------------------------------ semantics

    def execute(self, insn: Instruction, index: int = 0) -> None:
        """Execute one instruction's data effect (no token handling)."""
        self.counters["insns"] += 1
        if isinstance(insn, Load):
            self.counters["load_insns"] += 1
            self._load(insn, index)
        elif isinstance(insn, Store):
            self.counters["store_insns"] += 1
            self._store(insn, index)
        elif isinstance(insn, Gemm):
            self.counters["gemm_insns"] += 1
            self._gemm(insn, index)
        elif isinstance(insn, Alu):
            self.counters["alu_insns"] += 1
            self._alu(insn, index)
        elif isinstance(insn, Finish):
            self.counters["finish_insns"] += 1
        else:  # pragma: no cover - decode only yields the kinds above
            raise AssertionError(insn)

    def _where(self, insn: Instruction, index: int) -> str:
        return f"instruction {index} ({mnemonic(insn)})"

    def _check_static(self, insn: Instruction, index: int, count: int) -> None:
        """The checks the hardware makes as it dispatches an instruction (`InsnChecker`), in
        its order: sizes and loop counts, then buffer ranges, then FINISH's place. Made at
        dispatch here too, so the first faulting instruction in program order is the one
        reported, as on the hardware."""
        c = self.config
        if isinstance(insn, (Load, Store)):
            self._check_dma_shape(insn, index)
            if isinstance(insn, Load):
                count_written = (insn.y_pad0 + insn.y_size + insn.y_pad1) * (insn.x_pad0 + insn.x_size + insn.x_pad1)
            else:
                count_written = insn.y_size * insn.x_size
            buffer, depth = insn.mem.buffer, c.depth(insn.mem.buffer)
            if insn.sram_base + count_written > depth:
                verb = "writes" if isinstance(insn, Load) else "reads"
                raise OutOfBoundsError(
                    f"{self._where(insn, index)}: {verb} {buffer} entries {insn.sram_base}.."
                    f"{insn.sram_base + count_written - 1} but the {buffer} buffer has {depth} entries")
            if isinstance(insn, Store):
                self._check_bias(insn, index)
            self._check_address_space(insn, index)
        elif isinstance(insn, (Gemm, Alu)):
            for name in ("iter_out", "iter_in"):
                if getattr(insn, name) < 1:
                    raise FsimError(f"{self._where(insn, index)}: {name} must be at least 1, not 0")
            if not insn.uop_bgn < insn.uop_end <= c.uop_depth:
                raise OutOfBoundsError(
                    f"{self._where(insn, index)}: micro-op range [{insn.uop_bgn}, {insn.uop_end}) must be "
                    f"non-empty and within the {c.uop_depth}-entry micro-op buffer")
        elif isinstance(insn, Finish) and index != count - 1:
            raise FsimError(f"FINISH is instruction {index} but must be the last one (instruction {count - 1})",
                            Fault.FINISH_NOT_LAST)

    def _check_address_space(self, insn: Load | Store, index: int) -> None:
        """The tile's DRAM side ends at or below the top of the 32-bit address space (checked
        at dispatch, as the hardware does: nothing of the tile is read or written)."""
        entry = self.config.entry_bytes(insn.dram_buffer)
        end = insn.dram_end * entry
        if end > ADDRESS_TOP:
            raise OutOfBoundsError(
                f"{self._where(insn, index)}: its DRAM tile ends at byte {end:#x}, past the {ADDRESS_TOP:#x}-byte "
                f"address space (dram_base={insn.dram_base} entries of {entry} bytes)", Fault.DRAM_RANGE)

    def _check_dma_shape(self, insn: Load | Store, index: int) -> None:
        for name in ("y_size", "x_size"):
            if getattr(insn, name) < 1:
                raise FsimError(f"{self._where(insn, index)}: {name} must be at least 1, not 0")

    def _dram_entries(self, insn: Load | Store, index: int) -> np.ndarray:
        """Entry indices (y, x) in DRAM that a LOAD/STORE touches, bounds-checked."""
        buffer = insn.dram_buffer
        entry = self.config.entry_bytes(buffer)
        rows = insn.dram_base + np.arange(insn.y_size, dtype=np.int64) * insn.x_stride
        last = insn.dram_end
        if last * entry > self.dram.size:
            raise OutOfBoundsError(
                f"{self._where(insn, index)}: DRAM bytes up to {last * entry:#x} lie outside the "
                f"{self.dram.size:#x}-byte DRAM (dram_base={insn.dram_base} entries of {entry} bytes)",
                Fault.BUS_ERROR)
        return rows[:, None] + np.arange(insn.x_size, dtype=np.int64)[None, :]

    def _dram_view(self, buffer: str) -> np.ndarray:
        """DRAM as an array of whole entries of ``buffer`` (shares memory)."""
        entry = self.config.entry_bytes(buffer)
        usable = self.dram.size // entry * entry
        dtype, shape = self._dram_dtype[buffer]
        return self.dram[:usable].view(dtype).reshape((usable // entry,) + shape)

    def _sram(self, buffer: str) -> np.ndarray:
        return {"inp": self.inp, "wgt": self.wgt, "acc": self.acc, "out": self.out, "uop": self.uop}[buffer]

    def _write_acc(self, indices: np.ndarray | slice, values: np.ndarray) -> None:
        """Write wrapped accumulator values and mirror their low bits into the output buffer."""
        self.acc[indices] = values
        self.out[indices] = _wrap(values, self.config.out_width)

    def _load(self, insn: Load, index: int) -> None:
        self._check_dma_shape(insn, index)
        buffer = insn.mem.buffer
        entries = self._dram_entries(insn, index)
        data = self._dram_view(buffer)[entries]  # (y, x, *entry)
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        pitch = insn.x_pad0 + insn.x_size + insn.x_pad1
        total = rows * pitch
        depth = self.config.depth(buffer)
        if insn.sram_base + total > depth:
            raise OutOfBoundsError(
                f"{self._where(insn, index)}: writes {buffer} entries {insn.sram_base}..{insn.sram_base + total - 1}"
                f" but the {buffer} buffer has {depth} entries")
        self.counters[f"load_bytes_{buffer}"] += entries.size * self.config.entry_bytes(buffer)
        if insn.mem == MemType.UOP:
            words = data.reshape(-1).astype(np.uint64)
            decoded = np.empty((words.size, 3), np.int64)
            pos = 0
            for col, f in enumerate(uop_fields(self.config)):
                decoded[:, col] = ((words >> np.uint64(pos)) & np.uint64((1 << f.width) - 1)).astype(np.int64)
                pos += f.width
            self.uop[insn.sram_base:insn.sram_base + total] = decoded
            return
        tile = np.zeros((rows, pitch) + data.shape[2:], np.int64)
        tile[insn.y_pad0:insn.y_pad0 + insn.y_size, insn.x_pad0:insn.x_pad0 + insn.x_size] = data
        tile = tile.reshape((total,) + data.shape[2:])
        span = slice(insn.sram_base, insn.sram_base + total)
        if insn.mem == MemType.ACC:
            self._write_acc(span, tile)
        else:
            self._sram(buffer)[span] = tile

    def _store(self, insn: Store, index: int) -> None:
        self._check_dma_shape(insn, index)
        buffer = insn.mem.buffer
        count = insn.y_size * insn.x_size
        depth = self.config.depth(buffer)
        if insn.sram_base + count > depth:
            raise OutOfBoundsError(
                f"{self._where(insn, index)}: reads {buffer} entries {insn.sram_base}..{insn.sram_base + count - 1}"
                f" but the {buffer} buffer has {depth} entries")
        self._check_bias(insn, index)
        entries = self._dram_entries(insn, index)
        dtype, _ = self._dram_dtype[insn.dram_buffer]
        data = self._sram(buffer)[insn.sram_base:insn.sram_base + count]
        data = data.reshape(entries.shape + data.shape[1:])
        if insn.requant:
            data = self._requantize(insn, data)
        data = data.astype(dtype)
        view = self._dram_view(insn.dram_buffer)
        if insn.y_size > 1 and insn.x_stride < insn.x_size:
            for y in range(insn.y_size):  # overlapping rows: later rows win, in order
                view[entries[y]] = data[y]
        else:
            view[entries] = data
        # Counted by the entries DRAM receives (a requantizing STORE writes output entries).
        self.counters[f"store_bytes_{insn.dram_buffer}"] += count * self.config.entry_bytes(insn.dram_buffer)

    def _check_bias(self, insn: Store, index: int) -> None:
        bias = insn.bias_entries()
        if bias and bias.stop > self.config.acc_depth:
            raise OutOfBoundsError(
                f"{self._where(insn, index)}: reads its bias from acc entries {bias.start}..{bias.stop - 1} "
                f"but the acc buffer has {self.config.acc_depth} entries")

    def _requantize(self, insn: Store, tile: np.ndarray) -> np.ndarray:
        """A requantizing STORE's output values of a (y, x, batch, block_out) accumulator tile."""
        c = self.config
        if insn.bias:
            rows = np.asarray(insn.bias_entries()) if insn.bias_per_row else np.full(insn.y_size, insn.bias_base)
            tile = _wrap(tile + self.acc[rows][:, None], c.acc_width)
        low = 0 if insn.relu else -(1 << (c.out_width - 1))
        return np.clip(tile >> insn.shift, low, (1 << (c.out_width - 1)) - 1)

    def _loop_indices(self, insn: Gemm | Alu, index: int) -> tuple[np.ndarray, ...]:
        """Per executed micro-op, in execution order: (dst, src, wgt) buffer indices (one chunk
        of `_index_chunks`, which every GEMM and ALU loop's indices come from)."""
        (indices, _), = self._index_chunks(insn, self._loop_uops(insn, index), insn.uop_count)
        return indices

    def _loop_uops(self, insn: Gemm | Alu, index: int) -> np.ndarray:
        """The micro-ops of a GEMM/ALU loop, once its loop counts and every index it will
        compute are checked (`check_loop_indices`)."""
        where = self._where(insn, index)
        for name in ("iter_out", "iter_in"):
            if getattr(insn, name) < 1:
                raise FsimError(f"{where}: {name} must be at least 1, not 0")
        if not insn.uop_bgn < insn.uop_end <= self.config.uop_depth:
            raise OutOfBoundsError(
                f"{where}: micro-op range [{insn.uop_bgn}, {insn.uop_end}) must be non-empty and within "
                f"the {self.config.uop_depth}-entry micro-op buffer")
        uops = self.uop[insn.uop_bgn:insn.uop_end]
        check_loop_indices(insn, uops, self.config, where)
        return uops

    def _gemm(self, insn: Gemm, index: int) -> None:
        """The micro-ops in chunks of index arrays (`_index_chunks`), so a loop of 2^28
        micro-ops needs no more memory than one of a chunk."""
        uops = self._loop_uops(insn, index)
        n = insn.uop_count
        self.counters["gemm_uops"] += n
        c = self.config
        if insn.reset:
            self.counters["gemm_reset_uops"] += n
            for (dst, _, _), _ in self._index_chunks(insn, uops, self._chunk_uops, collapse=True):
                touched = np.unique(dst)
                self._write_acc(touched, np.zeros((touched.size,) + self.acc.shape[1:], np.int64))
            return
        self.counters["macs"] += n * c.macs_per_uop
        if insn.overwrite:
            # Each entry ends with its last micro-op's product alone; a later chunk's write
            # replaces an earlier one's, as the later micro-op does.
            for (dst, src, wgt), _ in self._index_chunks(insn, uops, self._chunk_uops):
                last = dst.size - 1 - np.unique(dst[::-1], return_index=True)[1]
                self._write_acc(dst[last], _wrap(self._products(src[last], wgt[last]), c.acc_width))
            return
        entry = c.batch * c.block_out
        sums = np.zeros(c.acc_depth * entry, np.int64)
        touched = np.zeros(c.acc_depth, bool)
        lanes = np.arange(entry, dtype=np.int64)
        # Addition modulo 2^acc_width is associative and commutative, so summing each entry's
        # micro-ops in any order, and a repeated loop level as a multiple, equals the in-order
        # result. bincount sums a chunk in float64, exact (see _chunk_uops); each chunk's sums
        # are wrapped before they are scaled and added, so int64 never overflows.
        for (dst, src, wgt), repeat in self._index_chunks(insn, uops, self._chunk_uops, collapse=True):
            prod = self._products(src, wgt, exact=False)
            flat = (dst[:, None] * entry + lanes).reshape(-1)
            chunk = np.bincount(flat, weights=prod.reshape(-1), minlength=sums.size).astype(np.int64)
            sums = _wrap(sums + _wrap(chunk, c.acc_width) * repeat, c.acc_width)
            touched[dst] = True
        rows = np.flatnonzero(touched)
        self._write_acc(rows, _wrap(self.acc[rows] + sums.reshape(self.acc.shape)[rows], c.acc_width))

    def _products(self, src: np.ndarray, wgt: np.ndarray, exact: bool = True) -> np.ndarray:
        """Each micro-op's ``inp[src] · wgt[wgt]ᵀ`` (batch × block_out), computed in the MAC
        type (a micro-op's dot products are exact in it); as int64 with ``exact``."""
        a = self.inp[src].astype(self._mac_dtype)
        b = self.wgt[wgt].astype(self._mac_dtype)
        prod = np.matmul(a, b.transpose(0, 2, 1))
        return prod.astype(np.int64) if exact else prod

    def _alu(self, insn: Alu, index: int) -> None:
        """Micro-ops run exactly in order (each reads the accumulator after the previous one's
        write, as the pipeline's forwarding guarantees), computed in batches whose result equals
        that order: all at once when no entry is written twice or read after a write; as
        per-entry reductions when the operands do not change during the instruction; a loop
        that repeats one body, whose values then depend on every earlier repetition, as a
        matrix power or up to a cycle of its values (`_alu_periodic`); otherwise in blocks of
        micro-ops that read nothing written earlier in the block (`_alu_in_order`)."""
        uops = self._loop_uops(insn, index)
        n = insn.uop_count
        self.counters["alu_uops"] += n
        if n <= self._alu_chunk:
            (dst, src), _ = next(self._index_chunks(insn, uops, n))
            if self._alu_is_parallel(insn, dst, src):
                operand = np.int64(insn.imm) if insn.imm is not None else self.acc[src]
                self._write_acc(dst, self._alu_op(insn.op, self.acc[dst], operand))
                return
        if insn.imm is None and insn.uop_end - insn.uop_bgn == 1 and uops[0, 0] == uops[0, 1] and not (
                insn.dst_factor_out or insn.dst_factor_in or insn.src_factor_out or insn.src_factor_in):
            # One micro-op, acc[d] = op(acc[d], acc[d]), repeated n times.
            d = int(uops[0, 0])
            self._write_acc(slice(d, d + 1), self._alu_repeat_self(insn.op, self.acc[d:d + 1], n))
            return
        if insn.imm is not None or not self._alu_sources_written(insn, uops):
            if self._alu_constant_operands(insn, uops):
                return
        if self._alu_periodic(insn, uops):
            return
        for (dst, src), _ in self._index_chunks(insn, uops, self._alu_chunk):
            self._alu_in_order(insn.op, dst, src)

    def _index_chunks(self, insn: Gemm | Alu, uops: np.ndarray, chunk: int, collapse: bool = False):
        """The loop's buffer indices in chunks of at most ``chunk`` micro-ops, in execution
        order: per chunk, (one index array per field of `_loop_fields`: dst, src[, wgt]) and
        how many times the chunk's micro-ops run. That count is 1 unless ``collapse``: then a
        loop level whose factors are all 0 (it repeats the same micro-ops) is left out and
        counted instead, so the chunks hold each distinct micro-op once, not the order."""
        fields = _loop_fields(insn, self.config)
        levels = [(insn.iter_out, [f_out for _, _, f_out, _ in fields]),
                  (insn.iter_in, [f_in for _, _, _, f_in in fields])]
        repeat = 1
        if collapse:
            repeat = int(np.prod([count for count, factors in levels if not any(factors)], dtype=np.int64))
            levels = [level for level in levels if any(level[1])]
        n_uops = uops.shape[0]
        total = n_uops * int(np.prod([count for count, _ in levels], dtype=np.int64))
        for lo in range(0, total, chunk):
            k = np.arange(lo, min(total, lo + chunk), dtype=np.int64)
            u, rest = k % n_uops, k // n_uops
            indices = [uops[u, col].copy() for col in range(len(fields))]
            for count, factors in reversed(levels):    # inner level first
                step = rest % count
                rest //= count
                for index, factor in zip(indices, factors):
                    index += step * factor
            yield tuple(indices), repeat

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
        modulo 2^acc_width (`_matrix_power`). A MUL body makes each entry a product of powers
        of the entries' old values, with the same M as exponents. An exponent below acc_width
        is used as it is; a larger one makes any even base 0 and is taken modulo 2^(acc_width-2),
        which every odd value's order divides, plus 2^(acc_width-2) (still at least acc_width).
        Returns False, having done nothing, when the body touches more than `_MATRIX_ENTRIES`
        entries."""
        touched, local = np.unique(np.concatenate((dst, src)), return_inverse=True)
        k = touched.size
        if k > _MATRIX_ENTRIES:
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
        power = _matrix_power(m, times)[written]
        if op == AluOp.ADD:
            new = (power @ old.reshape(k, -1).view(np.uint64)).reshape((-1,) + old.shape[1:])
        else:
            order = 1 << (width - 2)
            capped = _matrix_power(capped, times, cap=width)[written]
            exponents = np.where(capped < width, capped, (power & np.uint64(order - 1)).view(np.int64) + order)
            rows = max(1, (1 << 20) // old.size)        # destinations per batch: ~2^20 powers
            new = np.concatenate([np.multiply.reduce(_pow_u64(old, exponents[r:r + rows, :, None, None]), axis=1)
                                  for r in range(0, len(exponents), rows)])
        self._write_acc(touched[written], _wrap_u64(new, width))
        return True

    def _alu_until_cycle(self, op: AluOp, dst: np.ndarray, src: np.ndarray, times: int) -> int:
        """Up to ``times`` repetitions of a body of register micro-ops (dst, src), one at a
        time, watching the entries it touches: once their values equal those after an earlier
        repetition, the remaining repetitions are whole cycles of that length and a remainder.
        Each repetition is compared with the one before (a fixed point) and with the one saved
        at the last power of two (Brent's cycle finding, which needs no store of past states).
        MIN and MAX are watched to the end: each entry only moves one way among the values
        present, so they reach a fixed point. Other ops are watched for `_CYCLE_SEARCH`
        repetitions; returns how many repetitions are left (0 when done)."""
        touched = np.unique(np.concatenate((dst, src)))
        pairs = list(zip(dst.tolist(), src.tolist())) if dst.size <= _STEP_BODY else None

        def body() -> None:
            if pairs is None:
                self._alu_in_order(op, dst, src)
                return
            for d, s in pairs:
                self._write_acc(d, self._alu_op(op, self.acc[d], self.acc[s]))

        search = times if op in (AluOp.MIN, AluOp.MAX) else min(times, _CYCLE_SEARCH)
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
                new = _wrap_u64(a.view(np.uint64) + n.view(np.uint64) * np.int64(imm).view(np.uint64), width)
            elif op == AluOp.MUL:
                new = _wrap_u64(a.view(np.uint64) * _pow_u64(np.full(n.shape, imm, np.int64), n), width)
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
                new = _wrap_u64(a.view(np.uint64) + np.add.reduceat(terms, starts), width)
            elif op == AluOp.MUL:
                new = _wrap_u64(a.view(np.uint64) * np.multiply.reduceat(_pow_u64(b, c), starts), width)
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
            return _wrap(a << min(times, width), width)
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

    def _alu_op(self, op: AluOp, a: np.ndarray, b: np.ndarray | np.int64) -> np.ndarray:
        width = self.config.acc_width
        if op == AluOp.MIN:
            return np.minimum(a, b)
        if op == AluOp.MAX:
            return np.maximum(a, b)
        if op == AluOp.ADD:
            return _wrap(a + b, width)
        if op == AluOp.MUL:
            return _wrap(a * b, width)  # |a|, |b| < 2^31: the int64 product is exact
        if op == AluOp.SHR:
            amount = np.broadcast_to(np.asarray(b, np.int64), a.shape)
            right = a >> np.minimum(amount, width).clip(0)
            left = _wrap(a << np.minimum(-amount, width).clip(0), width)
            return np.where(amount >= 0, right, left)
        raise AssertionError(op)  # pragma: no cover
