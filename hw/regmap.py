"""The accelerator's control/status register map: the one definition.

Every register is 32 bits wide on the AXI4-Lite slave; 64-bit counters take
two consecutive registers (``_LO`` then ``_HI``). The gateware's register file
(`gemforge.hw.gateware.regfile`), the co-simulation driver, the Markdown page
and the C header are all produced from `REGISTERS` below, so an offset exists
in exactly one place.

Counters run only while the accelerator is busy (from START until DONE) and
are cleared by START.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Register", "REGISTERS", "COUNTERS", "ENGINE_STATES", "REG_BYTES", "ID_MAGIC",
    "by_name", "to_markdown", "to_c_header",
]

#: Bytes per register (the AXI4-Lite data width).
REG_BYTES = 4
#: Value of the read-only ID register ("GFG1"), so a driver can check it talks to gemforge.
ID_MAGIC = 0x47464731


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
        Register("CTRL", 0x04, "wo", "bit 0: START (clears DONE and the counters, starts fetching)"),
        Register("STATUS", 0x08, "ro", "bit 0: BUSY, bit 1: DONE (sticky until the next START)"),
        Register("IRQ_ENABLE", 0x0C, "rw", "bit 0: drive the interrupt line while DONE is set"),
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
    lines.append("")
    return "\n".join(lines)


def to_c_header(guard: str = "GEMFORGE_REGS_H") -> str:
    """The register map as a C header of ``#define`` offsets."""
    lines = ["/* gemforge register map: generated from gemforge.hw.regmap, do not edit. */",
             f"#ifndef {guard}", f"#define {guard}", "",
             f"#define GEMFORGE_ID_MAGIC 0x{ID_MAGIC:08x}u",
             "#define GEMFORGE_CTRL_START (1u << 0)",
             "#define GEMFORGE_STATUS_BUSY (1u << 0)",
             "#define GEMFORGE_STATUS_DONE (1u << 1)", ""]
    for reg in REGISTERS:
        lines.append(f"/* {reg.doc} ({reg.access}) */")
        lines.append(f"#define GEMFORGE_REG_{reg.name} 0x{reg.offset:04x}u")
    lines += ["", f"#endif /* {guard} */", ""]
    return "\n".join(lines)
