"""cocotb testbench: runs a batch of programs on the generated accelerator.

Loaded by the simulator (through `gemforge.sim.cosim.harness`), never imported
by users. The job file named by ``$GEMFORGE_COSIM_JOB`` lists the programs; the
DRAM contents come in and go out through the Verilog DRAM model's hex files,
so Python only touches the simulation to poke registers and to poll status
every `poll_cycles` cycles (no per-cycle callbacks). Before each program the
accelerator and the DRAM model are reset and the model reloads its input file,
so every program starts from the state a fresh simulation would have.

Results: one JSON line per program, appended to ``job["results"]`` as each
finishes: ``status`` ("done", "fault", "hang", "timeout" or "error"), ``fault`` and
``fault_info`` (the ERROR and ERROR_INFO registers, for "fault": the `Fault`
name and its detail), ``cycles``,
``counters`` (the register map's counters, or those ``job["counters"]`` names),
``debug`` (the debug registers, decoded, when the program did not finish),
``marks`` (for a program with marks, the counters the wrapper copied at each), ``oob``
and ``wall_s``.
"""

import json
import os
import shutil
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import First, RisingEdge, Timer
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from gemforge.hw.isa import TOKEN_QUEUES
from gemforge.sim.cosim.harness import MARK_COUNTERS
from gemforge.hw.regmap import (COUNTERS, CTRL_BITS, ENGINE_STATES, ENGINES, ID_MAGIC, STATUS_BITS, Fault, by_name,
                                token_field)

PERIOD_NS = 10


class Registers:
    """The register map (`gemforge.hw.regmap`) by name, over the DUT's AXI4-Lite slave.

    cocotbext-axi's master drives the ``s_axil__*`` ports; it sleeps between
    accesses, so an idle bus costs no Python per cycle.
    """

    def __init__(self, dut):
        bus = AxiLiteBus.from_prefix(dut, "s_axil", bus_separator="__")
        self.master = AxiLiteMaster(bus, dut.clk, dut.rst)

    async def write(self, name, value):
        await self.master.write_dword(by_name(name).offset, value & 0xFFFFFFFF)

    async def read(self, name):
        return await self.master.read_dword(by_name(name).offset)

    async def read_counter(self, name):
        lo = await self.read(f"{name.upper()}_LO")
        hi = await self.read(f"{name.upper()}_HI")
        return lo | hi << 32


async def read_debug(regs):
    """The debug registers, each split into its regmap bitfields (engine states by name)."""
    state_names = {v: k for k, v in ENGINE_STATES.items()}
    fields = {}
    for name in ("DEBUG_STATE", "DEBUG_CMDQ", "DEBUG_TOKENS_A", "DEBUG_TOKENS_B"):
        fields[name] = by_name(name).unpack(await regs.read(name))
    return {
        "engines": {e: state_names.get(fields["DEBUG_STATE"][e.upper()], "?") for e in ENGINES},
        "finish_retired": bool(fields["DEBUG_STATE"]["FINISH_RETIRED"]),
        "cmd_queue_levels": {name.lower(): level for name, level in fields["DEBUG_CMDQ"].items()},
        "tokens": {q.name: {**fields["DEBUG_TOKENS_A"], **fields["DEBUG_TOKENS_B"]}[token_field(q)]
                   for q in TOKEN_QUEUES},
        "fetched": await regs.read("DEBUG_FETCHED"),
        "retired": await regs.read_counter("insns_retired"),
    }


@cocotb.test()
async def run_programs(dut):
    with open(os.environ["GEMFORGE_COSIM_JOB"]) as f:
        job = json.load(f)
    # cocotb's clock is driven from C++ (GPI), not from Python coroutines.
    Clock(dut.clk, PERIOD_NS, unit="ns").start(start_high=False)
    dut.dump.value = 0
    dut.reload.value = 0
    regs = Registers(dut)
    if job.get("sequence"):
        await _run_sequence(dut, regs, job)
        return
    if job.get("session"):
        await _serve(dut, regs, job)
        return
    with open(job["results"], "a") as results:
        for k, program in enumerate(job["programs"]):
            result = {"status": "error", "message": "the testbench failed"}
            try:
                result = await _run_fresh(dut, regs, job, program, job["clear"] if k else None, k == 0)
            finally:
                results.write(json.dumps(result) + "\n")
                results.flush()
            if result.get("id_mismatch"):
                return           # not the accelerator: nothing else can run


async def _run_fresh(dut, regs, job, program, clear, first):
    """Run ``program`` from the state of a fresh simulation: the accelerator reset, the DRAM
    model reloaded, and (``clear``: the buffer-clearing program) the buffers zeroed; dump the
    DRAM to ``program["dram_out"]``. Returns its result."""
    await _reset_and_reload(dut, job, program)
    if first:
        ident = await regs.read("ID")
        if ident != ID_MAGIC:
            return {"status": "error", "message": f"ID register reads {ident:#x}, expected {ID_MAGIC:#x}",
                    "id_mismatch": True}
    await regs.write("IRQ_ENABLE", 1)
    if clear:
        # Memories survive reset: zero the buffers as a fresh simulation has
        # them, then reset again so the program starts as in a fresh one
        # (the DRAM model's random stalls restart from their seed too).
        status, _ = await _start_and_wait(dut, regs, clear, job)
        if status != "done":
            return {"status": status, "message": "the buffer-clearing program did not finish"}
        await _reset(dut)
        await regs.write("IRQ_ENABLE", 1)
    result = await _run(dut, regs, program, job)
    await _dump(dut)
    shutil.move(job["dram_out"], program["dram_out"])
    return result


async def _serve(dut, regs, job):
    """A session (`gemforge.sim.cosim.harness.Session`): run the programs the host sends one
    at a time, each from a fresh state, until it says to stop or is gone. Command ``k`` is
    the file ``command_k.json`` in the session folder (a program entry, plus ``clear``,
    ``max_cycles`` and ``watchdog_cycles``); its result goes to ``result_k.json``. Waiting
    for a command blocks the simulator, which has nothing else to do."""
    folder = job["session"]["folder"]
    host = job["session"]["host_pid"]
    k = 0
    while True:
        command_file = os.path.join(folder, f"command_{k}.json")
        waited = 0
        while not os.path.exists(command_file):
            if os.path.exists(os.path.join(folder, "stop")) or not _alive(host):
                return
            # Quick to answer a host that sends layer after layer, idle-cheap otherwise.
            time.sleep(min(0.02, 0.0005 * 2 ** min(waited, 6)))
            waited += 1
        with open(command_file) as f:
            command = json.load(f)
        result = {"status": "error", "message": "the testbench failed"}
        try:
            limits = {**job, "max_cycles": command["max_cycles"], "watchdog_cycles": command["watchdog_cycles"]}
            result = await _run_fresh(dut, regs, limits, command, command["clear"], k == 0)
        finally:
            scratch = os.path.join(folder, f"result_{k}.json.part")
            with open(scratch, "w") as f:
                json.dump(result, f)
            os.replace(scratch, os.path.join(folder, f"result_{k}.json"))   # whole, or not there
        k += 1


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _run_sequence(dut, regs, job):
    """Run ``job["sequence"]`` back to back on one DRAM image with no reset in between, as
    a host does: each entry's program starts when the previous one has ended (DONE or
    ERROR); an entry with ``abort_after`` writes CTRL.ABORT that many cycles after START.
    The DRAM is dumped once, after the last."""
    with open(job["results"], "a") as results:
        await _reset_and_reload(dut, job, job["sequence"][0])
        await regs.write("IRQ_ENABLE", 1)
        for entry in job["sequence"]:
            if entry.get("abort_after") is not None:
                await regs.write("INSN_ADDR", entry["insn_addr"])
                await regs.write("INSN_COUNT", entry["insn_count"])
                await regs.write("CTRL", 1 << CTRL_BITS["START"])
                for _ in range(entry["abort_after"]):
                    await RisingEdge(dut.clk)
                await regs.write("CTRL", 1 << CTRL_BITS["ABORT"])
                entry = {**entry, "insn_count": None}      # already started
            result = await _run(dut, regs, entry, job)
            results.write(json.dumps(result) + "\n")
            results.flush()
        await _dump(dut)
        shutil.move(job["dram_out"], job["sequence"][-1]["dram_out"])


async def _reset(dut):
    dut.rst.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


async def _reset_and_reload(dut, job, program):
    """Reset the accelerator and the DRAM model, then load the program's DRAM window."""
    shutil.copyfile(program["dram_in"], job["dram_in"])
    await _reset(dut)
    dut.reload.value = 1
    await RisingEdge(dut.clk)
    while not int(dut.reloaded.value):
        await RisingEdge(dut.clk)
    dut.reload.value = 0
    await RisingEdge(dut.clk)


async def _dump(dut):
    dut.dump.value = 1
    while not int(dut.dumped.value):
        await RisingEdge(dut.clk)
    dut.dump.value = 0


async def _run(dut, regs, program, job):
    """Run one program; its result (status, the counters, the debug state if it did not finish,
    and the counters at each of ``program["marks"]``)."""
    marks = program.get("marks") or []
    stamps: list[dict] = []
    dut.mark_at.value = marks[0] if marks else 0
    watcher = cocotb.start_soon(_watch_marks(dut, marks, stamps)) if marks else None
    try:
        status, wall = await _start_and_wait(dut, regs, program, job)
    finally:
        if watcher is not None and not watcher.done():
            watcher.cancel()
        dut.mark_at.value = 0
    # Each register read costs Python time: a regression names the counters it checks.
    names = job.get("counters") or [name for name, _ in COUNTERS]
    counters = {name: await regs.read_counter(name) for name in dict.fromkeys(["cycles", *names])}
    result = {"status": status, "cycles": counters["cycles"], "counters": counters,
              "oob": bool(int(dut.oob.value)), "wall_s": wall, "marks": stamps}
    if status == "fault":
        code = by_name("ERROR").unpack(await regs.read("ERROR"))["CODE"]
        result["fault"] = Fault(code).name if code in Fault._value2member_map_ else f"unknown code {code}"
        result["fault_info"] = await regs.read("ERROR_INFO")
    if status != "done":
        result["debug"] = await read_debug(regs)
    return result


async def _watch_marks(dut, marks, stamps):
    """Read the counters the wrapper copies at each mark (`harness.MARK_COUNTERS`): one wait
    per mark, none per cycle."""
    for k, mark in enumerate(marks):
        await RisingEdge(dut.mark_hit)
        stamps.append({name: int(getattr(dut, f"mark_{name}").value) for name in MARK_COUNTERS})
        if k + 1 < len(marks):
            dut.mark_at.value = marks[k + 1]


async def _start_and_wait(dut, regs, program, job):
    """START the program and wait for the IRQ (DONE or ERROR) or the watchdog: (status, seconds)."""
    t0 = time.perf_counter()
    if program["insn_count"] is not None:        # None: started by the caller
        await regs.write("INSN_ADDR", program["insn_addr"])
        await regs.write("INSN_COUNT", program["insn_count"])
        await regs.write("CTRL", 1 << CTRL_BITS["START"])
        await RisingEdge(dut.clk)        # DONE of an earlier program clears the cycle after START

    poll = job["poll_cycles"]
    status = "done"
    last_progress, idle_cycles, cycles = None, 0, 0
    while True:
        if not int(dut.irq.value):
            await First(RisingEdge(dut.irq), Timer(poll * PERIOD_NS, unit="ns"))
        if int(dut.irq.value):
            if (await regs.read("STATUS")) >> STATUS_BITS["ERROR"] & 1:
                status = "fault"
            break
        cycles = await regs.read_counter("cycles")
        progress = (await regs.read("DEBUG_FETCHED"),
                    await regs.read_counter("insns_retired"),
                    await regs.read_counter("dma_bytes_read"),
                    await regs.read_counter("dma_bytes_written"),
                    await regs.read_counter("gemm_active"),
                    await regs.read_counter("alu_active"))
        if progress == last_progress:
            idle_cycles += poll
            if idle_cycles >= job["watchdog_cycles"]:
                status = "hang"
                break
        else:
            last_progress, idle_cycles = progress, 0
        if cycles >= job["max_cycles"]:
            status = "timeout"
            break
    return status, time.perf_counter() - t0
