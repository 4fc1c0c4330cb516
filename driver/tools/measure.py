"""How the benchmarks time things, defined once for every section.

- `best_of`: the best of ``repeats`` calls of one function;
- `best_interleaved`: candidate and baseline in alternating rounds, each round after
  `WARM_UP_SECONDS` of untimed calls, so a slow moment of a shared machine hits both;
- `ort_session`: ONNX Runtime, the host baseline, on the same threads as gemforge's
  CPU kernels and without spinning idle threads;
- `roofline`: the best an accelerator program's work allows, the bound its cycles are
  compared with;
- `cosine`: how close an int8 network's output is to a reference's.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from gemforge.compiler.backends.cpu.runtime import cores

__all__ = ["WARM_UP_SECONDS", "best_of", "best_interleaved", "ort_session", "cores", "roofline", "cosine"]

#: Each block of timed calls starts with this much untimed running of the same call:
#: the other side's library threads (OpenBLAS, ONNX Runtime) stop spinning and the
#: cores' clocks settle before anything is timed.
WARM_UP_SECONDS = 0.05


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """The best time of ``repeats`` calls of ``fn``, and the last call's value."""
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def best_interleaved(fns: dict[str, Callable[[], Any]], rounds: int = 5, repeats: int = 5) -> dict[str, float]:
    """The best time of each function, measured in alternating rounds of ``repeats`` calls,
    each round after `WARM_UP_SECONDS` of untimed calls."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            warm_until = time.perf_counter() + WARM_UP_SECONDS
            while time.perf_counter() < warm_until:
                fn()
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def ort_session(model) -> Any:
    """An ONNX Runtime CPU session of ``model`` (an in-memory `onnx.ModelProto`)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = cores()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # Idle ORT threads would otherwise spin for a while after each run, taking the
    # cores from whatever is measured next (the interleaved candidate).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def roofline(program) -> dict[str, Any]:
    """The best utilization a program's work allows on an ideal machine: every engine
    busy all the time, reads and writes each at one beat per cycle on their own AXI
    channel, GEMM (multiply-accumulate and reset) and ALU micro-ops one per cycle on
    the shared compute pipeline (an ALU MUL's, or an SHR's by a register operand, one per
    `Timing.half_rate_interval` cycles). ``cycles`` is that machine's time: the larger of
    the compute pipeline's, the reads' and the writes'."""
    from gemforge.hw.isa import Alu, Gemm, Load, Store
    from gemforge.hw.timing import compute_cycles, timing_of
    c = program.config
    timing = timing_of(c)
    gemm = resets = alu = alu_cycles = read = write = 0
    for insn in program.instructions:
        if isinstance(insn, (Gemm, Alu)):
            uops = insn.uop_count
            if isinstance(insn, Alu):
                alu += uops
                alu_cycles += compute_cycles(insn, timing)
            else:
                gemm += uops
                resets += uops if insn.reset else 0
        elif isinstance(insn, Load):
            read += insn.y_size * insn.x_size * c.entry_bytes(insn.dram_buffer)
        elif isinstance(insn, Store):
            write += insn.y_size * insn.x_size * c.entry_bytes(insn.dram_buffer)
    beats_read, beats_written = -(-read // c.bus_bytes), -(-write // c.bus_bytes)
    bound = max(gemm + alu_cycles, beats_read, beats_written)
    return {"gemm_uops": gemm, "gemm_reset_uops": resets, "alu_uops": alu, "beats_read": beats_read,
            "beats_written": beats_written, "cycles": bound, "roofline": round((gemm - resets) / bound, 4)}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine similarity of two outputs, flattened, in float64."""
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
