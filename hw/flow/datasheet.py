"""The integration datasheet, generated per config: everything needed to put the
accelerator into a system without reading its source.

`datasheet(config)` renders Markdown from the definitions themselves: ports from
the top's Amaranth signature, clock and reset from Amaranth's default domain,
widths from the config and `gemforge.hw.gateware.axi`, read IDs from
`READ_CLIENTS`, burst limits from `max_burst_beats`, registers and counters from
`gemforge.hw.regmap`, the file format and relocation from `gemforge.hw.program`,
entry layouts from `gemforge.hw.config.ENTRY_LAYOUTS`, the assembler
syntax from `gemforge.hw.asm`'s tables and docstring, lint waivers from
`gemforge.hw.flow.verilog`, and the ISA from `gemforge.hw.isa_doc`. What only the
gateware's behaviour defines (no 4 KiB crossing, one read ID at a time, outstanding
transactions, what the counters include) is stated in prose, checked against the
gateware by reading it and, where a test can, by tests/hw/test_datasheet.py.
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import math
import re
import warnings

import numpy as np

from .. import asm, isa, program, regmap
from ..config import BUS_ADDR_BITS, ENTRY_LAYOUTS, AccelConfig, field_rules, load_config
from ..isa import insn_bits, insn_bytes
from ..isa_doc import _rst_to_md, _table, isa_reference

__all__ = ["datasheet", "register_reset", "top_ports", "entry_layouts", "verilator_flags"]


def datasheet(config: AccelConfig | str | None = None) -> str:
    """The Markdown integration datasheet for ``config`` (an `AccelConfig` or a preset name)."""
    config = load_config(config)
    sections = [
        _title(config),
        _configuration(config),
        _ports(config),
        _clock_reset(config),
        _widths(config),
        _tie_offs(config),
        _dram_master(config),
        _registers(config),
        _irq(),
        _counters(),
        _file_format(config),
        _relocation(config),
        _entries(config),
        _tensor_layouts(config),
        _assembler(config),
        _verilator(),
        _appendix_isa(config),
    ]
    return "\n\n".join(s.strip("\n") for s in sections) + "\n"


# ---------------------------------------------------------------------------- derived facts

@functools.lru_cache(maxsize=16)
def top_ports(config: AccelConfig) -> tuple[tuple[str, str, int, str], ...]:
    """Every port of the Verilog top: (name, "input"/"output", width, interface).

    The clock and reset are those Amaranth creates for the default ``sync`` domain;
    the rest are the `Accelerator` signature's members, flattened with ``__``
    between path parts (how `amaranth.back.verilog` names them)."""
    from amaranth.hdl import ClockDomain, Shape, UnusedElaboratable
    from amaranth.lib.wiring import In

    from ..gateware.top import Accelerator

    domain = ClockDomain("sync")
    ports = [(domain.clk.name, "input", 1, "clock"), (domain.rst.name, "input", 1, "reset")]
    gc.collect()        # earlier garbage is collected (and warns) outside the filter below
    with warnings.catch_warnings():
        # Only the top's signature is read; the top and the parts its constructor makes are
        # never elaborated, which Amaranth would otherwise report as unused when they go.
        warnings.simplefilter("ignore", UnusedElaboratable)
        top = Accelerator(config)
        members = list(top.signature.members.flatten())
        del top
        gc.collect()
    interfaces = {"m_axi": "AXI4 master (DRAM)", "s_axil": "AXI4-Lite slave (registers)", "irq": "interrupt"}
    for path, member in members:
        if member.is_port:
            direction = "input" if member.flow == In else "output"
            ports.append(("__".join(map(str, path)), direction, Shape.cast(member.shape).width,
                          interfaces.get(str(path[0]), str(path[0]))))
    return tuple(ports)


def register_reset(reg: regmap.Register) -> int:
    """A register's value after reset: the map's ``reset`` where it states one; otherwise
    the ID register reads `regmap.ID_MAGIC` and every other register (rw values, status,
    debug views, counters) resets to 0, as the gateware's signals all start at 0."""
    explicit = getattr(reg, "reset", None)
    if explicit is not None:
        return explicit
    return regmap.ID_MAGIC if reg.name == "ID" else 0


def entry_layouts(config: AccelConfig) -> dict[str, tuple[int, int, int]]:
    """(rows, columns, element bits) of each data buffer's entry (`AccelConfig.entry_layout`)."""
    return {buffer: config.entry_layout(buffer) for buffer in ENTRY_LAYOUTS}


def verilator_flags() -> list[str]:
    """The warning flags the generated Verilog needs under Verilator (`LINT_WAIVERS`)."""
    from .verilog import LINT_WAIVERS
    return [f"-Wno-{name}" for name in LINT_WAIVERS]


def _default(callable_, name):
    return inspect.signature(callable_).parameters[name].default


def _hex(value: int) -> str:
    return f"`{value:#010x}`" if value else "`0`"


def _paragraphs(doc: str | None) -> list[str]:
    return inspect.cleandoc(doc or "").split("\n\n")


# ---------------------------------------------------------------------------- sections

def _title(config: AccelConfig) -> str:
    from .verilog import TOP_NAME
    d = isa.derived(config)
    return "\n".join([
        f"# gemforge integration datasheet — config `{config.name}`",
        "",
        "Generated by `gemforge.hw.flow.datasheet` from the code's own definitions; do not edit. "
        f"Module `{TOP_NAME}` in `{TOP_NAME}.v`.",
        "",
        f"GEMM core {config.batch}×{config.block_in}×{config.block_out} ({d['macs_per_uop']} MACs per micro-op), "
        f"int{config.inp_width} × int{config.wgt_width} → int{config.acc_width} accumulators, "
        f"int{config.out_width} outputs; {config.bus_width}-bit DRAM bus; target clock {config.clock_mhz:g} MHz.",
    ])


def _configuration(config: AccelConfig) -> str:
    values = config.to_dict()
    rows = [(f"`{field}`", f"`{values[field]}`", allowed) if field in values else (field, "—", allowed)
            for field, allowed in field_rules()]
    return "\n".join([
        "## Configuration",
        "",
        "The fields this Verilog was generated from (`config.json` beside it) and what a config may hold in "
        "each; every width, depth and field below follows from them. `gemforge_params.h` beside it gives C "
        "code the fields, every derived parameter (entry bytes and depth of each buffer, instruction and "
        "micro-op bytes, arena alignment), the opcodes and each instruction and micro-op field's bit offset "
        "and width, as macros.",
        "",
        _table(("field", "this config", "allowed"), rows),
    ])


def _ports(config: AccelConfig) -> str:
    rows = [(f"`{name}`", direction, str(width), interface) for name, direction, width, interface in top_ports(config)]
    return "\n".join([
        "## Ports",
        "",
        "Port names are the interface name and the AXI signal name (lower case, as in the AXI "
        "specification) joined by a double underscore: `m_axi__araddr` is ARADDR of the DRAM master, "
        "`s_axil__wdata` WDATA of the register slave. The module has no parameters: each config "
        "is its own Verilog.",
        "",
        _table(("port", "direction", "width", "interface"), rows),
    ])


def _clock_reset(config: AccelConfig) -> str:
    from amaranth.hdl import ClockDomain
    domain = ClockDomain("sync")
    edge = {"pos": "rising", "neg": "falling"}[domain.clk_edge]
    kind = "asynchronous" if domain.async_reset else "synchronous"
    return "\n".join([
        "## Clock and reset",
        "",
        f"- **One clock**, `{domain.clk.name}`: every flip-flop and memory of the design, both AXI "
        f"interfaces and `irq` are in this one domain, on its {edge} edge. There is no clock-domain "
        "crossing inside; put one outside if the bus runs on another clock.",
        f"- **Reset** `{domain.rst.name}`: active high, **{kind}** (sampled on the {edge} edge of "
        f"`{domain.clk.name}`), one cycle is enough. It returns every register to its reset value "
        "(see Registers): idle, DONE clear, `irq` low, all queues and counters empty. The "
        "on-chip buffers' contents are not cleared.",
        "- The AXI reset (ARESETn) is active low: drive `rst` with its inverse, synchronised to "
        f"`{domain.clk.name}`.",
        f"- Timing target: {config.clock_mhz:g} MHz (`clock_mhz`, used by synthesis only).",
    ])


def _widths(config: AccelConfig) -> str:
    from ..gateware.axi import ADDR_BITS
    ports = {name: width for name, _, width, _ in top_ports(config)}
    rows = [
        ("DRAM data (`m_axi__wdata`, `m_axi__rdata`)",
         f"{ports['m_axi__wdata']} bits ({config.bus_bytes} bytes, `bus_width`)"),
        ("DRAM byte strobes (`m_axi__wstrb`)", f"{ports['m_axi__wstrb']} bits"),
        ("DRAM address (`m_axi__araddr`, `m_axi__awaddr`)", f"{ADDR_BITS} bits (bytes; a 4 GiB window)"),
        ("DRAM IDs (`m_axi__arid`, `m_axi__awid`, `m_axi__rid`, `m_axi__bid`)", f"{ports['m_axi__arid']} bits"),
        ("burst length (`m_axi__arlen`, `m_axi__awlen`)", f"{ports['m_axi__arlen']} bits (AXI4)"),
        ("register data (`s_axil__wdata`, `s_axil__rdata`)", f"{regmap.REG_BYTES * 8} bits"),
        ("register address (`s_axil__awaddr`, `s_axil__araddr`)",
         f"{ports['s_axil__awaddr']} bits (a {1 << ports['s_axil__awaddr']}-byte window)"),
        ("instruction", f"{insn_bits(config)} bits ({insn_bytes(config)} bytes)"),
        ("micro-op", f"{config.uop_bits} bits ({config.uop_entry_bytes} bytes)"),
    ]
    return "\n".join(["## Bus widths", "", _table(("what", "width"), rows)])


#: AXI4 and AXI4-Lite signals of the specification, with the value an interconnect
#: should see where the accelerator has no port for them (only the absent ones are listed).
_AXI4_SIGNALS = {
    "awlock": "0 (normal access)", "arlock": "0 (normal access)",
    "awcache": "`0b0011` (normal, non-cacheable, bufferable) or what the memory system needs; "
               "accesses are not coherent",
    "arcache": "`0b0011`, as AWCACHE",
    "awprot": "`0b000`, or `0b010` where DRAM is non-secure", "arprot": "as AWPROT",
    "awqos": "0", "arqos": "0", "awregion": "0", "arregion": "0",
    "awuser": "0 / absent", "aruser": "0 / absent", "wuser": "0 / absent",
    "buser": "ignore", "ruser": "ignore",
}
_AXI_LITE_SIGNALS = {"awprot": "ignored by the slave", "arprot": "ignored by the slave"}


def _bus_errors_checked() -> bool:
    """Whether the register map defines a fault for AXI error responses (the gateware then
    checks RRESP/BRESP and reports the ID)."""
    fault = getattr(regmap, "Fault", None)
    return fault is not None and "BUS_ERROR" in fault.__members__


def _tie_offs(config: AccelConfig) -> str:
    present = {name for name, _, _, _ in top_ports(config)}
    rows = [(f"DRAM master ({name.upper()})", value) for name, value in _AXI4_SIGNALS.items()
            if f"m_axi__{name}" not in present]
    rows += [(f"register slave ({name.upper()})", value) for name, value in _AXI_LITE_SIGNALS.items()
             if f"s_axil__{name}" not in present]
    if _bus_errors_checked():
        responses = ("`m_axi__rresp`, `m_axi__bresp`, `m_axi__rid` and `m_axi__bid` are used: an "
                     "error response (SLVERR, DECERR) ends the program with fault `BUS_ERROR`, "
                     "reporting the ID (see Registers). Only `s_axil__wstrb` is ignored (every "
                     "register write writes all 32 bits).")
    else:
        responses = ("Inputs that exist but are **ignored** (connect them; their value does not "
                     "matter): `m_axi__rresp` and `m_axi__bresp` (an error response is not detected), "
                     "`m_axi__rid` and `m_axi__bid` (see the read ordering under DRAM master "
                     "behaviour), `s_axil__wstrb` (every register write writes all 32 bits).")
    return "\n".join([
        "## AXI signals to tie off",
        "",
        "Signals of the AXI4 / AXI4-Lite specifications that the top has no port for; drive the "
        "interconnect's side with:",
        "",
        _table(("signal", "value"), rows),
        "",
        responses,
    ])


def _dram_master(config: AccelConfig) -> str:
    from ..gateware.axi import BURST_INCR
    from ..microarch import max_burst_beats
    from ..gateware.dma_write import DmaWriter
    from ..gateware.fetch import CHUNK
    from ..gateware.tile_load import TileLoader
    from ..microarch import READ_CLIENTS

    beats = max_burst_beats(config.bus_bytes)
    span = beats * config.bus_bytes
    size = config.bus_bytes.bit_length() - 1
    descriptions = {
        "fetch": f"instruction fetch, {CHUNK} instructions per request",
        "load_inp": "LOAD into the input buffer (load engine)",
        "load_wgt": "LOAD into the weight buffer (load engine)",
        "compute_acc": "LOAD into the accumulator buffer (compute engine)",
        "compute_uop": "LOAD into the micro-op buffer (compute engine)",
    }
    rows = [(str(i), f"`{name}`", descriptions.get(name, "")) for i, name in enumerate(READ_CLIENTS)]
    loader_depth = _default(TileLoader.__init__, "depth")
    responses = _default(DmaWriter.__init__, "responses")
    return "\n".join([
        "## DRAM master behaviour",
        "",
        f"- **Bursts**: INCR only (AxBURST = {BURST_INCR}); AxSIZE = {size} always (full "
        f"{config.bus_bytes}-byte beats, no narrow transfers); every address is beat-aligned.",
        f"- **Length**: at most **{beats} beats** ({span} bytes) per burst. A burst never crosses "
        f"a {span}-byte boundary, and {span} divides 4096, so **no burst crosses a 4 KiB "
        "boundary**.",
        "- **Byte lanes**: reads fetch whole beats (bytes of a beat outside the tile are read and "
        "dropped); writes enable only the tile's bytes with `wstrb`, so no byte outside a STORE's "
        "tile is written.",
        "- **Read IDs** (ARID = index of the read client):",
        "",
        _table(("ARID", "client", "reads"), rows),
        "",
        "- **Read ordering**: the AR and R channels belong to one client at a time (round-robin "
        "grant, held until that client's last R beat). So **reads of different IDs are never "
        "outstanding at the same time**, R data of one ID returns in order, and RID need not be "
        "checked. A client keeps the grant for several DMA commands while no other client asks.",
        "- **Outstanding reads**: the granted client issues AR for every burst of its accepted "
        f"commands as fast as ARREADY allows (a LOAD client accepts up to {loader_depth} "
        "commands ahead of its data); the master sets **no limit on the number of outstanding "
        "read bursts**: the slave limits them with ARREADY. RREADY may go low (backpressure).",
        f"- **Writes** (STORE only): AWID = 0 always, so write responses return in order. AW "
        "runs ahead of W and a burst's W beats never start before its AW handshake. Up to "
        f"{responses} bursts may await their write response (AW stalls beyond); BREADY is always "
        "high. A STORE retires (and pushes its token) only after its last write response.",
        "- **Read/write ordering**: reads and writes are independent channels; the accelerator "
        "orders them only through the program's dependency tokens (a LOAD that must see a "
        "STORE's data waits for the STORE's write response via tokens).",
        "- Accesses are not cache-coherent: the host writes back its caches before START and "
        "invalidates them after DONE.",
        f"- **Address space**: no request reaches byte {regmap.ADDRESS_TOP:#x} (2^{BUS_ADDR_BITS}) or "
        "beyond, and no address wraps to 0: a program that would run past it is refused at START "
        "(`PROGRAM_RANGE`), a LOAD or STORE tile that would is refused when it is dispatched "
        "(`DRAM_RANGE`), before any of it is read or written. An address below the top that the "
        "memory system does not map should be answered with SLVERR or DECERR (`BUS_ERROR`).",
        "- **After a fault or ABORT** no new AR or AW is raised; one whose VALID is already high "
        "stays high until accepted (AXI forbids withdrawing it) and that transaction completes. "
        "R beats and B responses are taken at once and the W beats of accepted writes are sent, "
        "so the drain lasts as long as the memory takes to answer what it accepted: ERROR rises "
        "at most 4 cycles after the later of the fault and the last response. With at most N "
        f"bursts in flight, each answered within L cycles of the previous one, that is at most "
        f"N × (L + {beats}) + 4 cycles, which a host's timeout allows for.",
    ])


def _registers(config: AccelConfig) -> str:
    rows = []
    for reg in regmap.REGISTERS:
        if reg.counter:
            continue
        rows.append((f"`{reg.offset:#06x}`", f"`{reg.name}`", reg.access, _hex(register_reset(reg)), reg.description))
    counter_regs = [r for r in regmap.REGISTERS if r.counter]
    ports = {name: width for name, _, width, _ in top_ports(config)}
    lines = [
        "## Registers",
        "",
        # The map's own account of a program's end; not the paragraph on how it is built.
        _rst_to_md("\n\n".join(p for p in _paragraphs(regmap.__doc__)[1:] if "`REGISTERS`" not in p)),
        "",
        "Access: `ro` read only (writes ignored), `rw` read/write, `wo` write-only strobe (reads "
        "return 0). The C header `gemforge_regs.h` next to this file has the same offsets.",
        "",
        _table(("offset", "name", "access", "reset", "description"), rows),
    ]
    if counter_regs:
        first, last = counter_regs[0].offset, counter_regs[-1].offset + regmap.REG_BYTES - 1
        lines += ["", f"Offsets `{first:#06x}`–`{last:#06x}` hold the 64-bit counters (see Counters; "
                      "`ro`, reset 0), two registers each."]
    fault_docs = getattr(regmap, "FAULT_DOCS", None)
    if fault_docs:
        lines += ["", "Fault codes (`ERROR` register):", "",
                  _table(("code", "fault", "cause; ERROR_INFO"), [(str(int(f)), f"`{f.name}`", doc)
                                                                 for f, doc in fault_docs.items()])]
    lines += [
        "",
        "Slave behaviour:",
        "",
        "- A write is accepted when AWVALID and WVALID are high together (AWREADY and WREADY rise "
        "in the same cycle), as AXI permits; a master must not wait for AWREADY before asserting "
        "WVALID. One write and one read are handled at a time.",
        "- Responses are always OKAY; reads of unmapped offsets return 0; address bits [1:0] are "
        f"ignored and only the {ports['s_axil__awaddr']} address bits on the port are decoded, "
        f"so the map repeats every {1 << ports['s_axil__awaddr']} bytes if the interconnect passes a "
        "larger window.",
    ]
    return "\n".join(lines)


def _irq() -> str:
    enable = regmap.by_name("IRQ_ENABLE")
    return "\n".join([
        "## Interrupt",
        "",
        f"`irq` is synchronous to the clock and made from registered state. `{enable.name}.ENABLE` "
        f"(`{enable.offset:#06x}`, bit 0): {enable.fields[0].doc}. The register's other bits are stored "
        "and read back but do nothing. There is no write-1-to-clear bit; polling `STATUS` works the same.",
    ])


def _counters() -> str:
    offsets: dict[str, list[regmap.Register]] = {}
    for reg in regmap.REGISTERS:
        if reg.counter:
            offsets.setdefault(reg.counter, []).append(reg)
    rows = []
    for name, doc in regmap.COUNTERS:
        lo, hi = offsets[name]
        rows.append((f"`{name}`", f"`{lo.name}` `{lo.offset:#06x}` / `{hi.name}` `{hi.offset:#06x}`", doc))
    return "\n".join([
        "## Counters",
        "",
        "64-bit, low word first. Every counter is cleared by START and counts only while BUSY "
        "(from the cycle after START to the end of the program); they hold their values "
        "afterwards, final in the cycle DONE rises (after a fault, the engine counters may add "
        "the drain's last cycles in the two cycles after ERROR rises). The two halves are separate "
        "reads: read them when BUSY is clear, or read "
        "HI, LO, HI and retry if HI changed.",
        "",
        _table(("counter", "registers", "counts"), rows),
        "",
        "Exact meaning of the engine counters:",
        "",
        "- `*_busy` **includes** the stall cycles: an engine is busy from taking an instruction "
        "until it retires, token waits (`*_token_stall`) and memory waits (`*_mem_stall`) "
        "included; every stall cycle is also a busy cycle. The load and store engines pipeline "
        "their instructions: busy counts a cycle once however many are in flight, and one "
        "instruction's token stall can fall in the same cycle as another's memory stall.",
        "- `insns_retired` counts **FINISH** too (it retires on the compute engine like any "
        "other instruction): after a complete run it equals `INSN_COUNT`.",
        "- `fetch_busy` counts while instructions remain to be dispatched; `gemm_active` and "
        "`alu_active` count micro-ops issued (one per cycle at most; an ALU MUL instruction, and an "
        "SHR by a register operand, issue one every second cycle), so `gemm_active` / "
        "`cycles` is the GEMM core's utilisation.",
    ])


def _sample_program(config: AccelConfig) -> program.Program:
    """A tiny program whose header shows every JSON field."""
    region = program.TensorRegion("x", 0, (1,), "int8")
    uop_offset = config.uop_entry_bytes
    return program.Program(config, [isa.Finish()], [isa.Uop(0, 0, 0)], uop_offset, 2 * uop_offset,
                           {"x": region}, {"x": np.zeros(region.shape, region.dtype)})


_HEADER_DOCS = {
    "config": "the `AccelConfig` the program was built for (a device refuses any other)",
    "n_insns": "instruction count",
    "n_uops": "micro-op count",
    "uop_offset": "byte offset of the micro-ops in the arena",
    "arena_bytes": "size of the arena the loader allocates",
    "tensors": "named arena regions: byte `offset`, `shape`, numpy `dtype`",
    "constants": "tensors whose contents follow the micro-ops, in this order: `name`, `nbytes`",
}


def _file_format(config: AccelConfig) -> str:
    paragraphs = _paragraphs(program.__doc__)
    start = next(i for i, p in enumerate(paragraphs) if p.startswith("File format"))
    fmt = paragraphs[start:]
    blob = _sample_program(config).to_bytes()
    hlen = int.from_bytes(blob[12:16], "little")
    header = json.loads(blob[16:16 + hlen])
    rows = [(f"`{key}`", _HEADER_DOCS.get(key, "")) for key in header]
    return "\n".join([
        "## Program file format",
        "",
        _rst_to_md("\n\n".join(fmt)),
        "",
        f"Magic `{program.MAGIC.decode()}`, format version {program.FORMAT_VERSION}; `u32` are "
        f"little-endian; the header is followed directly by the instruction section "
        f"({insn_bytes(config)} bytes per instruction, encoded as in the appendix) and the micro-op "
        f"section ({config.uop_entry_bytes} bytes per micro-op, packed "
        f"{' | '.join(f.name for f in isa.uop_fields(config))} from bit 0). Header fields:",
        "",
        _table(("JSON field", "meaning"), rows),
    ])


def _relocation(config: AccelConfig) -> str:
    align = program.arena_alignment(config)
    relocatable = next(p for p in _paragraphs(program.__doc__) if "relocatable" in p)
    rows = []
    for mnemonic in asm.mnemonics(config):
        if not mnemonic.startswith(("load.", "store.")):
            continue
        mem = isa.MemType[mnemonic.split(".")[1].upper()]
        if mnemonic.startswith("store.") and mem == isa.MemType.ACC:
            # A requantizing STORE writes output entries to DRAM, and `dram_base` counts those.
            for requant in (False, True):
                buffer = isa.Store(mem=mem, requant=requant, sram_base=0, dram_base=0, y_size=1, x_size=1,
                                   x_stride=1).dram_buffer
                rows.append((f"`{mnemonic}`" + (" with `requant`" if requant else " without `requant`"),
                             f"{config.entry_bytes(buffer)} bytes (`{buffer}` entries)"))
            continue
        rows.append((f"`{mnemonic}`", f"{config.entry_bytes(mem.buffer)} bytes (`{mem.buffer}` entries)"))
    return "\n".join([
        "## Loading and relocating a program",
        "",
        _rst_to_md(relocatable),
        "",
        "`dram_base` counts **entries of the buffer whose entries the transfer moves in DRAM**, not "
        "bytes (byte address = `dram_base` × entry bytes): the buffer read or written, except that "
        "a requantizing STORE writes output-buffer entries:",
        "",
        _table(("instruction", "`dram_base` unit"), rows),
        "",
        "A loader:",
        "",
        f"1. allocates `arena_bytes` (at least one alignment unit) at a DRAM address `A` that is a "
        f"multiple of **{align} bytes** (`arena_alignment`: 4 KiB, or more when an entry or the "
        "bus is larger);",
        "2. writes the micro-op section at `A + uop_offset` and each constant at `A + offset` of "
        "its tensor;",
        "3. adds `A / unit` to every LOAD's and STORE's `dram_base`, the unit from the table above (a "
        "loader that places one of the program's tensors elsewhere, e.g. a buffer the previous program "
        "wrote, instead sets the `dram_base` of the transfers inside that tensor's region to that "
        "buffer's address + their offset in the region, in the same unit), re-encodes the instructions and "
        f"writes them anywhere aligned to {insn_bytes(config)} bytes (the instruction size);",
        "4. writes `INSN_ADDR` (bytes) and `INSN_COUNT`, then START, and waits for DONE.",
    ])


def _entries(config: AccelConfig) -> str:
    from ..microarch import buffer_lanes
    rows = []
    for buffer, (nrows, ncols, bits) in entry_layouts(config).items():
        rows.append((f"`{buffer}`", f"{nrows} × {ncols}", f"int{bits}", str(config.entry_bytes(buffer)),
                     str(config.depth(buffer)), _per_beat(config, buffer, buffer_lanes(config, buffer)),
                     f"`[r][c]` at byte `(r·{ncols} + c)·{bits // 8}`"))
    uop = isa.uop_fields(config)
    positions, pos = [], 0
    for field in uop:
        positions.append(f"`{field.name}` [{pos + field.width - 1}:{pos}]")
        pos += field.width
    rows.append(("`uop`", "1 micro-op", f"{config.uop_bits}-bit word", str(config.uop_entry_bytes),
                 str(config.uop_depth), _per_beat(config, "uop", buffer_lanes(config, "uop")), ", ".join(positions)))
    return "\n".join([
        "## Buffer entries",
        "",
        "An entry is the tile one GEMM micro-op touches. DRAM holds entries in the same byte "
        "layout as SRAM: elements row-major, each little-endian two's complement. An entry wider "
        "than a bus beat occupies consecutive beats (first beat = low bytes); a narrower one "
        "occupies a lane of a beat (lane 0 = low bytes).",
        "",
        _table(("buffer", "entry shape", "element", "entry bytes", "depth (entries)",
                "entries per bus beat", "element / field position"), rows),
    ])


def _per_beat(config: AccelConfig, buffer: str, lanes: int) -> str:
    """Entries per bus beat, or beats per entry for an entry wider than the bus."""
    beats = config.entry_bytes(buffer) // config.bus_bytes
    return f"1 entry in {beats} beats" if beats > 1 else str(lanes)


def _tensor_layouts(config: AccelConfig) -> str:
    """The tiled layouts of the compiler's tensors (`compiler.backends.accel.layout`'s table)."""
    from gemforge.compiler.backends.accel import layout
    paragraphs = _paragraphs(layout.__doc__)
    table = next(p for p in paragraphs if p.lstrip().startswith("==="))
    lines = [ln for ln in table.splitlines() if ln.strip()]
    bounds, pos = [], 0
    for column in lines[0].split():            # column spans from the ===== rule
        start = lines[0].index(column, pos)
        bounds.append((start, start + len(column)))
        pos = start + len(column)
    cells = [[ln[a:b if i < len(bounds) - 1 else None].strip() for i, (a, b) in enumerate(bounds)]
             for ln in lines if not ln.lstrip().startswith("===")]
    header, rows = cells[0], [tuple(r.replace("``", "`") for r in row) for row in cells[1:]]
    after = paragraphs[paragraphs.index(table) + 1:]
    return "\n".join([
        "## Tensor layouts of compiled programs",
        "",
        f"The tensors of a program `gemforge compile-op` writes (its `.tensor` regions) hold data in "
        f"tiles of whole entries, B = {config.batch} (batch), BI = {config.block_in} (block_in), "
        f"BO = {config.block_out} (block_out):",
        "",
        _table(tuple(header), rows),
        "",
        _rst_to_md("\n\n".join(after)),
    ])


def _assembler(config: AccelConfig) -> str:
    paragraphs = _paragraphs(asm.__doc__)
    keep = []
    for p in paragraphs[1:]:
        if p.startswith("Every syntax table"):
            break
        keep.append(p)
    rows = []
    for name in asm.mnemonics(config):
        kind = asm._KINDS[name]
        order = asm._operand_order(kind, config)
        required = [f"`{f}`" for f in order if f not in kind.defaults]
        optional = [f"`{f}`={kind.defaults[f]}" for f in order if f in kind.defaults]
        tmpl = asm.template(name)
        flags = " ".join(f"`{f}`" for f in asm.legal_flags(name, config))
        rows.append((f"`{name}`", isa.engine_of(tmpl).value, flags,
                     " ".join(required) or "—", " ".join(optional) or "—"))
    # keep[0] ends with "::" before the docstring's example (for `default`), keep[1]; this
    # config's own example stands in its place.
    assert keep[0].endswith("::"), "asm's docstring no longer introduces its example"
    intro, keep = keep[0][:-1], keep[2:]
    return "\n".join([
        "## Assembler syntax (`gemforge asm` / `gemforge disasm`)",
        "",
        _rst_to_md(inspect.cleandoc(paragraphs[0])),
        "",
        _rst_to_md(intro),
        "",
        "```",
        example_source(config).rstrip(),
        "```",
        "",
        f"This one computes `y = (x · wᵀ) >> 3` for one `{config.batch}×{config.block_in}` input entry and one "
        f"`{config.block_out}×{config.block_in}` weight entry: `gemforge asm prog.s --config {config.name} -o "
        "prog.gfp` assembles it (the text's `.config` must match), and a loader runs it as "
        "\"Loading and relocating a program\" says, with `x` and `w` written into the arena first. "
        "The micro-ops reach the on-chip buffer only through a `load.uop` in the program; the "
        "loader puts them in DRAM.",
        "",
        _rst_to_md("\n\n".join(keep)),
        "",
        "Mnemonics for this config, each with the flags it accepts (bare words; the others are "
        "refused by the assembler and raise INVALID_INSTRUCTION in the hardware); fields are "
        "`name=value`, optional fields show their default, `None` meaning absent:",
        "",
        _table(("mnemonic", "engine", "flags", "required fields", "optional fields"), rows),
    ])


def example_source(config: AccelConfig) -> str:
    """Assembly text of a complete program for ``config``: micro-op, input and weight loads,
    a GEMM, an ALU shift and a STORE of the int8 result; every region aligned to every entry
    size (the datasheet's example, assembled and run by the tests)."""
    entry = {buffer: config.entry_bytes(buffer) for buffer in ("uop", "inp", "wgt", "out")}
    step = math.lcm(*entry.values())
    offset = {"x": step, "w": 2 * step, "y": 3 * step}
    rows = {name: entry_layouts(config)[buffer][:2] for name, buffer in (("x", "inp"), ("w", "wgt"), ("y", "out"))}
    dtype = {name: f"int{entry_layouts(config)[buffer][2]}" for name, buffer in (("x", "inp"), ("w", "wgt"),
                                                                               ("y", "out"))}

    def tile(mnemonic, buffer, tensor, flags=""):
        base = offset[tensor] // entry[buffer] if tensor else 0
        return f"{mnemonic}{flags} sram_base=0 dram_base={base} y_size=1 x_size=1 x_stride=1"
    return "\n".join([
        "; y = (x · wᵀ) >> 3 for one input entry and one weight entry",
        f".config {config.name} digest={config.digest}",
        ".uop_offset 0",
        f".arena_bytes {4 * step}",
        *(f".tensor {name} offset={offset[name]} shape={rows[name][0]}x{rows[name][1]} dtype={dtype[name]}"
          for name in ("x", "w", "y")),
        ".uop dst=0 src=0 wgt=0",
        tile("load.uop", "uop", None),
        tile("load.inp", "inp", "x"),
        tile("load.wgt", "wgt", "w", " push_next"),
        "gemm pop_prev overwrite uop_bgn=0 uop_end=1 iter_out=1 iter_in=1",
        "alu.shr push_next uop_bgn=0 uop_end=1 iter_out=1 iter_in=1 imm=3",
        tile("store.out", "out", "y", " pop_prev"),
        "finish",
    ]) + "\n"


def _verilator() -> str:
    from .verilog import LINT_WAIVERS, TOP_NAME
    flags = " ".join(verilator_flags())
    rows = [(f"`{name}`", reason) for name, reason in LINT_WAIVERS.items()]
    return "\n".join([
        "## Verilator flags",
        "",
        "The Verilog is plain Verilog-2005 from Amaranth/Yosys, one file, no timing constructs "
        "(no `--timing` needed). It triggers only these warnings, each waived for a reason that is "
        "not a design issue. Lint with `-Wall` and build with the same waivers (a plain build "
        "stops on some of these warnings too):",
        "",
        "```",
        f"verilator --lint-only -Wall --top-module {TOP_NAME} {flags} {TOP_NAME}.v",
        f"verilator --cc --top-module {TOP_NAME} {flags} {TOP_NAME}.v",
        "```",
        "",
        _table(("waiver", "reason"), rows),
        "",
        "(`-Wno-fatal` instead of the waivers also builds, printing the warnings.)",
        "",
        "Icarus Verilog simulates the file as Verilog-2005 (`iverilog -g2005`) or as SystemVerilog "
        "(`-g2012`, what cocotb's Icarus flow passes) alike: its combinational logic is continuous "
        "assignments and functions, with no `always @*` block that would need a time-0 event, so "
        "every output is defined from the first clock of reset on.",
    ])


def _appendix_isa(config: AccelConfig) -> str:
    text = isa_reference(config)
    demoted = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.MULTILINE)
    return "## Appendix: ISA reference\n\n" + demoted.split("\n", 1)[1].lstrip("\n")
