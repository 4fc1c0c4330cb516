"""What the load, compute and store engines share: instruction-header decoding,
the token ports, and the pop → execute → push sequence.

Each engine runs one instruction at a time:

* **idle**: take the next instruction word from the command queue;
* **pop**: wait until every queue named by its ``pop_*`` flags has a token, then
  pop them all in one cycle (a pop blocks before the instruction starts);
* **exec** (and **drain**): the engine's own work;
* **push**: wait until every queue named by its ``push_*`` flags has room, then
  push them all in one cycle (a push happens after the instruction completes).
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..isa import Opcode, fields_of
from ..regmap import ENGINE_STATES

__all__ = ["TokenPort", "insn_layout", "STATE_BITS", "EngineSequencer"]

#: Width of an engine's state code in the debug register.
STATE_BITS = 4


class TokenPort(wiring.Signature):
    """An engine's connection to one token queue (pop side and push side are separate ports)."""

    def __init__(self):
        super().__init__({"pop": Out(1), "can_pop": In(1), "push": Out(1), "can_push": In(1)})


def insn_layout(config, opcode):
    """`data.StructLayout` of one instruction kind, from the ISA's field table."""
    fields = {}
    for field in fields_of(config, opcode):
        fields[field.name] = signed(field.width) if field.signed else unsigned(field.width)
    return data.StructLayout(fields)


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
