"""The gateware's microarchitecture, as facts: what the models of the hardware must know of it.

The gateware (`gemforge.hw.gateware`) implements these, and the timing (`timing`), the cycle
model (`gemforge.sim.cycle_model`), regression and the datasheet read them here, one layer
below the gateware, so that no model imports the gateware to learn a constant:

- the AXI read clients and their IDs (`READ_CLIENTS`);
- the longest DMA burst (`max_burst_beats`) and how a 2-D transfer splits into groups of
  entries per beat (`dma_groups`);
- the buffers' banking (`buffer_lanes`: entries per bus beat, and so banks);
- how far a pipelining engine runs ahead of its oldest token push (`PENDING_PUSHES`).
"""

from __future__ import annotations

__all__ = ["READ_CLIENTS", "PENDING_PUSHES", "max_burst_beats", "dma_groups", "buffer_lanes"]

#: Read clients of the AXI master, by ARID.
READ_CLIENTS = ("fetch", "load_inp", "load_wgt", "compute_acc", "compute_uop")

#: Instructions a pipelining engine launches ahead of its oldest push (`gateware.engine.PendingPushes`).
PENDING_PUSHES = 4


def max_burst_beats(bus_bytes):
    """Longest burst issued: 64 beats, fewer on wide buses so a burst stays within 4 KiB."""
    return min(64, 4096 // bus_bytes)


def buffer_lanes(config, buffer):
    """Entries of ``buffer`` one bus beat carries, at most the buffer's depth (a power of two).

    This is the width of the buffer's DMA groups and its number of banks."""
    return min(max(1, config.bus_bytes // config.entry_bytes(buffer)), config.depth(buffer))


def dma_groups(base, y_size, x_size, x_stride, entry_bytes, bus_bytes, lanes=None):
    """The group sizes `gateware.dma.DmaWalk` steps through for one command (a reference model)."""
    k = max(1, bus_bytes // entry_bytes)
    lanes = k if lanes is None else lanes
    out = []
    for y in range(y_size):
        addr, left = base + y * x_stride, x_size
        while left:
            n = min(lanes, k - addr % k, left)
            out.append(n)
            addr, left = addr + n, left - n
    return out
