"""The accelerator's control/status register map: the one definition.

Every register is 32 bits wide on the AXI4-Lite slave; 64-bit counters take
two consecutive registers (``_LO`` then ``_HI``). The gateware's register file
(`gemforge.hw.gateware.regfile`), the co-simulation driver, the Markdown page
and the C header are all produced from `REGISTERS` below, so an offset exists
in exactly one place.

Counters run only while the accelerator is busy (from START until the program
ends) and are cleared by START.

A program ends either with DONE (FINISH retired, every engine idle, every token
queue empty) or with ERROR and a `Fault` code in the ERROR register: the
accelerator detects the fault, stops issuing bus requests, waits for the ones
in flight to complete, resets its engines and queues (not the registers, the
counters or the buffers' contents) and is idle again. The host's ABORT takes the
same path, so any program, however broken, ends without the reset pin. What the
program wrote before its fault stays in the buffers and DRAM (fsim, which stops at the
faulting instruction, may have written less); a micro-op beyond its buffer writes
nothing.

With several faulty instructions, the first in program order whose fault is found at
dispatch (everything but bus errors and micro-op indices) is reported; a bus error or a
micro-op index fault of an earlier instruction can be found first or later, depending on
timing, so which of two such faults is reported is not specified.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "Register", "REGISTERS", "COUNTERS", "ENGINE_STATES", "REG_BYTES", "ID_MAGIC",
    "Fault", "FAULT_DOCS", "DEADLOCK_CYCLES", "CTRL_BITS", "STATUS_BITS", "ERROR_INFO_WRITE",
    "by_name", "to_markdown", "to_c_header",
]

#: Bytes per register (the AXI4-Lite data width).
REG_BYTES = 4
#: Value of the read-only ID register ("GFG1"), so a driver can check it talks to gemforge.
ID_MAGIC = 0x47464731


#: Bits of CTRL (written) and STATUS (read), by name.
CTRL_BITS: dict[str, int] = {"START": 0, "ABORT": 1}
STATUS_BITS: dict[str, int] = {"BUSY": 0, "DONE": 1, "ERROR": 2, "ABORTING": 3}

#: A program is deadlocked when, for this many consecutive cycles, no engine made
#: progress (no instruction dispatched, started or retired, no token pushed or popped,
#: no buffer written, no micro-op issued) while no bus request or response was pending.
DEADLOCK_CYCLES = 1024


class Fault(enum.IntEnum):
    """Why a program ended with ERROR: the code in ERROR[7:0].

    The functional simulator raises the same fault for the same program
    (`gemforge.sim.fsim.FsimError.fault`), so a fault seen on the hardware can be
    reproduced and explained in fsim."""

    NONE = 0
    ABORTED = 1
    EMPTY_PROGRAM = 2
    MISALIGNED_PROGRAM = 3
    INVALID_INSTRUCTION = 4
    BUFFER_RANGE = 5
    FINISH_NOT_LAST = 6
    NO_FINISH = 7
    DEADLOCK = 8
    TOKEN_IMBALANCE = 9
    BUS_ERROR = 10


#: One line per fault: its cause, and what ERROR_INFO holds for it.
FAULT_DOCS: dict[Fault, str] = {
    Fault.NONE: "no fault",
    Fault.ABORTED: "the host wrote CTRL.ABORT while the accelerator was busy",
    Fault.EMPTY_PROGRAM: "START with INSN_COUNT = 0 (a program needs at least FINISH)",
    Fault.MISALIGNED_PROGRAM: "START with an INSN_ADDR that is not a multiple of the instruction size",
    Fault.INVALID_INSTRUCTION: "an instruction word does not decode (unknown opcode, buffer or ALU op, "
                               "non-zero bits above its fields, a dependency flag its engine lacks, "
                               "padding on a micro-op LOAD, an immediate without use_imm) or has a zero "
                               "DMA size or loop count; ERROR_INFO: the instruction's index",
    Fault.BUFFER_RANGE: "an instruction addresses entries beyond an on-chip buffer (a LOAD's or STORE's "
                        "tile, a micro-op range, or a micro-op's index plus its loop offsets); "
                        "ERROR_INFO: the instruction's index for LOAD, STORE and micro-op ranges "
                        "(checked at dispatch), all ones for micro-op indices (checked as they run)",
    Fault.FINISH_NOT_LAST: "FINISH is not the last of the INSN_COUNT instructions; ERROR_INFO: its index",
    Fault.NO_FINISH: "every instruction ran but none was FINISH",
    Fault.DEADLOCK: f"no engine could make progress for {DEADLOCK_CYCLES} cycles with no bus transfer "
                    "pending: an instruction waits for a dependency token that is never pushed, or "
                    "pushes into a full token queue",
    Fault.TOKEN_IMBALANCE: "FINISH retired but tokens were left in a queue, or instructions that "
                           "can never run were left behind",
    Fault.BUS_ERROR: "a DRAM read or write response was SLVERR or DECERR; ERROR_INFO: the AXI ID "
                     "in bits 2:0, bit 8 set for a write",
}

#: ERROR_INFO bit marking a write response (for `Fault.BUS_ERROR`).
ERROR_INFO_WRITE = 1 << 8


@dataclass(frozen=True)
class Register:
    """One 32-bit register.

    Attributes
    ----------
    name : str
        Upper-case name, used for the C macro and the driver.
    offset : int
        Byte offset from the slave's base.
    access : str
        ``"rw"`` (written by the host, read back), ``"wo"`` (write-only strobe) or ``"ro"``.
    doc : str
        One line of documentation.
    counter : str or None
        For the halves of a 64-bit counter, the counter's lower-case name.
    """

    name: str
    offset: int
    access: str
    doc: str
    counter: str | None = None


#: 64-bit event counters, in register order: (name, description).
COUNTERS: list[tuple[str, str]] = [
    ("cycles", "clock cycles from START to DONE"),
    ("fetch_busy", "cycles the fetch engine has instructions left to fetch"),
    ("fetch_mem_stall", "cycles fetch waits for the memory bus or instruction data"),
    ("fetch_queue_stall", "cycles fetch holds an instruction whose command queue is full"),
    ("load_busy", "cycles the load engine has an instruction in flight (popping, launching, "
                  "moving data or waiting to push; LOADs overlap)"),
    ("load_token_stall", "cycles the load engine waits to pop a token or its oldest finished LOAD waits "
                         "to push one"),
    ("load_mem_stall", "cycles the load engine waits for the memory bus or DRAM data"),
    ("compute_busy", "cycles the compute engine executes an instruction"),
    ("compute_token_stall", "cycles the compute engine waits to pop or push a dependency token"),
    ("compute_mem_stall", "cycles the compute engine waits for the memory bus or DRAM data"),
    ("store_busy", "cycles the store engine has an instruction in flight (popping, launching, "
                   "moving data, awaiting write responses or waiting to push; STOREs overlap)"),
    ("store_token_stall", "cycles the store engine waits to pop a token or its oldest finished STORE "
                          "waits to push one"),
    ("store_mem_stall", "cycles the store engine waits for the memory bus"),
    ("gemm_active", "cycles a GEMM micro-op enters the GEMM core"),
    ("gemm_reset", "cycles a GEMM reset micro-op enters the GEMM core (counted in gemm_active too; "
                   "it zeroes an accumulator and multiplies nothing)"),
    ("alu_active", "cycles an ALU micro-op enters the tensor ALU"),
    ("dma_bytes_read", "bytes read from DRAM (whole bus beats, including instructions)"),
    ("dma_bytes_written", "bytes written to DRAM (enabled byte lanes)"),
    ("insns_retired", "instructions completed by the load, compute and store engines"),
]

#: Engine state encodings shown in the DEBUG_STATE register (4 bits per engine).
ENGINE_STATES: dict[str, int] = {
    "idle": 0,      #: no command
    "pop": 1,       #: waiting to pop dependency tokens
    "exec": 2,      #: executing
    "drain": 3,     #: waiting for in-flight work (pipeline, write responses)
    "push": 4,      #: waiting to push dependency tokens
}


def _build() -> list[Register]:
    regs = [
        Register("ID", 0x00, "ro", f"identification, reads {ID_MAGIC:#010x} ('GFG1')"),
        Register("CTRL", 0x04, "wo",
                 "bit 0: START (when idle: clears DONE, ERROR and the counters, starts fetching; "
                 "ignored while BUSY); bit 1: ABORT (while BUSY: ends the program with fault ABORTED; "
                 "ignored when idle)"),
        Register("STATUS", 0x08, "ro",
                 "bit 0: BUSY; bit 1: DONE (the program completed); bit 2: ERROR (the program ended "
                 "with a fault, see ERROR); bit 3: ABORTING (a fault or ABORT is draining the bus). "
                 "DONE and ERROR are sticky until the next START"),
        Register("IRQ_ENABLE", 0x0C, "rw",
                 "bit 0: drive the interrupt line (level, active high) while DONE or ERROR is set; "
                 "START clears both, and writing 0 here lowers the line"),
        Register("INSN_ADDR", 0x10, "rw", "byte address of the first instruction (aligned to the instruction size)"),
        Register("INSN_COUNT", 0x14, "rw", "number of instructions to fetch"),
        Register("DEBUG_STATE", 0x18, "ro",
                 "engine states, 4 bits each: [3:0] fetch, [7:4] load, [11:8] compute, [15:12] store "
                 "(0 idle, 1 pop, 2 exec, 3 drain, 4 push); bit 16: FINISH retired"),
        Register("DEBUG_CMDQ", 0x1C, "ro",
                 "command-queue levels: [9:0] load, [19:10] compute, [29:20] store (saturating at 1023)"),
        Register("DEBUG_TOKENS_A", 0x20, "ro", "token counts: [15:0] load->compute, [31:16] compute->load"),
        Register("DEBUG_TOKENS_B", 0x24, "ro", "token counts: [15:0] compute->store, [31:16] store->compute"),
        Register("DEBUG_FETCHED", 0x28, "ro", "instructions fetched so far"),
        Register("ERROR", 0x2C, "ro",
                 "bits 7:0: the fault code of the last program that ended with ERROR ("
                 + ", ".join(f"{f.value} {f.name}" for f in Fault) + "); cleared by START"),
        Register("ERROR_INFO", 0x30, "ro", "detail of the fault (see the fault table); cleared by START"),
    ]
    offset = 0x40
    for name, doc in COUNTERS:
        regs.append(Register(f"{name.upper()}_LO", offset, "ro", f"{doc} (bits 31:0)", counter=name))
        regs.append(Register(f"{name.upper()}_HI", offset + 4, "ro", f"{doc} (bits 63:32)", counter=name))
        offset += 8
    return regs


#: Every register, in offset order.
REGISTERS: list[Register] = _build()
assert len({r.offset for r in REGISTERS}) == len(REGISTERS)


def by_name(name: str) -> Register:
    """The register called ``name`` (upper case)."""
    for reg in REGISTERS:
        if reg.name == name:
            return reg
    raise KeyError(f"no register {name!r}")


def address_bits() -> int:
    """Width of the AXI4-Lite address decoded by the slave."""
    return max(r.offset for r in REGISTERS).bit_length()


def to_markdown(title: str = "gemforge register map") -> str:
    """The register map as a Markdown page."""
    lines = [f"# {title}", "",
             "AXI4-Lite slave, 32-bit registers, byte offsets. 64-bit counters are two registers "
             "(low word first); counters are cleared by START and count while BUSY.", "",
             "| offset | name | access | description |", "| --- | --- | --- | --- |"]
    for reg in REGISTERS:
        lines.append(f"| `{reg.offset:#06x}` | `{reg.name}` | {reg.access} | {reg.doc} |")
    lines += ["", "## Faults", "",
              "A program that cannot complete ends with STATUS.ERROR and a code in ERROR; the "
              "accelerator drains the bus, resets its engines and is idle again (registers, counters "
              "and buffer contents are kept).", "",
              "| code | fault | cause |", "| --- | --- | --- |"]
    for fault in Fault:
        lines.append(f"| {fault.value} | `{fault.name}` | {FAULT_DOCS[fault]} |")
    lines.append("")
    return "\n".join(lines)


def to_c_header(guard: str = "GEMFORGE_REGS_H") -> str:
    """The register map as a C header of ``#define`` offsets."""
    lines = ["/* gemforge register map: generated from gemforge.hw.regmap, do not edit. */",
             f"#ifndef {guard}", f"#define {guard}", "",
             f"#define GEMFORGE_ID_MAGIC 0x{ID_MAGIC:08x}u",
             *(f"#define GEMFORGE_CTRL_{name} (1u << {bit})" for name, bit in CTRL_BITS.items()),
             *(f"#define GEMFORGE_STATUS_{name} (1u << {bit})" for name, bit in STATUS_BITS.items()),
             f"#define GEMFORGE_DEADLOCK_CYCLES {DEADLOCK_CYCLES}u",
             f"#define GEMFORGE_ERROR_INFO_WRITE 0x{ERROR_INFO_WRITE:x}u",
             *(f"#define GEMFORGE_FAULT_{f.name} {f.value}u" for f in Fault), ""]
    for reg in REGISTERS:
        lines.append(f"/* {reg.doc} ({reg.access}) */")
        lines.append(f"#define GEMFORGE_REG_{reg.name} 0x{reg.offset:04x}u")
    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)
