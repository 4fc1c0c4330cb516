"""Static memory planning of the accelerator's packed tensors in device DRAM.

Every packed tensor gets a static offset in one activation
arena in device DRAM: tensors whose lifetimes (first to last accelerator node
touching them) do not overlap share space (greedy, largest first). Weights and
biases travel inside each layer's program as its constants.

The plan is a `MemoryPlan` of `Slot`s, computed once by the compiler, saved in the
``.gfm`` (`to_dict`, the manifest's form) and read by the runtime as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemforge.hw.config import AccelConfig
from gemforge.hw.program import arena_alignment

from .ir import Graph
from .partition import AccelLayer, accel_runs, host_reads

__all__ = ["pack_layouts", "plan_memory", "plan_alignment", "slot_key", "Slot", "MemoryPlan"]


@dataclass(frozen=True)
class Slot:
    """One packed tensor's block of the activation arena, and the accelerator nodes (indices
    into the graph's nodes) between which it is live."""

    tensor: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    first: int
    last: int
    produced: bool        # an accelerator node writes it (else the host copies it in)
    offset: int
    size: int             # ``nbytes`` rounded up to the plan's alignment

    @property
    def key(self) -> tuple:
        return slot_key(self.tensor, (self.shape, self.dtype))


@dataclass(frozen=True)
class MemoryPlan:
    """The activation arena: its slots, its size, and how its offsets and its start align."""

    slots: tuple[Slot, ...]
    peak_bytes: int
    naive_bytes: int          # every slot its own block: what reuse saves
    alignment: int            # slot offsets are multiples of this (`plan_alignment`)
    arena_alignment: int      # the arena starts at a multiple of this (`hw.program.arena_alignment`)
    #: Lifetimes widened to whole accelerator runs (`pack_layouts`), so a run may be one
    #: program; False for a plan of a model file from before (one program per layer).
    run_wide: bool = True

    @property
    def handovers(self) -> int:
        """Slots an accelerator layer writes and a later one reads in place (handed over in DRAM)."""
        return sum(1 for s in self.slots if s.produced and s.last > s.first)

    def summary(self) -> dict[str, int]:
        """The figures the reports give (`ir.MEMORY_FIGURES`)."""
        return {"peak_bytes": self.peak_bytes, "naive_bytes": self.naive_bytes, "tensors": len(self.slots),
                "handovers": self.handovers}

    def by_key(self) -> dict[tuple, Slot]:
        return {slot.key: slot for slot in self.slots}

    def to_dict(self) -> dict:
        """The manifest's form (the arena's alignment follows from the config)."""
        return {"tensors": [{"tensor": s.tensor, "shape": list(s.shape), "dtype": s.dtype, "nbytes": s.nbytes,
                             "first": s.first, "last": s.last, "produced": s.produced, "offset": s.offset,
                             "size": s.size} for s in self.slots],
                "peak_bytes": self.peak_bytes, "naive_bytes": self.naive_bytes, "alignment": self.alignment}

    @classmethod
    def from_dict(cls, plan: dict, config: AccelConfig, *, run_wide: bool = True) -> MemoryPlan:
        """The plan of a manifest's form (checked by the `.gfm` loader before, which says whether
        its lifetimes are ``run_wide``)."""
        slots = tuple(Slot(t["tensor"], tuple(t["shape"]), t["dtype"], t["nbytes"], t["first"], t["last"],
                           bool(t.get("produced", False)), t["offset"], t["size"]) for t in plan.get("tensors", []))
        return cls(slots, plan.get("peak_bytes", 0), plan.get("naive_bytes", 0), plan.get("alignment", 1),
                   arena_alignment(config), run_wide)


def slot_key(tensor: str, layout) -> tuple:
    """The memory plan's key of ``tensor`` in a packed ``layout`` ((shape, dtype)): one
    slot per tensor and layout, shared by a producer and the consumers that read it in place."""
    shape, dtype = layout
    return tensor, tuple(shape), dtype


def pack_layouts(graph: Graph, layers: dict[str, AccelLayer], *, run_wide: bool = True) -> list[dict]:
    """The device-resident tensors: each accelerator node's packed inputs and output,
    one entry per (tensor, packed layout); an input whose packed layout is its
    producer's output layout is the same entry (handed over in DRAM). Returns them in
    first-use order with their lifetimes (indices into ``graph.nodes``).

    A lifetime spans the accelerator nodes that use the tensor, widened to what one program
    per accelerator run (`partition.accel_runs`) needs: a tensor the host writes is live from
    the start of the run that reads it (the host writes it before the run starts), and one the
    host reads to the end of the run that writes it (the host reads it after the run ends).
    Without ``run_wide``, the lifetimes model files had before runs were chained (a run of one
    program per layer)."""
    tensors: dict[tuple, dict] = {}

    def touch(name: str, layout, step: int, role: str) -> None:
        key = slot_key(name, layout)
        _, shape, dtype = key
        entry = tensors.setdefault(key, {"tensor": name, "shape": shape, "dtype": dtype,
                                         "nbytes": int(np.prod(shape)) * np.dtype(dtype).itemsize,
                                         "first": step, "last": step, "produced": False})
        entry["last"] = max(entry["last"], step)
        if role == "out":
            entry["produced"] = True
    for step, node in enumerate(graph.nodes):
        if node.device == "accel":
            layer = layers[node.name]
            for tensor, name in layer.bound_inputs(node):
                touch(tensor, layer.packed(name), step, "in")
            touch(node.output, layer.packed_out, step, "out")
    if not run_wide:
        return list(tensors.values())
    run_of = {}
    for first, last in accel_runs(graph, layers):
        run_of.update((step, (first, last)) for step in range(first, last + 1))
    read = host_reads(graph, layers)
    for entry in tensors.values():
        start, end = run_of[entry["first"]]
        if not entry["produced"]:
            entry["first"] = start
        elif entry["tensor"] in read:
            entry["last"] = max(entry["last"], end)
    return list(tensors.values())


def plan_alignment(config: AccelConfig) -> int:
    """Tensor offsets in the activation arena are multiples of this: every entry size
    and the bus width (so a bound tensor relocates by whole entries)."""
    return max(config.bus_bytes, *(config.entry_bytes(b) for b in ("inp", "wgt", "acc", "out")))


def plan_memory(graph: Graph, tensors: list[dict], config: AccelConfig) -> MemoryPlan:
    """Static offsets for the device-resident ``tensors`` (from `pack_layouts`): tensors with
    overlapping lifetimes never overlap in memory. Returns the plan: offsets, the arena's
    peak size and the naive sum (every tensor its own buffer)."""
    align = plan_alignment(config)
    placed: list[dict] = []
    for entry in sorted(tensors, key=lambda e: (-e["nbytes"], e["first"])):
        size = -(-entry["nbytes"] // align) * align
        busy = sorted((p["offset"], p["offset"] + p["size"]) for p in placed
                      if p["first"] <= entry["last"] and entry["first"] <= p["last"])
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        entry.update(offset=offset, size=size)
        placed.append(entry)
    peak = max((p["offset"] + p["size"] for p in placed), default=0)
    naive = sum(p["size"] for p in placed)
    plan = MemoryPlan(tuple(Slot(e["tensor"], tuple(e["shape"]), e["dtype"], e["nbytes"], e["first"], e["last"],
                                 e["produced"], e["offset"], e["size"]) for e in tensors),
                      peak, naive, align, arena_alignment(config))
    graph.notes.memory = plan.summary()
    return plan
