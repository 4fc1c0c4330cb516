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
uop    compute (LOAD)   compute (S0, transparent)
=====  ===============  =========================================
"""

from typing import NamedTuple

from amaranth import *
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from ..config import AccelConfig
from ..isa import PIPELINE, TOKEN_QUEUES, insn_bits, insn_bytes
from ..microarch import READ_CLIENTS, buffer_lanes
from ..regmap import (ADDRESS_TOP, CMDQ_LEVEL_BITS, COUNTERS, DEADLOCK_CYCLES, ERROR_INFO_NO_INDEX,
                      ERROR_INFO_WRITE, ID_MAGIC, REGISTERS, Fault, token_field)
from .arbiter import ReadArbiter
from .axi import BURST_INCR, RESP_OKAY, Axi4Signature, AxiLiteSignature
from .banked import BankedMemory
from .checked import CheckedComponent
from .compute import ComputeEngine
from .fetch import FetchEngine
from .insn_check import FAULT_BITS
from .load import LoadEngine
from .regfile import RegisterFile
from .store import StoreEngine
from .tokens import TokenQueue

__all__ = ["Accelerator", "READ_CLIENTS"]

#: Width of the AXI IDs: enough to name every read client (writes use ID 0).
AXI_ID_BITS = ceil_log2(len(READ_CLIENTS))


class _Drain(NamedTuple):
    """A fault's drain: the one-cycle soft reset that ends it, the drain itself, and an AR or
    AW request presented and not yet accepted (which the drain lets through)."""

    soft_reset: Signal
    aborting: Signal
    ar_held: Signal
    aw_held: Signal


class _Run(NamedTuple):
    """The run's state, which the counters and the status registers read."""

    busy: Signal
    done: Signal
    error: Signal
    aborting: Signal
    finished: Signal
    fault_code: Signal
    fault_info: Signal
    start_req: Value


class Accelerator(CheckedComponent):
    """The whole accelerator for one `AccelConfig`.

    Attributes
    ----------
    m_axi : Out(Axi4Signature)
    s_axil : In(AxiLiteSignature)
    irq : Out(1)
    """

    @classmethod
    def check_arguments(cls, config):
        if not isinstance(config, AccelConfig):
            raise TypeError(f"config must be an AccelConfig, not {config!r}")

    def __init__(self, config):
        self._config = config
        self._regfile = RegisterFile(REGISTERS)
        super().__init__({
            "m_axi": Out(Axi4Signature(config.bus_width, id_bits=AXI_ID_BITS)),
            "s_axil": In(AxiLiteSignature(self._regfile.addr_bits)),
            "irq": Out(1),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        # Wiring only, section by section in the order the design's signals are made (the
        # generated Verilog follows that order): the engines and their queues, the buffers, the
        # AXI master, then the run's control and faults, the counters and the status registers.
        m = Module()
        c = self._config
        m.submodules.regs = regs = self._regfile
        wiring.connect(m, wiring.flipped(self.s_axil), regs.bus)

        # Driven by `_control`: the end of a fault's drain, and the drain itself.
        soft_reset = Signal()
        aborting = Signal()
        ar_held, aw_held = Signal(), Signal()     # a request presented and not yet accepted
        drain = _Drain(soft_reset, aborting, ar_held, aw_held)

        def resettable(elaboratable):
            return ResetInserter(soft_reset)(elaboratable)

        fetch, load, compute, store = FetchEngine(c), LoadEngine(c), ComputeEngine(c), StoreEngine(c)
        for name, engine in (("fetch", fetch), ("load", load), ("compute", compute), ("store", store)):
            m.submodules[name] = resettable(engine)
        engines = {"load": load, "compute": compute, "store": store}
        assert list(engines) == [e.value for e in PIPELINE], "one engine per isa.PIPELINE stage, in order"

        queues, tokens = self._queues(m, fetch, engines, resettable)
        self._buffers(m, load, compute, store)
        self._axi_master(m, fetch, load, compute, store, resettable, drain)
        run = self._control(m, regs, fetch, engines, queues, tokens, drain)
        self._counters(m, regs, fetch, engines, run)
        self._status_registers(m, regs, fetch, engines, queues, tokens, run)
        return m

    def _queues(self, m, fetch, engines, resettable):
        """The engines' command queues (fed by fetch) and the dependency-token queues between
        them, from the ISA's table."""
        c = self._config
        queues = {}
        for name, engine in engines.items():
            q = queues[name] = fifo.SyncFIFOBuffered(width=insn_bits(c), depth=c.cmd_queue_depth)
            m.submodules[f"{name}_cmdq"] = resettable(q)
            wiring.connect(m, getattr(fetch, name), q.w_stream)
            wiring.connect(m, q.r_stream, engine.cmd)

        tokens = {}
        for queue in TOKEN_QUEUES:
            tq = tokens[queue.short] = TokenQueue(c.token_queue_depth)
            m.submodules[f"tokens_{queue.short}"] = resettable(tq)
            # The pusher's side towards the popper: load→compute is load's "next".
            wiring.connect(m, getattr(engines[queue.pusher.value], f"{queue.push_side}_push"), tq.pusher)
            wiring.connect(m, getattr(engines[queue.popper.value], f"{queue.pop_side}_pop"), tq.popper)
        return queues, tokens

    def _buffers(self, m, load, compute, store):
        """The five on-chip buffers and their ports (the table in the module's docstring)."""
        c = self._config

        def mem(name):
            mm = BankedMemory(width=c.entry_bytes(name) * 8, depth=c.depth(name), banks=buffer_lanes(c, name))
            m.submodules[f"{name}_mem"] = mm
            return mm

        for name in ("inp", "wgt"):
            mm = mem(name)
            wiring.connect(m, getattr(load, f"{name}_wr"), mm.write_port(lanes=mm.banks))
            wiring.connect(m, getattr(compute, f"{name}_rd"), mm.read_port())
        uop_mem = mem("uop")
        uop_wp = uop_mem.write_port(lanes=uop_mem.banks)
        wiring.connect(m, compute.uop_wr, uop_wp)
        wiring.connect(m, compute.uop_rd, uop_mem.read_port(transparent_for=(uop_wp,)))
        acc_mem, out_mem = mem("acc"), mem("out")
        acc_wp = acc_mem.write_port(lanes=acc_mem.banks)
        wiring.connect(m, compute.acc_wr, acc_wp)
        wiring.connect(m, compute.acc_rda, acc_mem.read_port(transparent_for=(acc_wp,)))
        wiring.connect(m, compute.acc_rdb, acc_mem.read_port(transparent_for=(acc_wp,)))
        wiring.connect(m, store.acc_rd, acc_mem.read_port(lanes=acc_mem.banks))
        wiring.connect(m, compute.out_wr, out_mem.write_port(lanes=acc_mem.banks))   # the acc mirror
        wiring.connect(m, store.out_rd, out_mem.read_port(lanes=out_mem.banks))

    def _axi_master(self, m, fetch, load, compute, store, resettable, drain):
        """The DRAM port: the readers arbitrated by AXI ID, the store's writes, and a fault's
        drain holding back new requests."""
        c = self._config
        aborting = drain.aborting
        block_ar = aborting & ~drain.ar_held
        block_aw = aborting & ~drain.aw_held
        arbiter = ReadArbiter(c.bus_width, len(READ_CLIENTS))
        m.submodules.arbiter = resettable(arbiter)
        readers = {"fetch": fetch.bus, "load_inp": load.inp_bus, "load_wgt": load.wgt_bus,
                   "compute_acc": compute.acc_bus, "compute_uop": compute.uop_bus}
        assert set(readers) == set(READ_CLIENTS), "every reader has an AXI ID in READ_CLIENTS"
        for client, name in zip(arbiter.clients, READ_CLIENTS):
            wiring.connect(m, readers[name], client)
        axi = self.m_axi
        size = exact_log2(c.bus_bytes)
        m.d.comb += [
            axi.araddr.eq(arbiter.bus.araddr), axi.arlen.eq(arbiter.bus.arlen), axi.arsize.eq(size),
            axi.arburst.eq(BURST_INCR), axi.arid.eq(arbiter.grant_id),
            axi.arvalid.eq(arbiter.bus.arvalid & ~block_ar), arbiter.bus.arready.eq(axi.arready & ~block_ar),
            arbiter.bus.rdata.eq(axi.rdata), arbiter.bus.rlast.eq(axi.rlast),
            arbiter.bus.rvalid.eq(axi.rvalid), axi.rready.eq(arbiter.bus.rready | aborting),
            axi.awaddr.eq(store.bus.awaddr), axi.awlen.eq(store.bus.awlen), axi.awsize.eq(size),
            axi.awburst.eq(BURST_INCR), axi.awid.eq(0),
            axi.awvalid.eq(store.bus.awvalid & ~block_aw), store.bus.awready.eq(axi.awready & ~block_aw),
            axi.wdata.eq(store.bus.wdata), axi.wstrb.eq(store.bus.wstrb), axi.wlast.eq(store.bus.wlast),
            axi.wvalid.eq(store.bus.wvalid), store.bus.wready.eq(axi.wready),
            store.bus.bresp.eq(axi.bresp), store.bus.bvalid.eq(axi.bvalid), axi.bready.eq(store.bus.bready),
        ]

    def _control(self, m, regs, fetch, engines, queues, tokens, drain) -> _Run:
        """A program's run: START (when idle) begins one; it ends with DONE, or with ERROR and a
        fault code. A fault (or ABORT) first drains the bus: no new AR/AW is issued (one
        already presented stays valid until accepted, as AXI requires), R beats are
        taken, and the transactions in flight complete; then, the cycle after, one cycle of
        ``soft_reset`` returns the engines and queues to their reset state (registers,
        counters and buffer contents are kept), so the accelerator is idle again."""
        c = self._config
        axi = self.m_axi
        compute = engines["compute"]
        soft_reset, aborting = drain.soft_reset, drain.aborting
        busy, done, error = Signal(), Signal(), Signal()
        finished = Signal()
        fault_code = Signal(FAULT_BITS)
        fault_info = Signal(32)
        start_req = regs.ctrl_stb & regs.ctrl["START"] & ~busy
        abort_req = regs.ctrl_stb & regs.ctrl["ABORT"] & busy & ~aborting
        insn_log = exact_log2(insn_bytes(c))
        misaligned = regs.insn_addr[:insn_log] != 0 if insn_log else Const(0)
        # The program's end, in instructions from address 0 (an aligned INSN_ADDR divides
        # exactly), against the top of the address space: fetch must never wrap to address 0.
        past_top = regs.insn_addr[insn_log:] + regs.insn_count > (ADDRESS_TOP >> insn_log)
        start_fault = Mux(regs.insn_count == 0, Fault.EMPTY_PROGRAM,
                          Mux(misaligned, Fault.MISALIGNED_PROGRAM,
                              Mux(past_top, Fault.PROGRAM_RANGE, Fault.NONE)))
        start = start_req & (start_fault == Fault.NONE)
        m.d.comb += [fetch.start.eq(start), fetch.address.eq(regs.insn_addr), fetch.count.eq(regs.insn_count)]
        queues_empty = ~Cat(q.r_rdy for q in queues.values()).any()
        all_idle = ~fetch.busy & ~Cat(engine.busy for engine in engines.values()).any() & queues_empty
        tokens_left = Const(0)
        for tq in tokens.values():
            tokens_left = tokens_left | (tq.count != 0)

        bus_quiet, bus_active = self._bus_in_flight(m, drain)
        stuck = self._watchdog(m, queues, tokens, engines, busy, aborting, bus_active)
        # The fault sources, most specific first: (raised, code, info).
        read_error = axi.rvalid & axi.rready & (axi.rresp != RESP_OKAY)
        write_error = axi.bvalid & axi.bready & (axi.bresp != RESP_OKAY)
        sources = [
            (fetch.fault != Fault.NONE, fetch.fault, fetch.fetched),
            (compute.index_fault, Fault.BUFFER_RANGE, ERROR_INFO_NO_INDEX),
            (read_error, Fault.BUS_ERROR, axi.rid),
            (write_error, Fault.BUS_ERROR, ERROR_INFO_WRITE | axi.bid),
            (abort_req, Fault.ABORTED, 0),
            (stuck, Mux(finished, Fault.TOKEN_IMBALANCE, Mux(all_idle, Fault.NO_FINISH, Fault.DEADLOCK)), 0),
            (finished & all_idle & tokens_left, Fault.TOKEN_IMBALANCE, 0),
        ]
        fault_seen, info_seen = self._first_fault(m, sources, busy, aborting)

        with m.If(start_req):
            m.d.sync += [busy.eq(start), done.eq(0), error.eq(~start), finished.eq(0),
                         fault_code.eq(start_fault), fault_info.eq(0)]
        with m.Elif(soft_reset):
            m.d.sync += [soft_reset.eq(0), busy.eq(0), aborting.eq(0), error.eq(1)]
        with m.Elif(busy & aborting):
            # Registered: the reset fans out to most of the design's flip-flops, so it starts
            # from one (the drain's gating still holds in its cycle).
            with m.If(bus_quiet):
                m.d.sync += soft_reset.eq(1)
        with m.Elif(busy):
            with m.If(fault_seen != Fault.NONE):
                m.d.sync += [aborting.eq(1), fault_code.eq(fault_seen), fault_info.eq(info_seen)]
            with m.Else():
                with m.If(compute.finish):
                    m.d.sync += finished.eq(1)
                with m.If(finished & all_idle & ~tokens_left):
                    m.d.sync += [busy.eq(0), done.eq(1)]
        m.d.comb += self.irq.eq((done | error) & regs.irq_enable["ENABLE"])
        return _Run(busy, done, error, aborting, finished, fault_code, fault_info, start_req)

    def _bus_in_flight(self, m, drain):
        """(the bus is quiet, the bus is active): AXI transactions in flight, for the drain and
        the watchdog.

        Each handshake is counted a cycle after it happens: RREADY is the end of the granted
        reader's decision and AWVALID the end of the store's writer select, and the counters'
        adders after them were tiny's critical paths on the ECP5 (the last: the store's
        `req_selected` → AWVALID → `writes_out`, 12.7 ns, mostly routing). A request accepted
        last cycle and not yet counted keeps the bus from counting as quiet; a response counted
        late only delays it."""
        axi = self.m_axi
        ar_held, aw_held = drain.ar_held, drain.aw_held
        reads_out, writes_out = Signal(16), Signal(16)
        ar_fired, r_last, aw_fired, b_fired = (Signal(name=name) for name in ("ar_fired", "r_last", "aw_fired",
                                                                                 "b_fired"))
        m.d.sync += [ar_fired.eq(axi.arvalid & axi.arready), r_last.eq(axi.rvalid & axi.rready & axi.rlast),
                     aw_fired.eq(axi.awvalid & axi.awready), b_fired.eq(axi.bvalid & axi.bready)]
        m.d.sync += [reads_out.eq(reads_out + ar_fired - r_last), writes_out.eq(writes_out + aw_fired - b_fired),
                     ar_held.eq(axi.arvalid & ~axi.arready), aw_held.eq(axi.awvalid & ~axi.awready)]
        bus_quiet = ((reads_out == 0) & (writes_out == 0) & ~ar_fired & ~aw_fired
                     & ~axi.arvalid & ~axi.awvalid)
        # The bus counts as progressing while a transaction is outstanding or a request or
        # response is presented, taken from registers and the bus's inputs only: AWVALID and
        # WVALID end the store writers' logic, whose depth (10.6–11.7 ns from
        # `store.*_writer.responses`) moved to any register that took them. A W beat comes only
        # after its AW was accepted (`dma_write`: WVALID waits for the burst length the AW
        # handshake queues), so an outstanding write covers it.
        bus_active = (reads_out != 0) | (writes_out != 0) | ar_fired | aw_fired | ar_held | aw_held \
            | axi.rvalid | axi.bvalid
        return bus_quiet, bus_active

    def _watchdog(self, m, queues, tokens, engines, busy, aborting, bus_active):
        """Whether the running program made no progress for DEADLOCK_CYCLES.

        Progress is registered where it happens, one flip-flop per source (a queue, a token
        queue, an engine's retire, issue or buffer write), and the flip-flops are ORed: no OR
        tree gathers the handshakes from across the device in front of one register
        (`compute.fsm_state → progressed`, 11.2 ns on tiny's ECP5). One per signal, not per
        engine: a buffer's write enable is its loader's own logic, and a register shared by two
        loaders across the die pulled that logic towards it (`load.wgt_loader.run →
        progress_load → … → run`, 11.8 ns). The registers lag a cycle, which the watchdog's
        DEADLOCK_CYCLES do not notice."""
        load, compute, store = engines["load"], engines["compute"], engines["store"]
        watchdog = Signal(range(DEADLOCK_CYCLES + 1))
        progress_sources = {
            **{f"queue_{name}": (q.w_en & q.w_rdy) | (q.r_en & q.r_rdy) for name, q in queues.items()},
            **{f"tokens_{name}": tq.pusher.push | tq.popper.pop for name, tq in tokens.items()},
            "load_retire": load.retire, "inp_write": load.inp_wr.en, "wgt_write": load.wgt_wr.en,
            "compute_retire": compute.retire, "gemm_issue": compute.gemm_active, "alu_issue": compute.alu_active,
            "acc_write": compute.acc_wr.en, "store_retire": store.retire,
        }
        progressed = bus_active
        for name, source in progress_sources.items():
            seen = Signal(name=f"progress_{name}")
            m.d.sync += seen.eq(source)
            progressed = progressed | seen
        with m.If(~busy | aborting | progressed):
            m.d.sync += watchdog.eq(0)
        with m.Elif(watchdog != DEADLOCK_CYCLES):
            m.d.sync += watchdog.eq(watchdog + 1)
        return watchdog == DEADLOCK_CYCLES

    def _first_fault(self, m, sources, busy, aborting):
        """(code, info) of the first of ``sources`` ((raised, code, info), most specific first)
        raised a cycle ago, or NONE.

        Each source is registered where it arises, and the first raised one is picked a cycle
        later, from the registers: the sources sit all over the design (the AXI responses
        beside the engines, the fetch, the compute pipeline), and a priority mux over them in
        front of the fault registers was tiny's critical path on the ECP5 (14.3 ns, 80 % of it
        routing; then 11.8 ns from the read arbiter's grant through RREADY). A cycle later is
        still before the program could end: every source but ABORT is raised while its engine
        is busy, and a token imbalance holds DONE back itself."""
        fault_seen = Signal(FAULT_BITS)      # the first source raised a cycle ago, or NONE
        info_seen = Signal(32)
        for index, (raised, code, info) in reversed(list(enumerate(sources))):
            raised_seen = Signal(name=f"fault_source_{index}")
            m.d.sync += raised_seen.eq(raised & busy & ~aborting)
            values = []
            for part, value in (("code", code), ("info", info)):
                value = Value.cast(value)
                if not isinstance(value, Const):
                    held = Signal.like(value, name=f"fault_source_{index}_{part}")
                    m.d.sync += held.eq(value)
                    value = held
                values.append(value)
            with m.If(raised_seen):        # the last `If` written wins: the first source
                m.d.comb += [fault_seen.eq(values[0]), info_seen.eq(values[1])]
        return fault_seen, info_seen

    def _counters(self, m, regs, fetch, engines, run):
        """The 64-bit event counters of `regmap.COUNTERS`, cleared by START, counting while busy."""
        c = self._config
        axi = self.m_axi
        load, compute, store = engines["load"], engines["compute"], engines["store"]
        busy, start_req = run.busy, run.start_req
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
            # An engine's memory stall comes a cycle late (the store's) or two (the tile loaders'),
            # registered where it arises (`engine.registered_stall`, `TileLoader.mem_stall`): its
            # DMA clients and bus grants lie far from the counters (on the ECP5 the routes alone
            # took 9 ns). The count is as final at DONE: an engine's last two busy cycles (a
            # loader's last write and its push) are never stalls.
            events[f"{name}_mem_stall"] = engine.mem_stall
        for name, _doc in COUNTERS:
            counter = Signal(64, name=f"count_{name}")
            event, counting = Value.cast(events[name]), busy
            if not isinstance(event, Const):
                # Registered, and added a cycle later: the engines' status logic and the 64-bit
                # carry chain, placed far apart, were one path (tiny's critical path on the ECP5).
                # No count is late where it can be read: a program ends (BUSY clears) after a cycle
                # with every engine idle, hence no event, so the counters are final in the cycle
                # DONE rises (tests/hw/test_gateware_accelerator.py reads them then). After a
                # fault, whose drain can end on a busy engine, that last cycle is added a cycle
                # after ERROR rises. `cycles` (a constant event) still counts directly.
                registered = Signal(event.shape(), name=f"event_{name}")
                m.d.sync += registered.eq(Mux(busy, event, 0))
                event, counting = registered, Const(1)
            with m.If(start_req):        # also a START refused at once (EMPTY, MISALIGNED, PROGRAM_RANGE)
                m.d.sync += counter.eq(0)
            with m.Elif(counting):
                m.d.sync += counter.eq(counter + event)
            m.d.comb += [getattr(regs, f"{name}_lo").eq(counter[:32]),
                         getattr(regs, f"{name}_hi").eq(counter[32:])]

    def _status_registers(self, m, regs, fetch, engines, queues, tokens, run):
        """ID, STATUS, ERROR and the debug view of the engines, queues and tokens."""
        def sat(value, bits):
            return Mux(value >= (1 << bits) - 1, (1 << bits) - 1, value)

        # The registers with bitfields are views of their regmap layouts: fields by name.
        token_regs = {name: reg for reg in (regs.debug_tokens_a, regs.debug_tokens_b)
                      for name in reg.shape().members if not name.startswith("_")}
        m.d.comb += [
            regs.id.eq(ID_MAGIC),
            regs.status["BUSY"].eq(run.busy), regs.status["DONE"].eq(run.done), regs.status["ERROR"].eq(run.error),
            regs.status["ABORTING"].eq(run.aborting),
            regs.error["CODE"].eq(run.fault_code), regs.error_info.eq(run.fault_info),
            regs.debug_fetched.eq(fetch.fetched),
        ]
        # The debug view is registered, a cycle behind the engines: their states are decoded
        # from queues and handshakes all over the design, and from there through the read
        # multiplexer into RDATA was one of tiny's longest paths on the ECP5
        # (`store.pending_pushes → s_axil.rdata`, 10.7 ns). No read can tell a cycle's lag.
        debug_view = [
            (regs.debug_state["FETCH"], fetch.state), (regs.debug_state["FINISH_RETIRED"], run.finished),
            *((regs.debug_state[e.value.upper()], engines[e.value].state) for e in PIPELINE),
            *((regs.debug_cmdq[e.value.upper()], sat(queues[e.value].level, CMDQ_LEVEL_BITS)) for e in PIPELINE),
            *((token_regs[token_field(q)][token_field(q)], tokens[q.short].count) for q in TOKEN_QUEUES),
        ]
        for field, value in debug_view:
            m.d.sync += field.eq(value)
