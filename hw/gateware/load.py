"""The load engine: LOADs into the input and weight buffers."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..isa import MemType, Opcode
from .axi import AxiReadSignature
from .banked import GroupWriteSignature, buffer_lanes
from .engine import STATE_BITS, EngineSequencer, TokenPort, insn_layout
from .tile_load import TileLoader

__all__ = ["LoadEngine"]


class LoadEngine(wiring.Component):
    """Runs the load engine's instruction queue.

    Attributes
    ----------
    cmd : In(stream of insn_bits)
        Instruction words (LOAD inp/wgt only; fetch routes by kind).
    next_pop, next_push : Out(TokenPort)
        compute→load queue (pop side) and load→compute queue (push side).
    inp_bus, wgt_bus : Out(AxiReadSignature)
    inp_wr, wgt_wr : Out(GroupWriteSignature)
        Group write ports of the input and weight buffers (`buffer_lanes` entries).
    state, busy, token_stall, mem_stall, retire : status for counters and debug.
    """

    def __init__(self, config):
        self._config = config
        super().__init__({
            "cmd": In(stream.Signature(config.insn_bits)),
            "next_pop": Out(TokenPort()), "next_push": Out(TokenPort()),
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

        word = Signal(config.insn_bits)
        layout = insn_layout(config, Opcode.LOAD)
        insn = data.View(layout, word[:layout.size])
        seq = EngineSequencer(m, config, self.cmd, word, {"next": (self.next_pop, self.next_push)})
        is_wgt = insn.mem == MemType.WGT

        for loader in loaders.values():
            for name in ("sram_base", "dram_base", "y_size", "x_size", "x_stride",
                         "y_pad0", "y_pad1", "x_pad0", "x_pad1"):
                m.d.comb += getattr(loader.cmd.p, name).eq(getattr(insn, name))

        with m.FSM():
            seq.idle_state()
            seq.pop_state("LAUNCH")
            with m.State("LAUNCH"):
                m.d.comb += [seq.state.eq(2), seq.busy.eq(1)]
                with m.If(is_wgt):
                    m.d.comb += loaders["wgt"].cmd.valid.eq(1)
                    with m.If(loaders["wgt"].cmd.ready):
                        m.next = "WAIT"
                with m.Else():
                    m.d.comb += loaders["inp"].cmd.valid.eq(1)
                    with m.If(loaders["inp"].cmd.ready):
                        m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += [seq.state.eq(2), seq.busy.eq(1)]
                with m.If(~loaders["inp"].busy & ~loaders["wgt"].busy):
                    m.next = "PUSH"
            seq.push_state()

        m.d.comb += [
            self.state.eq(seq.state), self.busy.eq(seq.busy), self.token_stall.eq(seq.token_stall),
            self.retire.eq(seq.retire),
            self.mem_stall.eq(loaders["inp"].mem_stall | loaders["wgt"].mem_stall |
                              (loaders["inp"].bus.req & ~loaders["inp"].bus.gnt) |
                              (loaders["wgt"].bus.req & ~loaders["wgt"].bus.gnt)),
        ]
        return m
