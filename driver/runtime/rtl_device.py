"""Device backends that run programs on the generated RTL: `verilator` and `icarus`.

``open_device("verilator", config)`` gives a `RtlDevice` with the same API as
the functional simulator. A run copies the device's DRAM window (the span of
every live allocation) into the simulated DRAM, runs the program through the
AXI4-Lite registers until DONE, and copies the window back. The simulator
process starts with the first run and serves every later one (a
`harness.Session`: each run still starts from a reset accelerator with zeroed
buffers) until `close`; a run that writes a waveform has a process of its own.

Options (keyword arguments of `open_device`): ``dram_bytes`` (host image size,
as for every device), ``sim_dram_bytes`` (size of the simulated DRAM window;
default 16 MiB on Verilator, 2 MiB on Icarus), ``stall`` (0–255: probability
/256 that each AXI channel withholds its handshake in a cycle, for protocol
tests), ``seed``, ``watchdog_cycles`` (a run with no progress for that many
cycles fails with the debug state), ``max_cycles`` and ``waves`` (a file: each
run writes its waveform there, VCD on Verilator, FST on Icarus; Verilator then
uses a separately cached build with tracing, which runs slower).
"""

from __future__ import annotations

import json
from pathlib import Path

from gemforge.hw.chain import Link
from gemforge.hw.config import AccelConfig
from gemforge.hw.isa import insn_bytes
from gemforge.hw.regmap import FAULT_DOCS, Fault
from gemforge.sim.cosim import harness

from .device import DEFAULT_DRAM_BYTES, AcceleratorFaultError, Device, DeviceError, RunResult

__all__ = ["RtlDevice", "VerilatorDevice", "IcarusDevice", "RtlHangError", "RtlFaultError"]


class RtlHangError(DeviceError):
    """The RTL stopped making progress (deadlock or protocol hang); the message holds the debug state."""


class RtlFaultError(AcceleratorFaultError):
    """The simulated RTL ended the program with ERROR (``fault``, ``info`` as for any
    `AcceleratorFaultError`)."""


class RtlDevice(Device):
    """A device backed by RTL co-simulation of the generated accelerator."""

    kind = "rtl"
    simulator = "verilator"
    default_sim_dram_bytes = 16 << 20

    def __init__(self, config: AccelConfig, dram_bytes: int = DEFAULT_DRAM_BYTES, *,
                 sim_dram_bytes: int | None = None, stall: int = 0, seed: int = 1,
                 watchdog_cycles: int = 200_000, max_cycles: int = 1 << 40, waves: str | Path | None = None) -> None:
        super().__init__(config, dram_bytes)
        if not 0 <= stall <= 255:
            raise DeviceError(f"stall must be between 0 and 255 (probability in 256ths), not {stall}")
        self.waves = Path(waves) if waves is not None else None
        if self.waves is not None:
            formats = harness.WAVE_FORMATS[self.simulator]
            if self.waves.suffix not in formats:
                raise DeviceError(f"{self.simulator} writes waveforms as {' or '.join(formats)}; name the "
                                  f"waveform file accordingly, not {self.waves.name}")
            if self.waves.is_dir():
                raise DeviceError(f"waveform file {self.waves} is a directory")
        self.stall = stall
        self.seed = seed
        self.watchdog_cycles = watchdog_cycles
        self.max_cycles = max_cycles
        self.sim_dram_bytes = sim_dram_bytes or self.default_sim_dram_bytes
        self._build: harness.Build | None = None
        self._session: harness.Session | None = None

    def build(self) -> harness.Build:
        """Compile the simulation now (otherwise the first run does); cached on disk per config."""
        if self._build is None:
            try:
                self._build = harness.build(self.config, self.simulator, self.sim_dram_bytes,
                                            waves=self.waves.suffix if self.waves else "")
            except harness.CosimError as exc:
                raise DeviceError(str(exc)) from None
        return self._build

    def _window(self, insn_address: int, insn_count: int) -> tuple[int, int]:
        spans = [(a, a + n) for a, n in self._allocated.items()]
        spans.append((insn_address, insn_address + insn_count * insn_bytes(self.config)))
        lo = min(s for s, _ in spans) // 4096 * 4096
        hi = -(-max(e for _, e in spans) // 4096) * 4096
        return lo, hi

    def _execute(self, insn_address: int, insn_count: int, links: tuple[Link, ...] = ()) -> RunResult:
        built = self.build()
        lo, hi = self._window(insn_address, insn_count)
        marks = tuple(link.compute_ordinal for link in links)
        if hi - lo > built.dram_bytes:
            raise DeviceError(f"the live DRAM allocations span {hi - lo} bytes, more than the "
                              f"{built.dram_bytes}-byte simulated DRAM; open the device with "
                              f"sim_dram_bytes={1 << (hi - lo - 1).bit_length()}")
        try:
            if self.waves is not None:
                image, result = harness.run(built, self.dram[lo:hi], lo, insn_address, insn_count,
                                            stall=self.stall, seed=self.seed, max_cycles=self.max_cycles,
                                            watchdog_cycles=self.watchdog_cycles, waves=self.waves, marks=marks)
            else:
                if self._session is None:
                    self._session = harness.Session(built, stall=self.stall, seed=self.seed)
                image, result = self._session.run(self.dram[lo:hi], lo, insn_address, insn_count,
                                                  max_cycles=self.max_cycles, watchdog_cycles=self.watchdog_cycles,
                                                  marks=marks)
        except harness.CosimError as exc:
            self.close()            # a session that failed is not reused
            raise DeviceError(str(exc)) from None
        status = result.get("status")
        if status == "hang":
            raise RtlHangError(
                f"{self.simulator}: no progress for {self.watchdog_cycles} cycles after "
                f"{result['cycles']} cycles; debug state: {json.dumps(result['debug'])}")
        if status == "timeout":
            raise DeviceError(f"{self.simulator}: run exceeded {self.max_cycles} cycles; "
                              f"debug state: {json.dumps(result['debug'])}")
        if status == "fault":
            name = result.get("fault", "")
            fault = Fault[name] if name in Fault.__members__ else None
            why = FAULT_DOCS[fault] if fault is not None else name
            raise RtlFaultError(f"{self.simulator}: the accelerator ended the program with fault {name} "
                                f"({why}; ERROR_INFO = {result.get('fault_info', 0):#x})",
                                fault, result.get("fault_info", 0))
        if status != "done":
            raise DeviceError(f"{self.simulator}: testbench error: {result.get('message', result)}")
        if result["oob"]:
            raise DeviceError(f"{self.simulator}: the accelerator accessed DRAM outside the "
                              f"live allocations [{lo:#x}, {hi:#x})")
        self.dram[lo:hi] = image
        counters = result["counters"]
        hw = dict(counters)
        hw["sim_wall_s"] = result["wall_s"]
        # Event counts under fsim's names where the meaning is the same.
        return RunResult(counters={"insns": counters["insns_retired"],
                                   "gemm_uops": counters["gemm_active"],
                                   "gemm_reset_uops": counters["gemm_reset"],
                                   "alu_uops": counters["alu_active"],
                                   "dma_bytes_read": counters["dma_bytes_read"],
                                   "dma_bytes_written": counters["dma_bytes_written"]},
                         cycles=counters["cycles"], hw_counters=hw, marks=result.get("marks", []))


    def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()


class VerilatorDevice(RtlDevice):
    kind = "verilator"
    simulator = "verilator"
    default_sim_dram_bytes = 16 << 20


class IcarusDevice(RtlDevice):
    kind = "icarus"
    simulator = "icarus"
    default_sim_dram_bytes = 2 << 20
