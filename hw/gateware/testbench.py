"""Testbench helpers for Amaranth's simulator: clocked runs, stream and AXI4-Lite
transactions, and behavioural AXI4 memories (reads and writes, with optional random
backpressure) so block tests stay a few lines long.

Python runs every cycle here: these are for unit tests of blocks and of short
programs. Long runs belong on the Verilator co-simulation (`gemforge.sim.cosim`).
"""

__all__ = ["simulate", "stream_put", "stream_get", "group_entries", "axil_write", "axil_read", "AxiReadMemory", "AxiWriteMemory",
           "run_accelerator"]

from amaranth.sim import Simulator


def simulate(dut, *testbenches, processes=(), vcd=None, clock=True):
    """Run async testbenches against ``dut`` with a 1 MHz clock (none for combinational DUTs)."""
    sim = Simulator(dut)
    if clock:
        sim.add_clock(1e-6)
    for tb in testbenches:
        sim.add_testbench(tb)
    for proc in processes:
        sim.add_process(proc)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


async def stream_put(ctx, stream, payload):
    """Offer one payload on a stream (a plain value, or fields by name: a list fills an array
    field from element 0) until it is accepted."""
    if not isinstance(payload, dict):
        ctx.set(stream.payload, payload)
    for name, value in (payload.items() if isinstance(payload, dict) else ()):
        field = getattr(stream.p, name)
        if isinstance(value, (list, tuple)):
            for i, element in enumerate(value):
                ctx.set(field[i], element)
        else:
            ctx.set(field, value)
    ctx.set(stream.valid, 1)
    while True:
        _, _, ready = await ctx.tick().sample(stream.ready)
        if ready:
            break
    ctx.set(stream.valid, 0)


async def issue_words(ctx, stream, words, limit=4000):
    """Offer each word (a plain-payload stream, e.g. an engine's instruction queue) in
    turn, back to back; fails if one is not taken within ``limit`` cycles."""
    for word in words:
        ctx.set(stream.payload, word)
        ctx.set(stream.valid, 1)
        for _ in range(limit):
            _, _, ready = await ctx.tick().sample(stream.ready)
            if ready:
                break
        else:
            raise AssertionError(f"the stream stopped taking words ({limit} cycles)")
    ctx.set(stream.valid, 0)


async def wait_until_low(ctx, signal, limit=8000) -> bool:
    """Tick until ``signal`` is low (True), or ``limit`` cycles pass (False)."""
    for _ in range(limit):
        await ctx.tick()
        if not ctx.get(signal):
            return True
    return False


async def stream_get(ctx, stream):
    """Accept one payload from a stream (ready held until a transfer); returns it."""
    ctx.set(stream.ready, 1)
    while True:
        _, _, valid, payload = await ctx.tick().sample(stream.valid, stream.p)
        if valid:
            break
    ctx.set(stream.ready, 0)
    return payload


def group_entries(group) -> list[int]:
    """The valid entries of a sampled `group_layout` value (``entries[:count]``)."""
    return [group.entries[i] for i in range(group.count)]


class AxiReadMemory:
    """A byte-addressed memory answering an AXI read port (AR/R members) in a testbench process.

    Serves one beat per cycle in order; ``stall`` (0..1) withholds ARREADY/RVALID randomly."""

    def __init__(self, port, data: bytes, bus_bytes: int, stall=0.0, seed=0, gnt=True):
        import random
        self.port, self.data, self.n, self.stall = port, bytearray(data), bus_bytes, stall
        self.rng = random.Random(seed)
        self.gnt = gnt
        self.bursts = []
        self.reads = []        # (addr, len) of every burst accepted

    async def run(self, ctx):
        p, n = self.port, self.n
        if self.gnt and hasattr(p, "gnt"):
            ctx.set(p.gnt, 1)
        current = None  # [addr, beats_left]
        while True:
            ar_ready = self.rng.random() >= self.stall
            ctx.set(p.arready, int(ar_ready))
            if current is None and self.bursts:
                current = self.bursts.pop(0)
            r_valid = current is not None and self.rng.random() >= self.stall
            if r_valid:
                addr = current[0]
                ctx.set(p.rdata, int.from_bytes(self.data[addr:addr + n], "little"))
                ctx.set(p.rlast, int(current[1] == 1))
            ctx.set(p.rvalid, int(r_valid))
            _, _, arvalid, araddr, arlen, rready = await ctx.tick().sample(p.arvalid, p.araddr, p.arlen, p.rready)
            if ar_ready and arvalid:
                self.bursts.append([araddr, arlen + 1])
                self.reads.append((araddr, arlen + 1))
                assert araddr % n == 0
                assert araddr // 4096 == (araddr + (arlen + 1) * n - 1) // 4096, "burst crosses 4 KiB"
            if r_valid and rready:
                current[0] += n
                current[1] -= 1
                if current[1] == 0:
                    current = None


async def axil_write(ctx, bus, offset, value):
    """One AXI4-Lite write through ``bus`` (a RegisterFile's or the Accelerator's slave port)."""
    ctx.set(bus.awaddr, offset)
    ctx.set(bus.wdata, value)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wvalid, 1)
    ctx.set(bus.bready, 1)
    while True:
        _, _, ready = await ctx.tick().sample(bus.awready)
        if ready:
            break
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    while True:
        _, _, bvalid = await ctx.tick().sample(bus.bvalid)
        if bvalid:
            break
    ctx.set(bus.bready, 0)


async def axil_read(ctx, bus, offset):
    """One AXI4-Lite read; returns the data."""
    ctx.set(bus.araddr, offset)
    ctx.set(bus.arvalid, 1)
    ctx.set(bus.rready, 1)
    while True:
        _, _, ready = await ctx.tick().sample(bus.arready)
        if ready:
            break
    ctx.set(bus.arvalid, 0)
    while True:
        _, _, rvalid, rdata = await ctx.tick().sample(bus.rvalid, bus.rdata)
        if rvalid:
            break
    ctx.set(bus.rready, 0)
    return rdata


class AxiWriteMemory:
    """The write half of `AxiReadMemory` (AW, W, B) over the same bytearray."""

    def __init__(self, port, data: bytearray, bus_bytes: int, stall=0.0, seed=1, b_latency=0):
        import random
        self.port, self.data, self.n, self.stall = port, data, bus_bytes, stall
        self.rng = random.Random(seed)
        self.b_latency = b_latency      # cycles from a burst's last W beat to its response
        self.writes = []

    async def run(self, ctx):
        p, n = self.port, self.n
        bursts, responses = [], []      # responses: cycle from which each may be given
        current = None
        cycle = 0
        while True:
            cycle += 1
            aw_ready = self.rng.random() >= self.stall
            w_ready = bool(bursts or current) and self.rng.random() >= self.stall
            b_valid = bool(responses) and responses[0] <= cycle and self.rng.random() >= self.stall
            ctx.set(p.awready, int(aw_ready))
            ctx.set(p.wready, int(w_ready))
            ctx.set(p.bvalid, int(b_valid))
            _, _, awvalid, awaddr, awlen, wvalid, wdata, wstrb, wlast, bready = await ctx.tick().sample(
                p.awvalid, p.awaddr, p.awlen, p.wvalid, p.wdata, p.wstrb, p.wlast, p.bready)
            if b_valid and bready:
                responses.pop(0)
            if w_ready and wvalid:
                if current is None:
                    current = bursts.pop(0)
                addr = current[0]
                for i in range(n):
                    if wstrb >> i & 1:
                        self.data[addr + i] = (wdata >> (8 * i)) & 0xFF
                current[0] += n
                current[1] -= 1
                assert bool(wlast) == (current[1] == 0), "WLAST does not match AWLEN"
                if current[1] == 0:
                    current = None
                    responses.append(cycle + 1 + self.b_latency)
            if aw_ready and awvalid:
                bursts.append([awaddr, awlen + 1])
                self.writes.append((awaddr, awlen + 1))


def run_accelerator(config, dram: bytearray, insn_addr: int, insn_count: int, *, stall=0.0,
                    max_cycles=20000, seed=0, read_at_irq=None):
    """Run a program on `Accelerator` in Amaranth's simulator; ``dram`` is updated in place.

    Returns the counters read back over AXI4-Lite. With ``read_at_irq`` (a counter's name) the
    IRQ is enabled and that counter's low word read in the cycle it rises, the earliest a host
    can (returned as ``"at_irq"``), before the others."""
    from gemforge.hw.gateware.top import Accelerator
    from gemforge.hw.regmap import COUNTERS, by_name

    dut = Accelerator(config)
    rd = AxiReadMemory(dut.m_axi, dram, config.bus_bytes, stall=stall, seed=seed)
    rd.data = dram
    wr = AxiWriteMemory(dut.m_axi, dram, config.bus_bytes, stall=stall, seed=seed + 1)
    result = {}

    async def tb(ctx):
        bus = dut.s_axil
        await axil_write(ctx, bus, by_name("INSN_ADDR").offset, insn_addr)
        await axil_write(ctx, bus, by_name("INSN_COUNT").offset, insn_count)
        if read_at_irq:
            await axil_write(ctx, bus, by_name("IRQ_ENABLE").offset, 1)
        await axil_write(ctx, bus, by_name("CTRL").offset, 1)
        if read_at_irq:
            # The read is presented in the very cycle the IRQ rises, as a host whose ARVALID
            # follows the IRQ combinationally would (the register file takes it at the next edge).
            await ctx.changed(dut.irq).delay(max_cycles * 1e-6)     # bounded: 1 MHz clock
            if not ctx.get(dut.irq):
                raise AssertionError(f"no IRQ after {max_cycles} cycles")
            result["at_irq"] = await axil_read(ctx, bus, by_name(f"{read_at_irq.upper()}_LO").offset)
        for _ in range(max_cycles // 16):
            for _ in range(16):
                await ctx.tick()
            if await axil_read(ctx, bus, by_name("STATUS").offset) & 2:
                break
        else:
            raise AssertionError(f"accelerator not done after {max_cycles} cycles; debug state "
                                 f"{await axil_read(ctx, bus, by_name('DEBUG_STATE').offset):#x}")
        for name, _ in COUNTERS:
            lo = await axil_read(ctx, bus, by_name(f"{name.upper()}_LO").offset)
            hi = await axil_read(ctx, bus, by_name(f"{name.upper()}_HI").offset)
            result[name] = lo | hi << 32

    simulate(dut, tb, processes=[rd.run, wr.run])
    return result
