"""The accelerator's top level: engines, queues, buffers, AXI ports, registers, counters.

Ports (Verilog names): ``clk``, ``rst``, the AXI4 master ``m_axi__*`` (DRAM),
the AXI4-Lite slave ``s_axil__*`` (registers, `gemforge.hw.regmap`) and
``irq``. Buffers are `BankedMemory` instances (`gemforge.hw.gateware.banked`): as
many banks as a bus beat holds entries (`buffer_lanes`), so DMA moves a beat of
narrow entries per cycle; compute reads and writes one entry at a time:

=====  ===============  =========================================
buf    written by       read by
=====  ===============  =========================================
inp    load             compute (S1)
wgt    load             compute (S1)
acc    compute          compute (two ports, transparent), store
out    compute (mirror) store
uop    compute          compute (inside the compute engine)
=====  ===============  =========================================
"""

from amaranth import *
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ..config import AccelConfig
from ..regmap import COUNTERS, ID_MAGIC, REGISTERS
from .arbiter import ReadArbiter
from .axi import BURST_INCR, Axi4Signature, AxiLiteSignature
from .banked import BankedMemory, buffer_lanes
from .compute import ComputeEngine
from .fetch import FetchEngine
from .load import LoadEngine
from .regfile import RegisterFile
from .store import StoreEngine
from .tokens import TokenQueue

__all__ = ["Accelerator", "READ_CLIENTS", "TOKEN_QUEUES"]

#: Read clients of the AXI master, by ARID.
READ_CLIENTS = ("fetch", "load_inp", "load_wgt", "compute_acc", "compute_uop")
#: The dependency-token queues: (name, pushing engine, popping engine).
TOKEN_QUEUES = (("l2c", "load", "compute"), ("c2l", "compute", "load"),
                ("c2s", "compute", "store"), ("s2c", "store", "compute"))


class Accelerator(wiring.Component):
    """The whole accelerator for one `AccelConfig`.

    Attributes
    ----------
    m_axi : Out(Axi4Signature)
    s_axil : In(AxiLiteSignature)
    irq : Out(1)
    """

    def __init__(self, config):
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")
        self._config = config
        self._regfile = RegisterFile(REGISTERS)
        super().__init__({
            "m_axi": Out(Axi4Signature(config.bus_width, id_bits=3)),
            "s_axil": In(AxiLiteSignature(self._regfile.addr_bits)),
            "irq": Out(1),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        m = Module()
        c = self._config
        m.submodules.regs = regs = self._regfile
        wiring.connect(m, wiring.flipped(self.s_axil), regs.bus)

        m.submodules.fetch = fetch = FetchEngine(c)
        m.submodules.load = load = LoadEngine(c)
        m.submodules.compute = compute = ComputeEngine(c)
        m.submodules.store = store = StoreEngine(c)
        engines = {"load": load, "compute": compute, "store": store}

        # ---------------------------------------------------------------- command queues
        queues = {}
        for name, engine in engines.items():
            q = queues[name] = fifo.SyncFIFOBuffered(width=c.insn_bits, depth=c.cmd_queue_depth)
            m.submodules[f"{name}_cmdq"] = q
            src = getattr(fetch, name)
            m.d.comb += [q.w_data.eq(src.payload), q.w_en.eq(src.valid), src.ready.eq(q.w_rdy),
                         engine.cmd.payload.eq(q.r_data), engine.cmd.valid.eq(q.r_rdy),
                         q.r_en.eq(engine.cmd.ready)]

        # ---------------------------------------------------------------- token queues
        tokens = {}
        for name, pusher, popper in TOKEN_QUEUES:
            tq = tokens[name] = TokenQueue(c.token_queue_depth)
            m.submodules[f"tokens_{name}"] = tq
            # The pusher's side towards the popper: load→compute is load's "next".
            push_dir = "next" if (pusher, popper) in (("load", "compute"), ("compute", "store")) else "prev"
            pop_dir = "prev" if push_dir == "next" else "next"
            push_port = getattr(engines[pusher], f"{push_dir}_push")
            pop_port = getattr(engines[popper], f"{pop_dir}_pop")
            m.d.comb += [tq.push.eq(push_port.push), push_port.can_push.eq(tq.can_push),
                         tq.pop.eq(pop_port.pop), pop_port.can_pop.eq(tq.can_pop)]

        # ---------------------------------------------------------------- buffers
        def mem(name):
            mm = BankedMemory(width=c.entry_bytes(name) * 8, depth=c.depth(name), banks=buffer_lanes(c, name))
            m.submodules[f"{name}_mem"] = mm
            return mm

        for name in ("inp", "wgt"):
            mm = mem(name)
            wiring.connect(m, getattr(load, f"{name}_wr"), mm.write_port(lanes=mm.banks))
            rp = mm.read_port()
            m.d.comb += [rp.addr.eq(getattr(compute, f"{name}_rd_addr")),
                         getattr(compute, f"{name}_rd_data").eq(rp.data[0])]
        acc_mem, out_mem = mem("acc"), mem("out")
        acc_wp = acc_mem.write_port(lanes=acc_mem.banks)
        acc_ra = acc_mem.read_port(transparent_for=(acc_wp,))
        acc_rb = acc_mem.read_port(transparent_for=(acc_wp,))
        wiring.connect(m, compute.acc_wr, acc_wp)
        wiring.connect(m, store.acc_rd, acc_mem.read_port(lanes=acc_mem.banks))
        wiring.connect(m, compute.out_wr, out_mem.write_port(lanes=acc_mem.banks))   # the acc mirror
        wiring.connect(m, store.out_rd, out_mem.read_port(lanes=out_mem.banks))
        m.d.comb += [
            acc_ra.addr.eq(compute.acc_rda_addr), compute.acc_rda_data.eq(acc_ra.data[0]),
            acc_rb.addr.eq(compute.acc_rdb_addr), compute.acc_rdb_data.eq(acc_rb.data[0]),
        ]

        # ---------------------------------------------------------------- AXI master
        m.submodules.arbiter = arbiter = ReadArbiter(c.bus_width, len(READ_CLIENTS))
        for client, bus in zip(arbiter.clients, (fetch.bus, load.inp_bus, load.wgt_bus,
                                                 compute.acc_bus, compute.uop_bus)):
            wiring.connect(m, bus, client)
        axi = self.m_axi
        size = c.bus_bytes.bit_length() - 1
        m.d.comb += [
            axi.araddr.eq(arbiter.bus.araddr), axi.arlen.eq(arbiter.bus.arlen), axi.arsize.eq(size),
            axi.arburst.eq(BURST_INCR), axi.arid.eq(arbiter.grant_id), axi.arvalid.eq(arbiter.bus.arvalid),
            arbiter.bus.arready.eq(axi.arready),
            arbiter.bus.rdata.eq(axi.rdata), arbiter.bus.rlast.eq(axi.rlast),
            arbiter.bus.rvalid.eq(axi.rvalid), axi.rready.eq(arbiter.bus.rready),
            axi.awaddr.eq(store.bus.awaddr), axi.awlen.eq(store.bus.awlen), axi.awsize.eq(size),
            axi.awburst.eq(BURST_INCR), axi.awid.eq(0), axi.awvalid.eq(store.bus.awvalid),
            store.bus.awready.eq(axi.awready),
            axi.wdata.eq(store.bus.wdata), axi.wstrb.eq(store.bus.wstrb), axi.wlast.eq(store.bus.wlast),
            axi.wvalid.eq(store.bus.wvalid), store.bus.wready.eq(axi.wready),
            store.bus.bresp.eq(axi.bresp), store.bus.bvalid.eq(axi.bvalid), axi.bready.eq(store.bus.bready),
        ]

        # ---------------------------------------------------------------- control
        busy = Signal()
        done = Signal()
        finished = Signal()
        start = regs.ctrl_stb & regs.ctrl[0] & ~busy
        m.d.comb += [fetch.start.eq(start), fetch.address.eq(regs.insn_addr), fetch.count.eq(regs.insn_count)]
        all_idle = ~fetch.busy & ~load.busy & ~compute.busy & ~store.busy & \
            ~queues["load"].r_rdy & ~queues["compute"].r_rdy & ~queues["store"].r_rdy
        with m.If(start):
            m.d.sync += [busy.eq(1), done.eq(0), finished.eq(0)]
        with m.Elif(busy):
            with m.If(compute.finish):
                m.d.sync += finished.eq(1)
            with m.If(finished & all_idle):
                m.d.sync += [busy.eq(0), done.eq(1)]
        m.d.comb += self.irq.eq(done & regs.irq_enable[0])

        # ---------------------------------------------------------------- counters
        events = {
            "cycles": 1,
            "fetch_busy": fetch.busy, "fetch_mem_stall": fetch.mem_stall,
            "fetch_queue_stall": fetch.queue_stall,
            "gemm_active": compute.gemm_active, "gemm_reset": compute.gemm_reset,
            "alu_active": compute.alu_active,
            "dma_bytes_read": Mux(axi.rvalid & axi.rready, c.bus_bytes, 0),
            "dma_bytes_written": store.bytes_written,
            "insns_retired": load.retire + compute.retire + store.retire,
        }
        for name, engine in engines.items():
            events[f"{name}_busy"] = engine.busy
            events[f"{name}_token_stall"] = engine.token_stall
            events[f"{name}_mem_stall"] = engine.mem_stall
        for name, _doc in COUNTERS:
            counter = Signal(64, name=f"count_{name}")
            with m.If(start):
                m.d.sync += counter.eq(0)
            with m.Elif(busy):
                m.d.sync += counter.eq(counter + events[name])
            m.d.comb += [getattr(regs, f"{name}_lo").eq(counter[:32]),
                         getattr(regs, f"{name}_hi").eq(counter[32:])]

        # ---------------------------------------------------------------- status and debug registers
        def sat(value, bits):
            return Mux(value >= (1 << bits) - 1, (1 << bits) - 1, value)

        m.d.comb += [
            regs.id.eq(ID_MAGIC),
            regs.status.eq(Cat(busy, done)),
            regs.debug_state.eq(Cat(fetch.state, load.state, compute.state, store.state, finished)),
            regs.debug_cmdq.eq(Cat(sat(queues["load"].level, 10)[:10], sat(queues["compute"].level, 10)[:10],
                                   sat(queues["store"].level, 10)[:10])),
            regs.debug_tokens_a.eq(tokens["l2c"].count | (tokens["c2l"].count << 16)),
            regs.debug_tokens_b.eq(tokens["c2s"].count | (tokens["s2c"].count << 16)),
            regs.debug_fetched.eq(fetch.fetched),
        ]
        return m
