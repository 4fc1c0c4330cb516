"""fsim: the bit-exact functional simulator, gemforge's executable ISA specification.

`Fsim` holds the on-chip state of one accelerator (the five buffers) and runs
instruction streams read from a DRAM image with the semantics documented in
`gemforge.hw.isa`. The three engines (load, compute, store), their command
queues and the four dependency-token queues are modelled with blocking
semantics, so a program whose tokens do not balance stops with a report of
each engine's next instruction and every token count instead of hanging.

Every instruction is executed as a whole with numpy: a GEMM gathers all its
micro-op operands at once and multiplies them in one batched product, so no
Python code runs per multiply-accumulate. An ALU loop runs in batches whose
result equals in-order execution (`gemforge.sim.alu_batching`): one that repeats
a chained body (2^28 repetitions of acc[1] += acc[0]; acc[0] += acc[1], say) is
not run repetition by repetition either: ADD and MUL take a matrix power, and
the other ops run until the values repeat.

The execution rules it enforces are those of the `gemforge.hw.isa` module
docstring. Internally the accumulator buffer is int64 holding values already
wrapped to ``acc_width`` bits.
"""

from __future__ import annotations

import collections
from collections.abc import Collection
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

from .alu_batching import AluBatching
from .integers import int_dtype, wrap

__all__ = [
    "Fsim", "AccessObserver", "FsimError", "DeadlockError", "OutOfBoundsError", "check_dispatch",
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


class AccessObserver:
    """Told what each instruction reads and writes as fsim executes it.

    ``where`` is a buffer ('inp', 'wgt', 'acc', 'out', 'uop') with entry indices, or
    'dram' with byte addresses, one row of bytes per row of the LOAD's or STORE's tile.
    Every access is reported where fsim's semantics make it, so an observer
    (`gemforge.sim.trace.Tracer`: the race check and mismatch locations of `gemforge
    regress`) follows a new instruction kind without knowing it. The base class ignores
    everything."""

    def executing(self, index: int, insn: Instruction) -> None:
        """Instruction ``index`` (program order) starts executing."""

    def read(self, where: str, indices: np.ndarray) -> None:
        """The instruction reads these entries or bytes."""

    def wrote(self, where: str, indices: np.ndarray, sources: tuple[str, np.ndarray] | None = None) -> None:
        """The instruction wrote these entries or bytes. A STORE gives its ``sources``: the
        buffer and the entries whose values the bytes hold, one row of entries per row of
        bytes."""


class Fsim(AluBatching):
    """On-chip state and instruction semantics of one accelerator instance.

    Parameters
    ----------
    config:
        The design point; buffer shapes and widths come from it.
    dram:
        The DRAM image (a 1-D uint8 array) that LOAD and STORE address and the
        instruction stream is read from. It is used in place, not copied.
    observer:
        Told every instruction's reads and writes (`AccessObserver`), or None.
    """

    def __init__(self, config: AccelConfig, dram: np.ndarray, observer: AccessObserver | None = None) -> None:
        if dram.dtype != np.uint8 or dram.ndim != 1:
            raise TypeError("dram must be a 1-D uint8 array")
        self.config = config
        self.dram = dram
        self.observer = observer
        c = config
        # Each data buffer holds entries of its layout (the accumulator's as int64, wrapped to
        # acc_width where the hardware wraps); `_dram_dtype` is one entry as DRAM stores it.
        self._dram_dtype: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        buffers = {}
        for buffer in ENTRY_LAYOUTS:
            rows, cols, bits = c.entry_layout(buffer)
            self._dram_dtype[buffer] = (int_dtype(bits), (rows, cols))
            buffers[buffer] = np.zeros((c.depth(buffer), rows, cols), np.int64 if buffer == "acc" else int_dtype(bits))
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

    def run(self, insn_address: int, insn_count: int, snapshots: Collection[int] = ()) -> dict[str, int]:
        """Run the ``insn_count`` instructions at byte ``insn_address`` until FINISH retires.

        Returns the counters of this run; ``self.snapshots`` has them as they stood when each
        instruction of ``snapshots`` (indices into the program) started, in the order those ran. Raises `DeadlockError` when no engine
        can make progress or the program ends unbalanced, `OutOfBoundsError` on
        a bad address, and `FsimError` for any other illegal program."""
        c = self.config
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.snapshots: list[dict[str, int]] = []
        snapshot_at = frozenset(snapshots)
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
                    if head.index in snapshot_at:
                        self.snapshots.append(dict(self.counters))
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
        if self.observer is not None:
            self.observer.executing(index, insn)
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

    def _entry_bytes(self, entries: np.ndarray, buffer: str) -> np.ndarray:
        """The byte addresses of a (y, x) block of DRAM entries of ``buffer``: one row of
        bytes per row of entries."""
        size = self.config.entry_bytes(buffer)
        rows = entries[:, :, None] * size + np.arange(size, dtype=np.int64)
        return rows.reshape(entries.shape[0], -1)

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
        self.out[indices] = wrap(values, self.config.out_width)
        if self.observer is not None:
            entries = np.arange(self.config.acc_depth)[indices]
            self.observer.wrote("acc", entries)
            self.observer.wrote("out", entries)

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
        if self.observer is not None:
            self.observer.read("dram", self._entry_bytes(entries, buffer))
        span = slice(insn.sram_base, insn.sram_base + total)
        if insn.mem == MemType.UOP:
            words = data.reshape(-1).astype(np.uint64)
            decoded = np.empty((words.size, 3), np.int64)
            pos = 0
            for col, f in enumerate(uop_fields(self.config)):
                decoded[:, col] = ((words >> np.uint64(pos)) & np.uint64((1 << f.width) - 1)).astype(np.int64)
                pos += f.width
            self._write_sram(buffer, span, decoded)
            return
        tile = np.zeros((rows, pitch) + data.shape[2:], np.int64)
        tile[insn.y_pad0:insn.y_pad0 + insn.y_size, insn.x_pad0:insn.x_pad0 + insn.x_size] = data
        tile = tile.reshape((total,) + data.shape[2:])
        if insn.mem == MemType.ACC:
            self._write_acc(span, tile)
        else:
            self._write_sram(buffer, span, tile)

    def _write_sram(self, buffer: str, span: slice, values: np.ndarray) -> None:
        """Write entries ``span`` of an input, weight or micro-op buffer."""
        self._sram(buffer)[span] = values
        if self.observer is not None:
            self.observer.wrote(buffer, np.arange(span.start, span.stop))

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
        if self.observer is not None:
            tile_entries = np.arange(insn.sram_base, insn.sram_base + count).reshape(entries.shape)
            self.observer.read(buffer, tile_entries.reshape(-1))
            self.observer.wrote("dram", self._entry_bytes(entries, insn.dram_buffer), (buffer, tile_entries))
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
            if self.observer is not None:
                self.observer.read("acc", rows)
            tile = wrap(tile + self.acc[rows][:, None], c.acc_width)
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
                self._write_acc(dst[last], wrap(self._products(src[last], wgt[last]), c.acc_width))
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
            sums = wrap(sums + wrap(chunk, c.acc_width) * repeat, c.acc_width)
            touched[dst] = True
        rows = np.flatnonzero(touched)
        self._write_acc(rows, wrap(self.acc[rows] + sums.reshape(self.acc.shape)[rows], c.acc_width))

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
        if self.observer is not None:
            self.observer.read("uop", np.arange(insn.uop_bgn, insn.uop_end))
        for lo in range(0, total, chunk):
            k = np.arange(lo, min(total, lo + chunk), dtype=np.int64)
            u, rest = k % n_uops, k // n_uops
            indices = [uops[u, col].copy() for col in range(len(fields))]
            for count, factors in reversed(levels):    # inner level first
                step = rest % count
                rest //= count
                for index, factor in zip(indices, factors):
                    index += step * factor
            if self.observer is not None:
                self._observe_loop_reads(insn, indices)
            yield tuple(indices), repeat

    def _observe_loop_reads(self, insn: Gemm | Alu, indices: list[np.ndarray]) -> None:
        """What a chunk of a loop's micro-ops reads: an ALU its destination and source
        accumulator entries; a GEMM its input and weight entries (none when it resets) and,
        when it accumulates, its destinations."""
        if isinstance(insn, Alu):
            dst, src = indices
            self.observer.read("acc", src)
            self.observer.read("acc", dst)
            return
        if insn.reset:
            return
        dst, src, wgt = indices
        self.observer.read("inp", src)
        self.observer.read("wgt", wgt)
        if not insn.overwrite:
            self.observer.read("acc", dst)

    def _alu_op(self, op: AluOp, a: np.ndarray, b: np.ndarray | np.int64) -> np.ndarray:
        width = self.config.acc_width
        if op == AluOp.MIN:
            return np.minimum(a, b)
        if op == AluOp.MAX:
            return np.maximum(a, b)
        if op == AluOp.ADD:
            return wrap(a + b, width)
        if op == AluOp.MUL:
            return wrap(a * b, width)  # |a|, |b| < 2^31: the int64 product is exact
        if op == AluOp.SHR:
            amount = np.broadcast_to(np.asarray(b, np.int64), a.shape)
            right = a >> np.minimum(amount, width).clip(0)
            left = wrap(a << np.minimum(-amount, width).clip(0), width)
            return np.where(amount >= 0, right, left)
        raise AssertionError(op)  # pragma: no cover
