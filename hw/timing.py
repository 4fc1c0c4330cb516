"""The accelerator's timing: what each step of an instruction costs on the gateware, in cycles.

One definition of the microarchitecture's latencies for everything that predicts run time:
the cycle model (`gemforge.sim.cycle_model`, which replays a program through these
latencies) and the compiler's tiling planner (`gemforge.compiler.ops.accel.common.TilingCost`,
a closed-form simplification that uses the per-instruction totals `LOAD_FIXED` and
`COMPUTE_FIXED`).

The figures describe the gateware of `gemforge.hw.gateware` against the co-simulation DRAM
(`gemforge.sim.cosim.dram_model`: a read burst's first beat two cycles after its address, no
stalls), measured on Verilator with `python -m gemforge.driver.tools.rtl_perf` and by calibrating
the cycle model against whole programs (`gemforge bench --sections cycle_model`). A change to
the pipelines, the DMA engines or the arbiter changes them; the calibration benchmark says by
how much the model then misses.
"""

from __future__ import annotations

from dataclasses import dataclass

from .isa import Alu, AluOp, insn_bytes
from .microarch import PENDING_PUSHES, max_burst_beats

__all__ = ["Timing", "timing_of", "compute_cycles", "issues_at_half_rate", "LOAD_FIXED", "COMPUTE_FIXED", "FETCH_CHUNK"]

#: Cycles a LOAD costs beyond its data beats when it cannot overlap the previous one
#: (issue, arbitration, DRAM latency, the last entry written, the push), from runs of 1 and 101
#: back-to-back LOADs (`rtl_perf.dma_insn_fixed_cycles`, `default`).
LOAD_FIXED = 12
#: Cycles a GEMM or ALU instruction costs beyond its micro-ops: dispatch and the seven-stage
#: compute pipeline's drain (`rtl_perf` ``gemm_insn_fixed_cycles``, 11.54 on `tiny`).
COMPUTE_FIXED = 11
#: Instructions fetch reads per burst (its local queue holds two such chunks).
FETCH_CHUNK = 16


@dataclass(frozen=True)
class Timing:
    """Latencies of one config's gateware, in cycles (the cycle model's parameters).

    Read channel: a client is granted the AXI read channels ``read_grant`` cycles after its
    request is seen (``request_latency`` after it asks) and the channels are free, and
    keeps them until its last beat (`gemforge.hw.gateware.arbiter`); its first beat arrives
    ``read_latency`` cycles after the grant. Commands of the granted client chain under the
    grant while no other client asks, paying ``chain_gap`` instead of the grant and latency.
    A burst (at most `max_burst_beats`, one per row at least) streams a beat per cycle but
    takes at least ``burst_issue`` cycles (the burst generator's rate).
    """

    bus_bytes: int
    insn_bytes: int
    cmd_queue_depth: int
    token_queue_depth: int
    max_burst: int
    #: LOADs and STOREs launched and not yet pushed (`gemforge.hw.gateware.engine.PENDING_PUSHES`)
    pending_pushes: int
    #: command-queue write to the engine seeing it (a buffered FIFO)
    queue_latency: int = 2
    #: fetch: a fetched word's register stages and check (`InsnChecker.LATENCY`) before its queue
    fetch_check: int = 4
    #: engine states: IDLE takes the word, POP pops, LAUNCH/EXEC starts
    take_to_pop: int = 1
    pop_to_exec: int = 1
    #: a push is performed this many cycles after its instruction's work ends
    push_after: int = 1
    read_grant: int = 2
    #: a client's request reaches the arbiter's grant logic this many cycles after it asks
    #: (registered there: `gemforge.hw.gateware.arbiter`); a request already waiting when the
    #: channels come free is granted ``read_grant`` cycles after that
    request_latency: int = 1
    read_latency: int = 3
    chain_gap: int = 1
    burst_issue: int = 2
    #: a LOAD's last beat to the tile written (and its pending push ready)
    load_write: int = 2
    #: a STORE's launch to its first W beat, and its last W beat to the write response
    store_issue: int = 5
    write_response: int = 3
    #: GEMM/ALU: every cycle an instruction costs beyond its micro-ops, its take, pop and push
    #: included (the rest is dispatch into the pipeline and its drain)
    compute_fixed: int = COMPUTE_FIXED
    #: an instruction `issues_at_half_rate` issues a micro-op every this many cycles (an ALU
    #: MUL's product is registered before the final add, and an SHR's shift by a register
    #: operand is decoded a cycle ahead: both too late for the next micro-op's forward,
    #: `gemforge.hw.gateware.pipeline`)
    half_rate_interval: int = 2
    #: micro-op and accumulator LOADs of the compute engine: the last beat to the entries written
    compute_load_write: int = 1
    #: FINISH retiring to DONE
    finish: int = 2


def issues_at_half_rate(insn) -> bool:
    """Whether the compute pipeline issues ``insn``'s micro-ops ``half_rate_interval`` apart:
    an ALU MUL (immediate or register operand), and an ALU SHR by a register operand (by an
    immediate, as requantization shifts, it runs at full rate)."""
    return isinstance(insn, Alu) and (insn.op == AluOp.MUL or (insn.op == AluOp.SHR and insn.imm is None))


def compute_cycles(insn, timing: Timing) -> int:
    """The micro-op cycles of a GEMM or ALU instruction ``insn``: from its first micro-op's
    issue to the cycle after its last (`issues_at_half_rate`: ``half_rate_interval`` apart);
    the rest of the instruction is ``compute_fixed``."""
    if issues_at_half_rate(insn):
        return (insn.uop_count - 1) * timing.half_rate_interval + 1
    return insn.uop_count


def timing_of(config) -> Timing:
    """The `Timing` of ``config``'s gateware."""
    return Timing(bus_bytes=config.bus_bytes, insn_bytes=insn_bytes(config),
                  cmd_queue_depth=config.cmd_queue_depth, token_queue_depth=config.token_queue_depth,
                  max_burst=max_burst_beats(config.bus_bytes), pending_pushes=PENDING_PUSHES)
