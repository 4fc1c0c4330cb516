"""The `fsim` device backend: the Device API over the functional simulator."""

from __future__ import annotations

from gemforge.hw.chain import Link
from gemforge.hw.config import AccelConfig
from gemforge.sim.fsim import Fsim

from .device import DEFAULT_DRAM_BYTES, Device, RunResult

__all__ = ["FsimDevice"]


class FsimDevice(Device):
    """A `Device` backed by fsim. On-chip state persists across runs, like hardware."""

    kind = "fsim"

    def __init__(self, config: AccelConfig, dram_bytes: int = DEFAULT_DRAM_BYTES) -> None:
        super().__init__(config, dram_bytes)
        self.sim = Fsim(config, self.dram)

    def _execute(self, insn_address: int, insn_count: int, links: tuple[Link, ...] = ()) -> RunResult:
        counters = self.sim.run(insn_address, insn_count, [link.index for link in links])
        return RunResult(counters=counters, marks=self.sim.snapshots)
