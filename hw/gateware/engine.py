"""What the load, compute and store engines share: instruction-header decoding,
the token ports, and the pop → execute → push sequence.

Each engine runs one instruction at a time:

* **idle**: take the next instruction word from the command queue;
* **pop**: wait until every queue named by its ``pop_*`` flags has a token, then
  pop them all in one cycle (a pop blocks before the instruction starts);
* **exec** (and **drain**): the engine's own work;
* **push**: wait until every queue named by its ``push_*`` flags has room, then
  push them all in one cycle (a push happens after the instruction completes).

An engine whose work is a DMA command can instead pipeline (`PendingPushes`): it
pops and launches an instruction as soon as the previous one is launched and
leaves its pushes to a queue that performs them in order, each once its
instruction's data has landed.
"""

from amaranth import *
from amaranth.lib import data, fifo
from amaranth.lib.wiring import Out

from ..isa import TOKEN_QUEUES, AluOp, MemType, Opcode, fields_of
from ..microarch import PENDING_PUSHES
from ..regmap import ENGINE_STATE_BITS, ENGINE_STATES
from .tokens import TokenPopSignature, TokenPushSignature

__all__ = ["token_members", "token_ports", "insn_layout", "STATE_BITS", "PENDING_PUSHES", "EngineSequencer",
           "PendingPushes", "registered_stall"]

#: Width of an engine's state code (its field in the DEBUG_STATE register).
STATE_BITS = ENGINE_STATE_BITS


def token_members(engine):
    """An engine's token ports from the ISA's queues (`isa.TOKEN_QUEUES`):
    ``prev_pop``/``next_pop`` (`TokenPopSignature`) and ``prev_push``/``next_push``
    (`TokenPushSignature`) for each side it has a neighbour on."""
    members = {}
    for queue in TOKEN_QUEUES:
        if queue.popper is engine:
            members[f"{queue.pop_side}_pop"] = Out(TokenPopSignature())
        if queue.pusher is engine:
            members[f"{queue.push_side}_push"] = Out(TokenPushSignature())
    return members


def token_ports(component, engine):
    """``{side: (pop port, push port)}`` of an engine built with `token_members`, for
    `EngineSequencer` and `PendingPushes` (an engine pops and pushes on the same sides)."""
    sides = [queue.pop_side for queue in TOKEN_QUEUES if queue.popper is engine]
    return {side: (getattr(component, f"{side}_pop"), getattr(component, f"{side}_push")) for side in sides}


def insn_layout(config, opcode):
    """`data.StructLayout` of one instruction kind, from the ISA's field table."""
    fields = {}
    for field in fields_of(config, opcode):
        fields[field.name] = signed(field.width) if field.signed else unsigned(field.width)
    for name, enum_shape in _ENUM_FIELDS.items():       # typed: compared with enum members
        if name in fields:
            fields[name] = enum_shape
    return data.StructLayout(fields)


#: Instruction fields whose shape is an ISA enumeration.
_ENUM_FIELDS = {"opcode": Opcode, "mem": MemType, "op": AluOp}


def registered_stall(m, **terms):
    """An engine's memory-stall event, a cycle after its terms: each term (a DMA client's stall:
    its data waits for DRAM, or its bus request for the grant; a tile loader's is itself a cycle
    late, `TileLoader.mem_stall`) registered on its own, where it arises, and the registers
    ORed. An engine's clients can lie far apart (tiny on the ECP5 placed the load engine's two
    tile loaders across the die, and their OR before one register was a 3-LUT path with 10 ns of
    routes); each register stays by its client."""
    stalls = []
    for name, term in terms.items():
        stall = Signal(name=f"{name}_stall_q")
        m.d.sync += stall.eq(term)
        stalls.append(stall)
    return Cat(*stalls).any()


class EngineSequencer:
    """Builds the idle/pop/push states of an engine's FSM.

    Parameters
    ----------
    m : Module
    cmd : stream interface of instruction words (the engine's command queue)
    word : Signal holding the current instruction
    ports : dict of flag name ("prev"/"next") → (pop port, push port); missing ones are absent
    """

    def __init__(self, m, config, cmd, word, ports):
        self.m, self.cmd, self.word, self.ports = m, cmd, word, ports
        header = insn_layout(config, Opcode.FINISH)
        self.header = data.View(header, word[:header.size])
        self.state = Signal(STATE_BITS)
        self.token_stall = Signal()
        self.busy = Signal()
        self.retire = Signal()

    def idle_state(self, next_state="POP"):
        m = self.m
        with m.State("IDLE"):
            m.d.comb += [self.state.eq(ENGINE_STATES["idle"]), self.cmd.ready.eq(1)]
            with m.If(self.cmd.valid):
                m.d.sync += self.word.eq(self.cmd.payload)
                m.next = next_state

    def pop_state(self, next_state):
        m, h = self.m, self.header
        with m.State("POP"):
            m.d.comb += [self.state.eq(ENGINE_STATES["pop"]), self.busy.eq(1)]
            blocked = Const(0)
            for name, (pop_port, _push) in self.ports.items():
                blocked = blocked | (getattr(h, f"pop_{name}") & ~pop_port.can_pop)
            with m.If(blocked):
                m.d.comb += self.token_stall.eq(1)
            with m.Else():
                for name, (pop_port, _push) in self.ports.items():
                    m.d.comb += pop_port.pop.eq(getattr(h, f"pop_{name}"))
                m.next = next_state

    def push_state(self):
        m, h = self.m, self.header
        with m.State("PUSH"):
            m.d.comb += [self.state.eq(ENGINE_STATES["push"]), self.busy.eq(1)]
            blocked = Const(0)
            for name, (_pop, push_port) in self.ports.items():
                blocked = blocked | (getattr(h, f"push_{name}") & ~push_port.can_push)
            with m.If(blocked):
                m.d.comb += self.token_stall.eq(1)
            with m.Else():
                for name, (_pop, push_port) in self.ports.items():
                    m.d.comb += push_port.push.eq(getattr(h, f"push_{name}"))
                m.d.comb += self.retire.eq(1)
                m.next = "IDLE"


class PendingPushes:
    """The pushes of launched instructions, performed in program order as each completes.

    Each launched instruction leaves an entry: its ``push_*`` flags and the unit
    (``source``) executing it. Units complete their own commands in order and
    pulse ``done`` once per command; the queue counts those completions per unit,
    so units may finish out of order with respect to each other while the pushes
    still leave in program order. The head entry is retired when its unit has a
    completion counted and every queue it pushes to has room: it pushes them all
    in one cycle.

    Parameters
    ----------
    m : Module
    ports : dict of flag name → (pop port, push port), as for `EngineSequencer`
    dones : list of done pulses, one per unit
    depth : int
        Instructions launched and not yet retired.

    Attributes
    ----------
    ready : Value
        An entry can be added (launch allowed).
    pending : Value
        Some launched instruction has not been retired.
    token_stall : Signal
        The head has completed but a queue it pushes to is full.
    retire : Signal
        The head is retired this cycle.
    """

    def __init__(self, m, ports, dones, depth=PENDING_PUSHES):
        self._names = list(ports)
        self._source_bits = max(1, (len(dones) - 1).bit_length())
        m.submodules.pending_pushes = queue = fifo.SyncFIFO(
            width=len(self._names) + self._source_bits, depth=depth)
        self._queue = queue
        self.ready = queue.w_rdy
        self.pending = queue.r_rdy
        self.token_stall = Signal()
        self.retire = Signal()

        flags = queue.r_data[:len(self._names)]
        source = queue.r_data[len(self._names):]
        completed = Signal()
        for i, done in enumerate(dones):
            credits = Signal(range(depth + 1), name=f"completed{i}")
            taken = self.retire & (source == i)
            m.d.sync += credits.eq(credits + done - taken)
            with m.If(source == i):
                m.d.comb += completed.eq(credits != 0)
        blocked = Const(0)
        for i, name in enumerate(self._names):
            blocked = blocked | (flags[i] & ~ports[name][1].can_push)
        with m.If(queue.r_rdy & completed):
            with m.If(blocked):
                m.d.comb += self.token_stall.eq(1)
            with m.Else():
                m.d.comb += [self.retire.eq(1), queue.r_en.eq(1)]
                for i, name in enumerate(self._names):
                    m.d.comb += ports[name][1].push.eq(flags[i])

    def engine_status(self, m, seq):
        """(state, busy, token_stall) of an engine whose sequencer ``seq`` launches into
        this queue: the front end's, or ``push``/``drain`` while it is idle and launched
        instructions still wait to push."""
        state = Signal(STATE_BITS)
        with m.If((seq.state == ENGINE_STATES["idle"]) & self.pending):
            m.d.comb += state.eq(Mux(self.token_stall, ENGINE_STATES["push"], ENGINE_STATES["drain"]))
        with m.Else():
            m.d.comb += state.eq(seq.state)
        return state, seq.busy | self.pending, seq.token_stall | self.token_stall

    def add(self, m, header, source):
        """Statements for an instruction (``header``: its decoded header) launched this cycle."""
        m.d.comb += [self._queue.w_en.eq(1),
                     self._queue.w_data.eq(Cat(*(getattr(header, f"push_{n}") for n in self._names),
                                               C(0, self._source_bits) | source))]
