"""The UART-to-bus bridge: a command protocol over a byte stream.

The host sends commands; the bridge answers each one (but NOP) with a status
byte, followed by data for reads. All multi-byte fields are little-endian.
The opcodes, status codes and sizes are defined once, in
`gemforge.hw.board.protocol`; tests/hw/test_board.py checks this table against
them.

Commands: every command but NOP is 9 bytes, ``opcode  address:u32  argument:u32``,
then the payload for WRITE_MEM.

========  ======  ================  ============  =========================  ===================================
opcode    value   address           argument      host sends after header    bridge answers
========  ======  ================  ============  =========================  ===================================
NOP       0x00    (none: 1 byte)    (none)        nothing                    nothing
PING      0x01    ignored           ignored       nothing                    OK, magic ``0x31424647`` (u32),
                                                                             memory size in bytes (u32)
WRITE_MEM 0x02    byte address      byte count    ``count`` bytes            status (after the payload)
READ_MEM  0x03    byte address      byte count    nothing                    status, then ``count`` bytes if OK
WRITE_REG 0x04    register offset   value         nothing                    status (after the AXI4-Lite B)
READ_REG  0x05    register offset   ignored       nothing                    status, then the value (u32) if OK
ZERO_MEM  0x06    byte address      byte count    nothing                    status (after ``count`` zero bytes
                                                                             are written, one per clock cycle)
========  ======  ================  ============  =========================  ===================================

Status bytes:

==========  ======  ==========================================================================
status      value   meaning
==========  ======  ==========================================================================
OK          0xA0    done
BAD_OPCODE  0xE1    unknown opcode; its 8 header bytes were consumed, nothing else
RANGE       0xE2    ``address + count`` beyond the memory (WRITE_MEM still consumes its payload;
                    nothing is written), or a register offset beyond the map or not a multiple of 4
BUS_ERROR   0xE3    the register slave answered SLVERR or DECERR
TIMEOUT     0xE4    the command was abandoned: no byte arrived for IDLE_TIMEOUT_BYTES byte times
==========  ======  ==========================================================================

Errors never hang the bridge: every command ends with a status, and a partial
command (a lost byte, a host that died mid-frame) ends with TIMEOUT after the
line has been idle for `IDLE_TIMEOUT_BYTES` byte times.

**Resynchronizing.** A host that has lost track (a timeout on its side, an
unexpected byte) stays silent for longer than the idle timeout, discards what
it has received, and sends PING until the answer is ``OK`` + magic. Zero bytes
(NOP) are ignored between commands, so a host may pad with them freely.

The bridge is an AXI4-Lite master on the accelerator's register slave and
uses the board memory's byte port (`gemforge.hw.board.memory`); it moves one
byte per cycle, far faster than the UART.
"""

from amaranth import *
from amaranth.lib import stream
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..gateware.axi import RESP_OKAY, AxiLiteSignature
from ..gateware.checked import CheckedComponent
from .memory import BytePortSignature
from .protocol import BRIDGE_MAGIC, HEADER_BYTES, Opcode, Status

__all__ = ["Bridge"]


class Bridge(CheckedComponent):
    """Parameters
    ----------
    mem_bytes : int
        Size of the memory behind ``mem`` (a power of two).
    reg_addr_bits : int
        Address width of the register slave behind ``axil``.
    timeout_cycles : int
        Clock cycles without a byte after which a partial command is abandoned.

    Attributes
    ----------
    rx : In(stream.Signature(8))
        Bytes from the host.
    tx : Out(stream.Signature(8))
        Bytes to the host.
    axil : Out(AxiLiteSignature(reg_addr_bits))
    mem : Out(BytePortSignature(log2(mem_bytes)))
    busy : Out(1)
        A command is in progress.
    error : Out(1)
        The last status sent was not OK.
    """

    @classmethod
    def check_arguments(cls, mem_bytes, reg_addr_bits, timeout_cycles):
        if not isinstance(mem_bytes, int) or mem_bytes < 2 or mem_bytes & (mem_bytes - 1):
            raise ValueError(f"Memory size must be a power of two of at least 2 bytes, not {mem_bytes!r}")
        if not isinstance(timeout_cycles, int) or timeout_cycles < 1:
            raise ValueError(f"Timeout must be a positive number of cycles, not {timeout_cycles!r}")

    def __init__(self, mem_bytes, reg_addr_bits, timeout_cycles):
        self._mem_bytes = mem_bytes
        self._timeout_cycles = timeout_cycles
        super().__init__({
            "rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
            "axil": Out(AxiLiteSignature(reg_addr_bits)),
            "mem": Out(BytePortSignature(exact_log2(mem_bytes))),
            "busy": Out(1), "error": Out(1),
        })

    @property
    def mem_bytes(self):
        return self._mem_bytes

    def elaborate(self, platform):
        m = Module()
        rx, tx, axil, mem = self.rx, self.tx, self.axil, self.mem
        reg_bits = len(axil.awaddr)

        opcode = Signal(8)
        head = Signal(8 * (HEADER_BYTES - 1))
        got = Signal(range(HEADER_BYTES))
        address, argument = head[:32], head[32:]
        ptr = Signal(32)
        left = Signal(32)
        range_error = Signal()
        answer = Signal(8 * 9)            # status and up to 8 data bytes, sent from bit 0
        answer_bytes = Signal(range(10))
        then_stream = Signal()            # after the answer, stream READ_MEM data
        aw_done, w_done = Signal(), Signal()
        idle = Signal(range(self._timeout_cycles + 1))
        timed_out = idle == self._timeout_cycles

        def respond(status, data=None, nbytes=0):
            status = Const(status, 8) if isinstance(status, int) else status
            m.d.sync += [answer.eq(Cat(status, data) if data is not None else status),
                         answer_bytes.eq(1 + nbytes), then_stream.eq(0), self.error.eq(status != Status.OK)]
            m.next = "ANSWER"

        mem_ok = (address + argument) <= self._mem_bytes          # 33-bit sum: no wrap-around
        reg_ok = (address[reg_bits:] == 0) & (address[:2] == 0)

        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid & (rx.payload != Opcode.NOP)):
                    m.d.sync += [opcode.eq(rx.payload), got.eq(0)]
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += [head.eq(Cat(head[8:], rx.payload)), got.eq(got + 1)]
                    with m.If(got == HEADER_BYTES - 2):
                        m.next = "DISPATCH"
                with m.Elif(timed_out):
                    respond(Status.TIMEOUT)
            with m.State("DISPATCH"):
                m.d.sync += [ptr.eq(address), left.eq(argument), range_error.eq(~mem_ok), aw_done.eq(0),
                             w_done.eq(0)]
                with m.Switch(opcode):
                    with m.Case(Opcode.PING):
                        respond(Status.OK, Cat(C(BRIDGE_MAGIC, 32), C(self._mem_bytes, 32)), 8)
                    with m.Case(Opcode.WRITE_MEM):
                        with m.If(argument == 0):
                            respond(Mux(mem_ok, Status.OK, Status.RANGE))
                        with m.Else():
                            m.next = "WRITE_MEM"
                    with m.Case(Opcode.READ_MEM):
                        with m.If(~mem_ok):
                            respond(Status.RANGE)
                        with m.Else():
                            respond(Status.OK)
                            m.d.sync += then_stream.eq(argument != 0)
                    with m.Case(Opcode.ZERO_MEM):
                        with m.If(~mem_ok | (argument == 0)):
                            respond(Mux(mem_ok, Status.OK, Status.RANGE))
                        with m.Else():
                            m.next = "ZERO_MEM"
                    with m.Case(Opcode.WRITE_REG):
                        with m.If(reg_ok):
                            m.next = "REG_WRITE"
                        with m.Else():
                            respond(Status.RANGE)
                    with m.Case(Opcode.READ_REG):
                        with m.If(reg_ok):
                            m.next = "REG_READ"
                        with m.Else():
                            respond(Status.RANGE)
                    with m.Default():
                        respond(Status.BAD_OPCODE)
            with m.State("ANSWER"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(answer[:8])]
                with m.If(tx.ready):
                    m.d.sync += [answer.eq(answer[8:]), answer_bytes.eq(answer_bytes - 1)]
                    with m.If((answer_bytes == 1) & then_stream):
                        m.next = "READ_MEM"
                    with m.Elif(answer_bytes == 1):
                        m.next = "IDLE"
            with m.State("WRITE_MEM"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.comb += [mem.addr.eq(ptr), mem.w_data.eq(rx.payload), mem.w_en.eq(~range_error)]
                    m.d.sync += [ptr.eq(ptr + 1), left.eq(left - 1)]
                    with m.If(left == 1):
                        respond(Mux(range_error, Status.RANGE, Status.OK))
                with m.Elif(timed_out):
                    respond(Status.TIMEOUT)
            with m.State("ZERO_MEM"):
                m.d.comb += [mem.addr.eq(ptr), mem.w_data.eq(0), mem.w_en.eq(1)]
                m.d.sync += [ptr.eq(ptr + 1), left.eq(left - 1)]
                with m.If(left == 1):
                    respond(Status.OK)
            with m.State("READ_MEM"):
                m.d.comb += [mem.addr.eq(ptr), mem.r_en.eq(1)]
                m.next = "READ_MEM_SEND"
            with m.State("READ_MEM_SEND"):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(mem.r_data)]
                with m.If(tx.ready):
                    m.d.sync += [ptr.eq(ptr + 1), left.eq(left - 1)]
                    with m.If(left == 1):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "READ_MEM"
            with m.State("REG_WRITE"):
                m.d.comb += [axil.awaddr.eq(address), axil.awvalid.eq(~aw_done), axil.wdata.eq(argument),
                             axil.wstrb.eq(0xF), axil.wvalid.eq(~w_done)]
                aw_now = aw_done | axil.awready
                w_now = w_done | axil.wready
                m.d.sync += [aw_done.eq(aw_now), w_done.eq(w_now)]
                with m.If(aw_now & w_now):
                    m.next = "REG_WRITE_RESP"
            with m.State("REG_WRITE_RESP"):
                m.d.comb += axil.bready.eq(1)
                with m.If(axil.bvalid):
                    respond(Mux(axil.bresp == RESP_OKAY, Status.OK, Status.BUS_ERROR))
            with m.State("REG_READ"):
                m.d.comb += [axil.araddr.eq(address), axil.arvalid.eq(1)]
                with m.If(axil.arready):
                    m.next = "REG_READ_DATA"
            with m.State("REG_READ_DATA"):
                m.d.comb += axil.rready.eq(1)
                with m.If(axil.rvalid):
                    with m.If(axil.rresp == RESP_OKAY):
                        respond(Status.OK, axil.rdata, 4)
                    with m.Else():
                        respond(Status.BUS_ERROR)

        # The idle timer runs while a command waits for host bytes.
        waiting = (fsm.ongoing("HEADER") | fsm.ongoing("WRITE_MEM")) & ~rx.valid
        with m.If(waiting & ~timed_out):
            m.d.sync += idle.eq(idle + 1)
        with m.Elif(~waiting):
            m.d.sync += idle.eq(0)
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        return m
