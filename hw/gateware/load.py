"""The load engine: LOADs into the input and weight buffers.

LOADs pipeline: the engine pops an instruction's tokens and hands it to its
buffer's `TileLoader` as soon as the previous one has been handed over, so its
bursts go out while the previous LOAD's data still arrives. Each instruction's
pushes wait in `PendingPushes` until its loader reports the tile written, and
leave in program order.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import Engine, MemType, Opcode, insn_bits
from ..microarch import buffer_lanes
from .axi import AxiReadSignature
from .banked import GroupWriteSignature
from .engine import (STATE_BITS, EngineSequencer, PendingPushes, insn_layout, registered_stall,
                     token_members, token_ports)
from ..regmap import ENGINE_STATES
from .tile_load import TileLoader

__all__ = ["LoadEngine"]


class LoadEngine(wiring.Component):
    """Runs the load engine's instruction queue.

    Attributes
    ----------
    cmd : In(stream of insn_bits)
        Instruction words (LOAD inp/wgt only; fetch routes by kind).
    next_pop : Out(TokenPopSignature)
    next_push : Out(TokenPushSignature)
        The token queues to and from the compute engine (`engine.token_members`).
        compute→load queue (pop side) and load→compute queue (push side).
    inp_bus, wgt_bus : Out(AxiReadSignature)
    inp_wr, wgt_wr : Out(GroupWriteSignature)
        Group write ports of the input and weight buffers (`buffer_lanes` entries).
    state, busy, token_stall, mem_stall, retire : status for counters and debug.
        ``busy``: an instruction is being popped or launched, or a launched one has
        not been retired (data in flight or push pending); ``retire``: an
        instruction's pushes are done (its data is in SRAM); ``mem_stall``: a tile
        loader waited for DRAM or the bus two cycles before (`TileLoader.mem_stall`,
        `engine.registered_stall`).
    """

    def __init__(self, config):
        self._config = config
        super().__init__({
            "cmd": In(stream.Signature(insn_bits(config))),
            **token_members(Engine.LOAD),
            "inp_bus": Out(AxiReadSignature(config.bus_width)),
            "wgt_bus": Out(AxiReadSignature(config.bus_width)),
            "inp_wr": Out(GroupWriteSignature(config.inp_entry_bytes * 8, buffer_lanes(config, "inp"),
                                              config.inp_index_bits)),
            "wgt_wr": Out(GroupWriteSignature(config.wgt_entry_bytes * 8, buffer_lanes(config, "wgt"),
                                              config.wgt_index_bits)),
            "state": Out(STATE_BITS), "busy": Out(1), "token_stall": Out(1), "mem_stall": Out(1),
            "retire": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        config = self._config
        loaders = {}
        for name in ("inp", "wgt"):
            loader = loaders[name] = TileLoader(config, name)
            m.submodules[f"{name}_loader"] = loader
            wiring.connect(m, wiring.flipped(getattr(self, f"{name}_bus")), loader.bus)
            wiring.connect(m, wiring.flipped(getattr(self, f"{name}_wr")), loader.wr)

        word = Signal(insn_bits(config))
        layout = insn_layout(config, Opcode.LOAD)
        insn = data.View(layout, word[:layout.size])
        seq = EngineSequencer(m, config, self.cmd, word, token_ports(self, Engine.LOAD))
        is_wgt = insn.mem == MemType.WGT

        for loader in loaders.values():
            for name in loader.cmd.p.shape().members:        # `tile_load.load_command_layout`
                m.d.comb += loader.cmd.p[name].eq(insn[name])

        pushes = PendingPushes(m, token_ports(self, Engine.LOAD),
                               [loaders["inp"].done, loaders["wgt"].done])
        with m.FSM():
            seq.idle_state()
            seq.pop_state("LAUNCH")
            with m.State("LAUNCH"):
                m.d.comb += [seq.state.eq(ENGINE_STATES["exec"]), seq.busy.eq(1)]
                for name, loader in loaders.items():
                    with m.If(is_wgt if name == "wgt" else ~is_wgt):
                        m.d.comb += loader.cmd.valid.eq(pushes.ready)
                        with m.If(loader.cmd.ready & pushes.ready):
                            pushes.add(m, seq.header, is_wgt)
                            m.next = "IDLE"

        state, busy, token_stall = pushes.engine_status(m, seq)
        m.d.comb += [
            self.state.eq(state), self.busy.eq(busy), self.token_stall.eq(token_stall),
            self.retire.eq(pushes.retire),
            self.mem_stall.eq(registered_stall(m, **{name: loader.mem_stall for name, loader in loaders.items()})),
        ]
        return m
