"""The accelerator's control/status register map: the one definition.

Every register is 32 bits wide on the AXI4-Lite slave; 64-bit counters take
two consecutive registers (``_LO`` then ``_HI``). The gateware's register file
(`gemforge.hw.gateware.regfile`), the co-simulation driver, the Markdown page
and the C header are all produced from `REGISTERS` below, so an offset exists
in exactly one place; so are the bitfields of a register (`Bitfield`, and the
`Register.layout` the gateware packs and the host unpacks them with).

Counters run only while the accelerator is busy (from START until the program
ends) and are cleared by START.

A program ends either with DONE (FINISH retired, every engine idle, every token
queue empty) or with ERROR and a `Fault` code in the ERROR register: the
accelerator detects the fault, stops issuing bus requests (an AR or AW whose VALID
was already raised stays raised until it is accepted, as AXI requires, and that
transaction then completes like the others), waits for the ones in flight to
complete, resets its engines and queues (not the registers, the counters or the
buffers' contents) and is idle again. While it drains, it takes every R beat and B
response at once and sends the W beats of the writes already accepted without waiting
on anything else, so the drain lasts as long as the memory system takes to answer what
it had accepted: ERROR rises at most 4 cycles after the later of the fault (or ABORT)
and the last of those responses. With a memory that holds at most N bursts in flight
and answers each within L cycles of the previous one, that is at most N × (L + B) + 4
cycles, B the longest burst's beats (see DRAM master behaviour); a host sizing its
timeout adds this to the program's expected run time (and DEADLOCK_CYCLES, below).
ABORTING reads 1 during the drain. ERROR and ERROR_INFO keep
the cause; the DEBUG registers, which show the engines and queues (DEBUG_STATE,
DEBUG_CMDQ and DEBUG_TOKENS a cycle late, being registered), then read as after
reset (but DEBUG_STATE.FINISH_RETIRED, and DEBUG_FETCHED after EMPTY_PROGRAM,
MISALIGNED_PROGRAM or PROGRAM_RANGE, which START refuses before fetching: it keeps the
previous program's count). A fault the watchdog
finds (DEADLOCK, NO_FINISH, and a TOKEN_IMBALANCE with work left behind) ends
the program DEADLOCK_CYCLES cycles after the last progress, so a host's timeout
must be longer than that. The host's ABORT takes the
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
from functools import cached_property
from typing import Iterable

from amaranth.lib import data

from .config import BUS_ADDR_BITS
from .isa import LOAD_ENGINE, PIPELINE, MemType, STORE_MEMS, TOKEN_QUEUES

__all__ = [
    "Register", "Bitfield", "REGISTERS", "COUNTERS", "ENGINE_STATES", "REG_BYTES", "ID_MAGIC",
    "Fault", "FAULT_DOCS", "DEADLOCK_CYCLES", "CTRL_BITS", "STATUS_BITS", "ERROR_INFO_WRITE",
    "ERROR_INFO_NO_INDEX", "ADDRESS_TOP",
    "ENGINES", "ENGINE_STATE_BITS", "CMDQ_LEVEL_BITS", "TOKEN_COUNT_BITS", "FAULT_CODE_BITS",
    "by_name", "token_field", "address_bits", "to_markdown", "to_c_header",
]

#: Bytes per register (the AXI4-Lite data width).
REG_BYTES = 4
#: Value of the read-only ID register ("GFG1"), so a driver can check it talks to gemforge.
ID_MAGIC = 0x47464731


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
    PROGRAM_RANGE = 11
    DRAM_RANGE = 12


#: The top of the accelerator's byte address space: AXI addresses are 32 bits, and no access
#: reaches this address or beyond (`Fault.PROGRAM_RANGE`, `Fault.DRAM_RANGE`).
ADDRESS_TOP = 1 << BUS_ADDR_BITS
#: ERROR_INFO of the micro-op index fault, which names no instruction (all 32 bits set).
ERROR_INFO_NO_INDEX = 0xFFFF_FFFF

_NO_INFO = "ERROR_INFO: 0"


def _names(mems) -> str:
    return ", ".join(m.buffer for m in mems)


def _others(mems) -> str:
    """The buffers not in ``mems``, and mem values that name no buffer."""
    return ", ".join(m.buffer for m in MemType if m not in mems) + " or a mem value naming no buffer"


#: One line per fault: its cause, and what ERROR_INFO holds for it. Faults found at START
#: (EMPTY_PROGRAM, MISALIGNED_PROGRAM, PROGRAM_RANGE) fetch nothing; faults found as an
#: instruction is dispatched (INVALID_INSTRUCTION, BUFFER_RANGE for LOAD, STORE and micro-op
#: ranges, DRAM_RANGE, FINISH_NOT_LAST) leave that instruction and every later one unrun.
FAULT_DOCS: dict[Fault, str] = {
    Fault.NONE: "no fault",
    Fault.ABORTED: f"the host wrote CTRL.ABORT while the accelerator was busy; {_NO_INFO}",
    Fault.EMPTY_PROGRAM: f"START with INSN_COUNT = 0 (a program needs at least FINISH); {_NO_INFO}",
    Fault.MISALIGNED_PROGRAM: "START with an INSN_ADDR that is not a multiple of the instruction size; "
                              f"{_NO_INFO}",
    Fault.INVALID_INSTRUCTION: "an instruction word does not decode: an unknown opcode or ALU op; non-zero "
                               "bits above its fields; a LOAD whose buffer is not one of "
                               f"{_names(LOAD_ENGINE)} ({_others(LOAD_ENGINE)}) or a STORE whose buffer is not "
                               f"one of {_names(STORE_MEMS)} ({_others(STORE_MEMS)}); a dependency flag its engine has no "
                               "token queue for; padding on a micro-op LOAD; an ALU immediate without use_imm; "
                               "a STORE with requant whose buffer is not acc, or with shift, relu or bias set "
                               "without requant, or bias_per_row or bias_base set without bias; or a zero DMA "
                               "size (y_size, x_size) or loop count (iter_out, iter_in). "
                               "ERROR_INFO: the instruction's index",
    Fault.BUFFER_RANGE: "an instruction addresses entries beyond an on-chip buffer (a LOAD's or STORE's "
                        "tile, a requantizing STORE's bias entries, a micro-op range — also an empty or "
                        "reversed one, uop_end ≤ uop_bgn —, or a micro-op's index plus its loop offsets); "
                        "ERROR_INFO: the instruction's index for LOAD, STORE and micro-op ranges "
                        f"(checked at dispatch), {ERROR_INFO_NO_INDEX:#x} (all 32 bits set) for micro-op "
                        "indices (checked as they run)",
    Fault.FINISH_NOT_LAST: "FINISH is not the last of the INSN_COUNT instructions; ERROR_INFO: its index",
    Fault.NO_FINISH: f"every instruction ran but none was FINISH (found by the watchdog, {DEADLOCK_CYCLES} "
                     f"cycles after the last one); {_NO_INFO}",
    Fault.DEADLOCK: f"no engine could make progress for {DEADLOCK_CYCLES} cycles with no bus transfer "
                    "pending: an instruction waits for a dependency token that is never pushed, or "
                    "pushes into a full token queue (once FINISH has retired, that wait is reported as "
                    f"TOKEN_IMBALANCE instead: work left behind); {_NO_INFO}",
    Fault.TOKEN_IMBALANCE: "FINISH retired but tokens were left in a queue (found once every engine is "
                           "idle), or instructions that can never run were left behind (found by the "
                           f"watchdog, after {DEADLOCK_CYCLES} cycles); {_NO_INFO}",
    Fault.BUS_ERROR: "a DRAM read or write response was SLVERR or DECERR (an address below the 4 GiB top "
                     "that the memory system does not map); ERROR_INFO: the AXI ID in bits 2:0, bit 8 set "
                     "for a write",
    Fault.PROGRAM_RANGE: "START with a program that runs past the 32-bit address space: INSN_ADDR + "
                         f"INSN_COUNT × the instruction size > {ADDRESS_TOP:#x} (checked before anything is "
                         f"fetched, so fetch never wraps to address 0); {_NO_INFO}",
    Fault.DRAM_RANGE: "a LOAD's or STORE's DRAM tile runs past the 32-bit address space: (dram_base + "
                      "(y_size − 1) · x_stride + x_size) · entry bytes > "
                      f"{ADDRESS_TOP:#x}, entries of the buffer its DRAM side moves (checked at dispatch, "
                      "so nothing of it is read or written and no address wraps to 0); "
                      "ERROR_INFO: the instruction's index",
}

#: ERROR_INFO bit marking a write response (for `Fault.BUS_ERROR`).
ERROR_INFO_WRITE = 1 << 8


@dataclass(frozen=True)
class Bitfield:
    """One field of a register, packed from bit 0 upwards in the order a register lists them."""

    name: str
    width: int
    doc: str = ""


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
    fields : tuple of Bitfield
        The register's bitfields (none: one 32-bit value); `layout` is their
        `amaranth.lib.data.StructLayout`, which the gateware packs the register with and
        the host decodes it with (`unpack`).
    """

    name: str
    offset: int
    access: str
    doc: str
    counter: str | None = None
    fields: tuple[Bitfield, ...] = ()

    @cached_property
    def layout(self) -> data.StructLayout:
        """The register's bitfields as a StructLayout of the whole register (the bits above the
        fields are ``_reserved_<bit>``: read as zero, ignored when written)."""
        members = {f.name: f.width for f in self.fields}
        bit = sum(f.width for f in self.fields)
        if bit > REG_BYTES * 8:
            raise ValueError(f"{self.name}'s fields take {bit} bits, more than a register's {REG_BYTES * 8}")
        if bit < REG_BYTES * 8:
            members[f"_reserved_{bit}"] = REG_BYTES * 8 - bit      # the layout is the whole register
        return data.StructLayout(members)

    @property
    def description(self) -> str:
        """The doc followed by each field: ``… Bits [0] BUSY — a program is running; …``."""
        parts, bit = [], 0
        for f in self.fields:
            span = f"[{bit}]" if f.width == 1 else f"[{bit + f.width - 1}:{bit}]"
            parts.append(f"{span} {f.name}" + (f" — {f.doc}" if f.doc else ""))
            bit += f.width
        return self.doc if not parts else f"{self.doc}. Bits {'; '.join(parts)}"

    def bits(self) -> dict[str, tuple[int, int]]:
        """Each named field's (lowest bit, width)."""
        return {name: (f.offset, f.width) for name, f in self.layout if not name.startswith("_reserved")}

    def unpack(self, value: int) -> dict[str, int]:
        """A value read from the register, split into its named fields."""
        return {name: value >> lo & ((1 << width) - 1) for name, (lo, width) in self.bits().items()}

    def pack(self, **fields: int) -> int:
        """The value with these named fields set (the rest zero); refuses unknown names and values
        that do not fit."""
        bits, value = self.bits(), 0
        for name, v in fields.items():
            if name not in bits:
                raise KeyError(f"{self.name} has no field {name!r}; it has {', '.join(bits) or 'none'}")
            lo, width = bits[name]
            if not 0 <= v < 1 << width:
                raise ValueError(f"{self.name}.{name} is {width} bits wide, so {v} does not fit")
            value |= v << lo
        return value


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


#: The engines DEBUG_STATE reports, in field order; widths of its and the other debug fields.
ENGINES = ("fetch", *(e.value for e in PIPELINE))
ENGINE_STATE_BITS = 4
CMDQ_LEVEL_BITS = 10
TOKEN_COUNT_BITS = 16
#: Width of the fault code in ERROR.
FAULT_CODE_BITS = 8


def token_field(queue) -> str:
    """DEBUG_TOKENS field name of a token queue: ``LOAD_TO_COMPUTE``."""
    return f"{queue.pusher.value}_TO_{queue.popper.value}".upper()


def _build() -> list[Register]:
    regs = [
        Register("ID", 0x00, "ro", f"identification, reads {ID_MAGIC:#010x} ('GFG1')"),
        Register("CTRL", 0x04, "wo", "control strobes", fields=(
            Bitfield("START", 1, "when idle: clears DONE, ERROR and the counters, starts fetching; ignored while BUSY"),
            Bitfield("ABORT", 1, "while BUSY: ends the program with fault ABORTED; ignored when idle (so START "
                                 "and ABORT written together when idle start the program)"))),
        Register("STATUS", 0x08, "ro", "DONE and ERROR are sticky until the next START", fields=(
            Bitfield("BUSY", 1, "a program is running"),
            Bitfield("DONE", 1, "the program completed"),
            Bitfield("ERROR", 1, "the program ended with a fault, see ERROR"),
            Bitfield("ABORTING", 1, "a fault or ABORT is draining the bus"))),
        Register("IRQ_ENABLE", 0x0C, "rw", "interrupt enable", fields=(
            Bitfield("ENABLE", 1, "drive the interrupt line (level, active high) while DONE or ERROR is set; "
                                  "START clears both, and writing 0 here lowers the line"),)),
        Register("INSN_ADDR", 0x10, "rw", "byte address of the first instruction (aligned to the instruction size); "
                                          "read at START, so a write while busy applies to the next program"),
        Register("INSN_COUNT", 0x14, "rw", "number of instructions to fetch; read at START, so a write while busy "
                                           "applies to the next program"),
        Register("DEBUG_STATE", 0x18, "ro", "engine states ("
                 + ", ".join(f"{v} {k}" for k, v in ENGINE_STATES.items()) + "), as they were the cycle before",
                 fields=(
            *(Bitfield(e.upper(), ENGINE_STATE_BITS, f"{e} engine state") for e in ENGINES),
            Bitfield("FINISH_RETIRED", 1, "FINISH has retired"))),
        Register("DEBUG_CMDQ", 0x1C, "ro", f"command-queue levels (saturating at {(1 << CMDQ_LEVEL_BITS) - 1}), "
                 "as they were the cycle before",
                 fields=tuple(Bitfield(e.value.upper(), CMDQ_LEVEL_BITS, f"the {e.value} engine's command queue")
                              for e in PIPELINE)),
        *(Register(f"DEBUG_TOKENS_{'AB'[i // 2]}", 0x20 + 4 * (i // 2), "ro", "dependency-token counts, as they were the "
                 "cycle before", fields=tuple(
            Bitfield(token_field(q), TOKEN_COUNT_BITS, f"tokens in the {q.name} queue")
            for q in TOKEN_QUEUES[i:i + 2])) for i in range(0, len(TOKEN_QUEUES), 2)),
        Register("DEBUG_FETCHED", 0x28, "ro", "instructions fetched and passed to their engines so far (one "
                 "that fails its decode check is not counted)"),
        Register("ERROR", 0x2C, "ro", "cleared by START", fields=(
            Bitfield("CODE", FAULT_CODE_BITS, "the fault code of the last program that ended with ERROR ("
                     + ", ".join(f"{f.value} {f.name}" for f in Fault) + ")"),)),
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
for _register in REGISTERS:
    _register.layout            # fields wider than the register are refused here, on import
del _register


def by_name(name: str) -> Register:
    """The register called ``name`` (upper case)."""
    for reg in REGISTERS:
        if reg.name == name:
            return reg
    raise KeyError(f"no register {name!r}")


#: Bit positions of CTRL (written) and STATUS (read), by name.
CTRL_BITS: dict[str, int] = {name: lo for name, (lo, _) in by_name("CTRL").bits().items()}
STATUS_BITS: dict[str, int] = {name: lo for name, (lo, _) in by_name("STATUS").bits().items()}


def address_bits(registers: Iterable[Register] | None = None) -> int:
    """Width of the AXI4-Lite byte address the slave decodes for ``registers`` (the whole map
    by default): every register's offset fits."""
    return max(r.offset for r in (REGISTERS if registers is None else registers)).bit_length()


def to_markdown(title: str = "gemforge register map") -> str:
    """The register map as a Markdown page."""
    lines = [f"# {title}", "",
             "AXI4-Lite slave, 32-bit registers, byte offsets. 64-bit counters are two registers "
             "(low word first); counters are cleared by START and count while BUSY.", "",
             "| offset | name | access | description |", "| --- | --- | --- | --- |"]
    for reg in REGISTERS:
        lines.append(f"| `{reg.offset:#06x}` | `{reg.name}` | {reg.access} | {reg.description} |")
    lines += ["", "## Faults", "",
              "A program that cannot complete ends with STATUS.ERROR and a code in ERROR; the "
              "accelerator drains the bus, resets its engines and is idle again (registers, counters "
              "and buffer contents are kept; the DEBUG registers show the reset engines).", "",
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
             f"#define GEMFORGE_DEADLOCK_CYCLES {DEADLOCK_CYCLES}u",
             f"#define GEMFORGE_ERROR_INFO_WRITE 0x{ERROR_INFO_WRITE:x}u",
             *(f"#define GEMFORGE_FAULT_{f.name} {f.value}u" for f in Fault), ""]
    for reg in REGISTERS:
        lines.append(f"/* {reg.description} ({reg.access}) */")
        lines.append(f"#define GEMFORGE_REG_{reg.name} 0x{reg.offset:04x}u")
        # Each bitfield: a one-bit field as its mask (GEMFORGE_STATUS_DONE), a wider one as
        # shift and mask (GEMFORGE_DEBUG_CMDQ_LOAD_SHIFT, ..._MASK, the mask in place).
        for name, (lo, width) in reg.bits().items():
            if width == 1:
                lines.append(f"#define GEMFORGE_{reg.name}_{name} (1u << {lo})")
            else:
                lines.append(f"#define GEMFORGE_{reg.name}_{name}_SHIFT {lo}u")
                lines.append(f"#define GEMFORGE_{reg.name}_{name}_MASK 0x{((1 << width) - 1) << lo:08x}u")
    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)
