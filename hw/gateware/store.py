"""The store engine: STOREs from the output or accumulator buffer to DRAM.

Three paths, each with its DMA writer (`_PATHS`): output entries, accumulator
entries, and requantized accumulator entries (a STORE with ``requant``: every
lane ``clamp((v + bias) >> shift)`` as an output-width value, converted between
the SRAM read and the queue, so a quantized layer's epilogue costs the compute
pipeline nothing).

Entries are read from SRAM contiguously from ``sram_base`` into a small
queue, through two register stages (the read data registered as it leaves the
block RAM; then the requantizer's bias add before the second, its shift and
clamp after it, so none of them shares a cycle with the block-RAM read, whose
clock-to-out is 5.8 ns of an ECP5's 10), and streamed to the DMA writer of the
buffer's entry size. Reads are issued
only with room to spare, so the reads and the stage in flight never overflow
the queue. Reads go by groups: each read takes, through the buffer's group
read port, exactly the entries the writer will pack into one beat (the same
`DmaWalk` over the DRAM side of the command), so narrow entries leave at a
beat per cycle. The instruction completes when the last write response
arrives, so a token pushed after a STORE means its data is in DRAM.

STOREs pipeline: the next STORE is popped and launched as soon as the previous
one's SRAM reads are issued, so its AW and W go out while the previous STORE's
write responses are outstanding; each instruction's pushes wait in
`PendingPushes` until its writer reports the last response, and leave in
program order. The bus belongs to one writer at a time (``owner``): a STORE
on another path waits until the owner's writes are all answered, so every
write response reaches the writer that issued the burst.
"""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ..isa import Engine, MemType, Opcode, insn_bits, requant_shift_bits
from ..microarch import buffer_lanes
from .axi import AxiWriteSignature, connect_when_selected
from .banked import GroupReadSignature, group_layout
from .dma import DmaCommand, DmaWalk, dma_command_from
from .dma_write import DmaWriter
from .gemm import lanes
from .engine import (STATE_BITS, EngineSequencer, PendingPushes, insn_layout, registered_stall, token_members,
                     token_ports)
from ..regmap import ENGINE_STATES

__all__ = ["StoreEngine", "requant_stage_layout", "requant_stage", "shift_and_clamp"]

#: Groups the store queue holds: with a read, a fetched and a staged group in flight, reads go
#: on every cycle while the writer takes a group per cycle.
_QUEUE_DEPTH = 6

#: The store engine's paths, one DMA writer each: (buffer read, buffer whose entries DRAM
#: receives). ``req`` is the requantizing STORE (acc read, out-sized entries written).
_PATHS = {"out": ("out", "out"), "acc": ("acc", "acc"), "req": ("acc", "out")}
#: The STORE fields the requantizing path keeps for the command it reads.
_REQUANT_FIELDS = ("shift", "relu", "bias", "bias_per_row")


class StoreEngine(wiring.Component):
    """Runs the store engine's instruction queue.

    Attributes
    ----------
    cmd : In(stream of insn_bits)
    prev_pop : Out(TokenPopSignature)
    prev_push : Out(TokenPushSignature)
        The token queues from and to the compute engine (`engine.token_members`).
        compute→store queue (pop side) and store→compute queue (push side).
    bus : Out(AxiWriteSignature)
    out_rd, acc_rd : Out(GroupReadSignature)
        Group read ports of the output and accumulator buffers (`buffer_lanes` entries).
    state, busy, token_stall, mem_stall, retire : status for counters and debug.
        ``busy``: an instruction is being popped or launched, or a launched one has
        not been retired (data or write responses in flight, push pending);
        ``retire``: an instruction's pushes are done (its data is in DRAM);
        ``mem_stall``: a write waited for the bus the cycle before (`engine.registered_stall`).
    bytes_written : Out(range(largest group's bytes + 1))
        Bytes accepted by the DMA writers this cycle (for the counter): a group of
        entries, at most a beat when entries are narrower, one entry otherwise.
    """

    def __init__(self, config):
        self._config = config
        c = config
        super().__init__({
            "cmd": In(stream.Signature(insn_bits(c))),
            **token_members(Engine.STORE),
            "bus": Out(AxiWriteSignature(c.bus_width)),
            "out_rd": Out(GroupReadSignature(c.out_entry_bytes * 8, buffer_lanes(c, "out"), c.acc_index_bits)),
            "acc_rd": Out(GroupReadSignature(c.acc_entry_bytes * 8, buffer_lanes(c, "acc"), c.acc_index_bits)),
            "state": Out(STATE_BITS), "busy": Out(1), "token_stall": Out(1), "mem_stall": Out(1),
            "retire": Out(1),
            "bytes_written": Out(range(max(c.bus_bytes, c.out_entry_bytes, c.acc_entry_bytes) + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        c = self._config
        ports = {"out": self.out_rd, "acc": self.acc_rd}
        # path: (buffer read, entry bytes written, entries per read); a path per DMA writer.
        paths = {name: (buffer, c.entry_bytes(written), buffer_lanes(c, buffer))
                 for name, (buffer, written) in _PATHS.items()}
        writers = {name: DmaWriter(entry, c.bus_bytes, lanes) for name, (_, entry, lanes) in paths.items()}
        for name, writer in writers.items():
            m.submodules[f"{name}_writer"] = writer
        path_index = {name: i for i, name in enumerate(paths)}

        word = Signal(insn_bits(c))
        layout = insn_layout(c, Opcode.STORE)
        insn = data.View(layout, word[:layout.size])
        # The STORE's path, decoded from the word and registered (also one-hot, `takes`): the word
        # is loaded in IDLE and holds through POP (a cycle at least) and LAUNCH, so the registers
        # have caught up by LAUNCH, and the launch's handshake with the writers, the pending
        # pushes and the owner check start at flip-flops, not at the word's decode (on the ECP5,
        # store.word -> pending_pushes was 12.5 ns on tiny).
        word_path = Mux(insn.requant, path_index["req"],
                        Mux(insn.mem == MemType.ACC, path_index["acc"], path_index["out"]))
        insn_path = Signal(range(len(paths)))
        takes = {name: Signal(name=f"takes_{name}") for name in paths}
        m.d.sync += [insn_path.eq(word_path), *(takes[name].eq(word_path == i) for name, i in path_index.items())]
        insn_cmd = Signal(DmaCommand)
        m.d.comb += dma_command_from(insn_cmd, insn)
        for writer in writers.values():
            m.d.comb += writer.cmd.p.eq(insn_cmd)

        # Bus: the owner's writer drives it (set at each launch; see the module docstring). The
        # owner, also the path of the SRAM reads in progress, is one flip-flop per path, so the bus
        # mux, the walks and the bias reads start at a register rather than at a decoder.
        selected = {name: Signal(name=f"{name}_selected", init=(i == 0)) for name, i in path_index.items()}
        for name, writer in writers.items():
            with m.If(selected[name]):
                m.d.comb += connect_when_selected(self.bus, writer.bus)

        # SRAM → stage → queue → writer, a group per read. Each path has its own walk (its
        # entries per beat); only the selected one advances. `dma_cmd` holds the
        # command being read, and `requant` its requantization, as the instruction word
        # moves on at launch. A requantizing path converts a group on its way into the
        # queue (its shift and ReLU staged with it), so the queue holds the writer's groups
        # whatever STORE comes next.
        dma_cmd = Signal(DmaCommand)
        requant = Signal(data.StructLayout({name: layout[name].shape for name in _REQUANT_FIELDS}))
        layouts = {name: group_layout(entry * 8, lanes) for name, (_, entry, lanes) in paths.items()}
        # The queue holds one group of the reading path: a union of the paths' group layouts.
        queue_layout = data.UnionLayout(layouts)
        m.submodules.queue = queue = fifo.SyncFIFO(width=queue_layout.size, depth=_QUEUE_DEPTH)
        queue_in = data.View(queue_layout, queue.w_data)
        queue_out = data.View(queue_layout, queue.r_data)
        # `fetched` holds a read's data as the block RAM gave it (per buffer, with the
        # requantization it is for: a STORE launched meanwhile changes `requant`); the stage
        # then holds the final group, or for the requantizing path its lanes with the bias
        # added (shift and clamp follow into the queue).
        fetched = {buffer: Signal.like(port.data, name=f"fetched_{buffer}") for buffer, port in ports.items()}
        fetched_valid = Signal()
        fetched_requant = Signal.like(requant)
        biased = data.ArrayLayout(c.acc_entry_bytes * 8, paths["req"][2])
        staged = Signal(data.UnionLayout({**layouts, "req": biased}))
        staged_valid = Signal()
        staged_requant = Signal(requant_stage_layout(c))
        addr = Signal(c.sram_addr_bits)
        reading = Signal()
        inflight = Signal()
        # The bias of a requantizing STORE is read through the same accumulator port, into
        # `bias_entry`, before the first read of the command (or of each row, per row):
        # a one-cycle bubble, hidden where output entries take a beat or more.
        bias_entry = Signal(c.acc_entry_bytes * 8)
        bias_index = Signal(c.acc_index_bits)
        bias_valid = Signal()           # bias_entry holds the bias of the rows being read
        bias_pending = Signal()         # its read was issued last cycle: the data is on the port
        need_bias = selected["req"] & requant.bias & ~bias_valid
        bias_read = reading & need_bias & ~bias_pending
        # `occupancy` counts the groups read and not yet taken by the writer (those in the queue,
        # the read in flight, `fetched` and the stage); a read is issued only while it is below
        # `_QUEUE_DEPTH - 1`, so the queue never overflows. `room` is that test for this cycle,
        # registered from the count's next value, so that no adder stands in front of the reads.
        occupancy = Signal(range(_QUEUE_DEPTH + 1))
        room = Signal(init=1)
        # A read is issued on the selected path; only the requantizing path waits for its bias.
        # `selected` is one-hot, so each path's walk advances on its own short AND of registers
        # instead of one `can_issue` that carries the bias wait into every walk's counters.
        issue = {name: reading & room & selected[name] for name in paths}
        issue["req"] = issue["req"] & (~need_bias | bias_pending)
        can_issue = Signal()
        m.d.comb += can_issue.eq(Cat(*issue.values()).any())
        # The writer's take arrives late in the cycle (through the DRAM write handshake), so
        # both outcomes are computed from this side's count first and the take only selects
        # one: it passes a multiplexer, not the adder and the compare, on its way to `room`.
        taken = queue.r_en & queue.r_rdy
        counted = Signal(range(_QUEUE_DEPTH + 2))       # the count with this cycle's read issued
        m.d.comb += counted.eq(occupancy + can_issue)
        m.d.sync += [occupancy.eq(Mux(taken, counted - 1, counted)),
                     room.eq(Mux(taken, counted < _QUEUE_DEPTH, counted < _QUEUE_DEPTH - 1))]
        walks = {name: DmaWalk(m, dma_cmd, exact_log2(max(1, c.bus_bytes // entry)), lanes)
                 for name, (_, entry, lanes) in paths.items()}
        count = Signal(range(max(lanes for _, _, lanes in paths.values()) + 1))
        last = Signal()
        for name, walk in walks.items():
            with m.If(selected[name]):
                m.d.comb += [count.eq(walk.count), last.eq(walk.last)]
        inflight_count = Signal.like(count)
        fetched_count = Signal.like(count)
        staged_count = Signal.like(count)
        m.d.sync += [inflight.eq(can_issue), inflight_count.eq(count),
                     fetched_valid.eq(inflight), fetched_count.eq(inflight_count), fetched_requant.eq(requant),
                     staged_valid.eq(fetched_valid), staged_count.eq(fetched_count),
                     staged_requant.eq(requant_stage(c, fetched_requant.shift, fetched_requant.relu))]
        with m.If(inflight):
            m.d.sync += [fetched[buffer].eq(port.data) for buffer, port in ports.items()]
        m.d.comb += [ports["out"].addr.eq(addr), ports["acc"].addr.eq(Mux(bias_read, bias_index, addr))]
        m.d.sync += bias_pending.eq(bias_read)
        with m.If(bias_pending):
            m.d.sync += [bias_entry.eq(ports["acc"].data[0]), bias_valid.eq(1)]
        m.d.comb += queue.w_en.eq(staged_valid)
        for name, (buffer, entry, group_lanes) in paths.items():
            read = fetched[buffer]
            group = Signal(layouts[name], name=f"{name}_group")     # what enters the queue
            if name == "req":
                stage_in = [add_bias(c, read[i], bias_entry, fetched_requant.bias) for i in range(group_lanes)]
                entries = [shift_and_clamp(c, staged[name][i], staged_requant) for i in range(group_lanes)]
            else:
                stage_in = [read[i] for i in range(group_lanes)]
                entries = [staged[name].entries[i] for i in range(group_lanes)]
            with m.If(fetched_valid & selected[name]):
                if name == "req":
                    m.d.sync += [staged[name][i].eq(e) for i, e in enumerate(stage_in)]
                else:
                    m.d.sync += [staged[name].entries[i].eq(e) for i, e in enumerate(stage_in)]
            m.d.comb += [group.entries[i].eq(e) for i, e in enumerate(entries)]
            m.d.comb += group.count.eq(staged_count)
            with m.If(selected[name]):
                m.d.comb += queue_in[name].eq(group)
        for name, walk in walks.items():
            with m.If(issue[name]):
                walk.advance()
        with m.If(can_issue):
            m.d.sync += addr.eq(addr + count)
            with m.If(requant.bias_per_row & walks["req"].row_end):
                m.d.sync += [bias_valid.eq(0), bias_index.eq(bias_index + 1)]    # after the latch: wins
            with m.If(last):
                m.d.sync += reading.eq(0)
        m.d.comb += self.bytes_written.eq(0)
        for name, writer in writers.items():
            m.d.comb += writer.inp.p.eq(queue_out[name])
            with m.If(selected[name]):
                m.d.comb += [writer.inp.valid.eq(queue.r_rdy), queue.r_en.eq(writer.inp.ready)]
                with m.If(queue.r_en & queue.r_rdy):
                    m.d.comb += self.bytes_written.eq(writer.inp.p.count * paths[name][1])

        # The owner's writer is busy, a cycle late: a flip-flop, so that the write responses'
        # queue levels behind a writer's busy do not run into every register a launch loads. A
        # launch sets it (the writer's busy rises the cycle after it takes a command, and only
        # then), so it is never low while the writer is busy; it falls a cycle after the writer
        # goes idle, which delays only a STORE that changes writers.
        owner_busy = Signal()
        launched = Signal()
        owner_busy_now = Signal()
        for name, writer in writers.items():
            with m.If(selected[name]):
                m.d.comb += owner_busy_now.eq(writer.busy)
        m.d.sync += owner_busy.eq(owner_busy_now | launched)

        seq = EngineSequencer(m, c, self.cmd, word, token_ports(self, Engine.STORE))
        pushes = PendingPushes(m, token_ports(self, Engine.STORE), [w.done for w in writers.values()])
        exec_state = ENGINE_STATES["exec"]
        with m.FSM():
            seq.idle_state()
            seq.pop_state("LAUNCH")
            with m.State("LAUNCH"):
                m.d.comb += [seq.state.eq(exec_state), seq.busy.eq(1)]
                # (Fetch dispatches no STORE with a zero size: `InsnChecker`.)
                # The reads of the previous STORE are issued; a change of writer also
                # waits for the previous owner's last write response.
                same_owner = Cat(selected[name] & takes[name] for name in paths).any()
                switch_ok = same_owner | ~owner_busy
                launch_ok = ~reading & pushes.ready & switch_ok
                for name, writer in writers.items():
                    with m.If(takes[name]):
                        m.d.comb += writer.cmd.valid.eq(launch_ok)
                        with m.If(writer.cmd.ready & launch_ok):
                            m.d.sync += [reading.eq(1), addr.eq(insn.sram_base), dma_cmd.eq(insn_cmd),
                                         bias_valid.eq(0), bias_index.eq(insn.bias_base)]
                            m.d.sync += [selected[other].eq(other == name) for other in writers]
                            m.d.sync += [requant[name].eq(insn[name]) for name in _REQUANT_FIELDS]
                            for walk in walks.values():
                                walk.start(insn_cmd)
                            pushes.add(m, seq.header, insn_path)
                            m.d.comb += launched.eq(1)
                            m.next = "IDLE"

        state, busy, token_stall = pushes.engine_status(m, seq)
        m.d.comb += [
            self.state.eq(state), self.busy.eq(busy), self.token_stall.eq(token_stall),
            self.retire.eq(pushes.retire),
            self.mem_stall.eq(registered_stall(m, write=busy & ((self.bus.awvalid & ~self.bus.awready) |
                                                                (self.bus.wvalid & ~self.bus.wready)))),
        ]
        return m


def add_bias(config, acc_entry, bias_entry, enabled):
    """A requantizing STORE's first step: each accumulator lane plus its bias lane (when
    ``enabled``), wrapping at acc_width bits (the ISA's `Store`)."""
    n, width = config.batch * config.block_out, config.acc_width
    return Cat(*((lane.as_signed() + Mux(enabled, bias.as_signed(), 0))[:width]
                 for lane, bias in zip(lanes(acc_entry, n, width), lanes(bias_entry, n, width))))


def _out_range(config):
    """The signed out_width range requantized values are clamped to."""
    return -(1 << (config.out_width - 1)), (1 << (config.out_width - 1)) - 1


def requant_stage_layout(config):
    """What the requantizer's second step needs beside the biased lanes: the shift, ReLU, and
    the saturation bounds of that shift (`requant_stage`)."""
    width = config.acc_width + 1
    return data.StructLayout({"shift": requant_shift_bits(config), "relu": 1,
                              "below": signed(width), "above": signed(width)})


def requant_stage(config, shift, relu):
    """The `requant_stage_layout` value of a STORE's ``shift`` and ``relu``.

    ``clamp(v >> shift)`` saturates low exactly when ``v < low·2^shift`` and high exactly when
    ``v ≥ (high+1)·2^shift`` (floor division by 2^shift is monotonic and exact at multiples of
    2^shift). These bounds depend on the shift alone, so they are looked up once per command and
    registered: the saturation test of each lane is then a compare against a register, in
    parallel with the shift, instead of a compare after it (the ECP5's critical path was the
    shifter followed by two acc_width-bit compares). A bound beyond acc_width's range is clipped
    to one no lane reaches.
    """
    width = config.acc_width
    low, high = _out_range(config)
    v_min, v_max = -(1 << (width - 1)), (1 << (width - 1)) - 1
    amounts = range(1 << requant_shift_bits(config))
    below = Array(C(max(low << k, v_min), signed(width + 1)) for k in amounts)
    above = Array(C(min((high + 1) << k, v_max + 1), signed(width + 1)) for k in amounts)
    return Cat(shift, relu, below[shift], above[shift])


def shift_and_clamp(config, biased_entry, stage):
    """A requantizing STORE's second step: each biased lane ``v`` becomes
    ``clamp(v >> shift)`` as out_width bits, clamped below at 0 with ``stage.relu``
    (``stage``: a `requant_stage_layout` value)."""
    n, width = config.batch * config.block_out, config.acc_width
    low, high = _out_range(config)
    out = []
    for lane in lanes(biased_entry, n, width):
        v = lane.as_signed()
        shifted = v >> stage.shift
        # With ReLU the floor is 0, which v >> shift falls below exactly when v is negative.
        under = Mux(stage.relu, v[-1], v < stage.below)
        floor = Mux(stage.relu, 0, low)
        clamped = Mux(under, floor, Mux(v >= stage.above, high, shifted))
        out.append(clamped[:config.out_width])
    return Cat(*out)
