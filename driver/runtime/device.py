"""The Device API: one interface over every way of running accelerator programs.

A device owns a DRAM image of ``dram_bytes``. The host allocates aligned
buffers in it, copies numpy arrays in and out, loads a `Program` (which
allocates the program's arena, relocates its addresses and writes the
instruction stream and micro-ops), runs it, and reads counters.

Backends implement one method, `Device._execute`, which runs the instruction
stream already in DRAM and returns the run's counters. `fsim` is the
functional simulator; the RTL simulators (`verilator`, `icarus`) are further
backends registered with `register_backend`. The ``cpu`` and ``gpu`` devices
(`host_device`) run the LLVM back ends' kernels behind the same
``run_program`` call.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gemforge.hw.chain import Link, chain_refusal, chain_streams
from gemforge.hw.config import AccelConfig, load_config
from gemforge.hw.isa import encode_program, encode_uops, insn_bytes
from gemforge.hw.program import Program, ProgramError, arena_alignment
from gemforge.hw.regmap import Fault

__all__ = [
    "Device", "DeviceError", "AcceleratorFaultError", "Buffer", "LoadedProgram", "LoadedChain", "RunResult",
    "open_device", "parse_uart_spec", "register_backend", "available_backends", "DEFAULT_DRAM_BYTES",
]

DEFAULT_DRAM_BYTES = 256 * 1024 * 1024


class DeviceError(RuntimeError):
    """A device-level failure: out of DRAM, a bad buffer access, an unknown backend."""


class AcceleratorFaultError(DeviceError):
    """The accelerator ended the program with ERROR: ``fault`` is the `Fault` it reported
    (the same one fsim raises for the program), ``info`` the ERROR_INFO register. The RTL
    simulators raise it as `RtlFaultError`, a board as `BoardFaultError`."""

    def __init__(self, message: str, fault: Fault | None, info: int):
        super().__init__(message)
        self.fault = fault
        self.info = info


@dataclass(frozen=True)
class Buffer:
    """A block of device DRAM: byte ``address`` and size ``nbytes``."""

    address: int
    nbytes: int


@dataclass
class LoadedProgram:
    """A program resident in device DRAM: its arena and instruction stream."""

    program: Program
    arena: Buffer
    insn_buffer: Buffer | None        # None while `Device.load_chain` builds a chain of programs
    insn_count: int
    #: Tensors placed in caller-owned buffers instead of the arena.
    bindings: dict[str, Buffer] = field(default_factory=dict)

    def tensor_buffer(self, name: str) -> Buffer:
        if name in self.bindings:
            return self.bindings[name]
        try:
            region = self.program.tensors[name]
        except KeyError:
            raise DeviceError(f"program has no tensor {name!r}; it has "
                              f"{', '.join(self.program.tensors) or 'none'}") from None
        return Buffer(self.arena.address + region.offset, region.nbytes)


@dataclass
class LoadedChain:
    """Programs resident in device DRAM as one instruction stream (`Device.load_chain`):
    each part's arena, the stream's buffer and where its instructions start in it, and the
    links that end each part but the last."""

    parts: list[LoadedProgram]
    insn_buffer: Buffer
    insn_address: int
    insn_count: int
    links: tuple[Link, ...]

    @property
    def boundaries(self) -> list[int]:
        """The stream index where each part ends (its link, or the final FINISH)."""
        return [link.index for link in self.links] + [self.insn_count - 1]


@dataclass
class RunResult:
    """What a run reports: event counters, for RTL backends the cycle count and
    hardware counters, for the CPU and GPU devices the wall time."""

    counters: dict[str, int]
    cycles: int | None = None
    hw_counters: dict[str, int] = field(default_factory=dict)
    seconds: float | None = None
    #: For a chain, the counters at each link, where the backend can read them: fsim's event
    #: counters as the link starts; the RTL's ``cycles``, ``gemm_active`` and ``gemm_reset``
    #: as it retires.
    marks: list[dict[str, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"counters": dict(self.counters)}
        if self.cycles is not None:
            out["cycles"] = self.cycles
        if self.hw_counters:
            out["hw_counters"] = dict(self.hw_counters)
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 6)
        return out


#: The built-in devices, by what they are: the accelerator (simulated, co-simulated) and
#: the host back ends (LLVM kernels on this CPU, or a GPU). A board is "uart:PORT[@BAUD]".
ACCEL_DEVICES = ("fsim", "verilator", "icarus")
HOST_DEVICES = ("cpu", "gpu")


class Device(ABC):
    """Base class of all accelerator backends: DRAM image, allocator, program loading."""

    kind = "abstract"
    #: Whether it runs host-target kernels (cpu, gpu) rather than accelerator programs.
    host = False

    def __init__(self, config: AccelConfig, dram_bytes: int = DEFAULT_DRAM_BYTES) -> None:
        if dram_bytes <= 0 or dram_bytes % 4096:
            raise DeviceError(f"dram_bytes must be a positive multiple of 4096, not {dram_bytes}")
        self.config = config
        self.dram_bytes = dram_bytes
        self.dram = np.zeros(dram_bytes, dtype=np.uint8)
        # Free list of (address, size), sorted by address, coalesced on free.
        # Address 0 is never handed out, so a zero address is always a bug.
        self._free: list[tuple[int, int]] = [(4096, dram_bytes - 4096)]
        self._allocated: dict[int, int] = {}
        self.last_result: RunResult | None = None

    # ------------------------------------------------------------------ memory

    def alloc(self, nbytes: int, align: int = 64) -> Buffer:
        """Allocate ``nbytes`` of DRAM at a multiple of ``align`` (a power of two)."""
        if nbytes <= 0:
            raise DeviceError(f"allocation size must be positive, not {nbytes}")
        if align <= 0 or align & (align - 1):
            raise DeviceError(f"alignment must be a power of two, not {align}")
        for i, (start, size) in enumerate(self._free):
            address = -(-start // align) * align
            if address + nbytes <= start + size:
                del self._free[i]
                if address > start:
                    self._free.insert(i, (start, address - start))
                    i += 1
                end = address + nbytes
                if end < start + size:
                    self._free.insert(i, (end, start + size - end))
                self._allocated[address] = nbytes
                return Buffer(address, nbytes)
        raise DeviceError(f"out of device DRAM: cannot allocate {nbytes} bytes aligned to {align} "
                          f"in {self.dram_bytes} bytes")

    def free(self, buf: Buffer) -> None:
        if self._allocated.get(buf.address) != buf.nbytes:
            raise DeviceError(f"buffer at {buf.address:#x} is not an allocation of this device")
        del self._allocated[buf.address]
        i = bisect.bisect(self._free, (buf.address, 0))
        self._free.insert(i, (buf.address, buf.nbytes))
        # Coalesce with the neighbours.
        merged: list[tuple[int, int]] = []
        for start, size in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((start, size))
        self._free = merged

    def write(self, buf: Buffer, data: np.ndarray | bytes, offset: int = 0) -> None:
        """Copy raw bytes of ``data`` (C order) into ``buf`` at byte ``offset``."""
        raw = np.frombuffer(bytes(data) if isinstance(data, (bytes, bytearray)) else
                            np.ascontiguousarray(data).tobytes(), dtype=np.uint8)
        if offset < 0 or offset + raw.size > buf.nbytes:
            raise DeviceError(f"write of {raw.size} bytes at offset {offset} overruns the "
                              f"{buf.nbytes}-byte buffer at {buf.address:#x}")
        self._write_bytes(buf.address + offset, raw)

    def read(self, buf: Buffer, dtype: Any = np.uint8, shape: tuple[int, ...] | None = None,
             offset: int = 0) -> np.ndarray:
        """Read ``buf`` (from byte ``offset``) as an array of ``dtype`` and ``shape``."""
        dtype = np.dtype(dtype)
        count = (buf.nbytes - offset) // dtype.itemsize if shape is None else int(np.prod(shape))
        nbytes = count * dtype.itemsize
        if offset < 0 or offset + nbytes > buf.nbytes:
            raise DeviceError(f"read of {nbytes} bytes at offset {offset} overruns the "
                              f"{buf.nbytes}-byte buffer at {buf.address:#x}")
        raw = self._read_bytes(buf.address + offset, nbytes)
        array = raw.view(dtype)
        return array.reshape(shape) if shape is not None else array

    def _write_bytes(self, address: int, raw: np.ndarray) -> None:
        self.dram[address:address + raw.size] = raw

    def _read_bytes(self, address: int, nbytes: int) -> np.ndarray:
        return self.dram[address:address + nbytes].copy()

    # ------------------------------------------------------------------ programs

    def load_program(self, program: Program, bindings: dict[str, Buffer] | None = None) -> LoadedProgram:
        """Place a program in DRAM: arena (micro-ops, constants) and instruction stream.

        ``bindings`` places some of its tensors in buffers the caller owns instead of
        the arena (a network's activations, planned once for all its layers)."""
        loaded, insns = self._place(program, bindings)
        try:
            loaded.insn_buffer, loaded.insn_count = self._write_stream(insns), len(insns)
        except BaseException:
            self.free(loaded.arena)
            raise
        return loaded

    def load_chain(self, parts: list[tuple[Program, dict[str, Buffer]]]) -> LoadedChain:
        """Place programs (each with its bindings, as `load_program`) as one instruction stream
        that runs them in order with one START and one FINISH (`gemforge.hw.chain`). Refuses a
        program that cannot be chained, naming the reason."""
        if not parts:
            raise DeviceError("a chain needs at least one program")
        placed: list = []        # the parts' `LoadedProgram`s, then the stream's buffer
        try:
            streams = []
            for k, (program, bindings) in enumerate(parts):
                loaded, insns = self._place(program, bindings)
                placed.append(loaded)
                reason = chain_refusal(insns)
                if reason is not None:
                    raise DeviceError(f"program {k} of the chain cannot be chained: {reason}")
                streams.append(insns)
            # The links' zero micro-op lies before the stream, in the same buffer (a link
            # replaces a FINISH, so the chain has as many instructions as its parts).
            step = insn_bytes(self.config)
            head = -(-self.config.uop_entry_bytes // step) * step
            buffer = self.alloc(head + sum(map(len, streams)) * step,
                                align=max(64, self.config.bus_bytes, self.config.uop_entry_bytes))
            placed.append(buffer)
            insns, links = chain_streams(streams, buffer.address // self.config.uop_entry_bytes)
            self.write(buffer, bytes(head) + encode_program(insns, self.config))
        except BaseException:
            for loaded in placed:
                self.free(loaded if isinstance(loaded, Buffer) else loaded.arena)
            raise
        return LoadedChain(placed[:-1], buffer, buffer.address + head, len(insns), tuple(links))

    def _place(self, program: Program, bindings: dict[str, Buffer] | None) -> tuple[LoadedProgram, list]:
        """Allocate ``program``'s arena, write its micro-ops and constants, and relocate its
        instructions there (the stream not yet written)."""
        if program.config != self.config:
            raise ProgramError(f"program was built for config {program.config.name!r}, but this "
                               f"device is {self.config.name!r}; configs must match exactly")
        program.check_loadable()
        bindings = dict(bindings or {})
        for name, buf in bindings.items():
            region = program.tensors.get(name)
            if region is None or buf.nbytes < region.nbytes:
                raise DeviceError(f"cannot bind tensor {name!r} of the program to a {buf.nbytes}-byte buffer"
                                  + ("" if region is None else f"; it needs {region.nbytes} bytes"))
        align = arena_alignment(self.config)
        arena = self.alloc(max(program.arena_bytes, align), align=align)
        try:
            insns = program.relocated(arena.address, {n: b.address for n, b in bindings.items()})
            loaded = LoadedProgram(program, arena, None, 0, bindings)
            if program.uops:
                self.write(arena, encode_uops(program.uops, self.config), offset=program.uop_offset)
            for name, data in program.constants.items():
                self.write(loaded.tensor_buffer(name), data)
        except BaseException:
            self.free(arena)
            raise
        return loaded, insns

    def _write_stream(self, insns: list) -> Buffer:
        stream = encode_program(insns, self.config)
        insn_buffer = self.alloc(max(len(stream), insn_bytes(self.config)), align=max(64, self.config.bus_bytes))
        self.write(insn_buffer, stream)
        return insn_buffer

    def unload_program(self, loaded: LoadedProgram | LoadedChain) -> None:
        """Free what `load_program` or `load_chain` allocated."""
        if isinstance(loaded, LoadedChain):
            for part in loaded.parts:
                self.free(part.arena)
        else:
            self.free(loaded.arena)
        self.free(loaded.insn_buffer)

    def run(self, loaded: LoadedProgram | LoadedChain) -> RunResult:
        """Run a loaded program (or chain) to completion and return its counters; a chain's
        result has the counters at each of its links too (`RunResult.marks`)."""
        if isinstance(loaded, LoadedChain):
            result = self._execute(loaded.insn_address, loaded.insn_count, loaded.links)
        else:
            result = self._execute(loaded.insn_buffer.address, loaded.insn_count)
        self.last_result = result
        return result

    def run_program(self, program: Program, inputs: dict[str, np.ndarray],
                    outputs: list[str]) -> tuple[dict[str, np.ndarray], RunResult]:
        """Load ``program``, write ``inputs`` into its tensors, run, read ``outputs``, unload."""
        loaded = self.load_program(program)
        try:
            for name, array in inputs.items():
                region = program.tensors.get(name)
                if region is None:
                    raise DeviceError(f"program has no input tensor {name!r}")
                if tuple(array.shape) != region.shape or array.dtype != np.dtype(region.dtype):
                    raise DeviceError(f"input {name!r} must be {region.dtype}{list(region.shape)}, "
                                      f"not {array.dtype}{list(array.shape)}")
                self.write(loaded.tensor_buffer(name), array)
            result = self.run(loaded)
            results = {}
            for name in outputs:
                region = program.tensors[name]
                results[name] = self.read(loaded.tensor_buffer(name), region.dtype, region.shape)
            return results, result
        finally:
            self.unload_program(loaded)

    @abstractmethod
    def _execute(self, insn_address: int, insn_count: int, links: tuple[Link, ...] = ()) -> RunResult:
        """Run ``insn_count`` instructions starting at byte ``insn_address`` of DRAM. A backend
        that can reports the counters as they stand at each of a chain's ``links`` in
        `RunResult.marks` (or none)."""

    def close(self) -> None:
        """Release backend resources (simulator processes, build handles)."""

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_BACKENDS: dict[str, Callable[..., Device]] = {}


def register_backend(kind: str, factory: Callable[..., Device]) -> None:
    """Make ``open_device(kind, ...)`` construct devices with ``factory(config, **options)``."""
    _BACKENDS[kind] = factory


def available_backends() -> list[str]:
    _register_builtin_backends()
    return sorted(_BACKENDS)


#: A board's serial speed when its spec names none.
DEFAULT_BAUD = 115200


def parse_uart_spec(spec: str) -> tuple[str, int]:
    """``"uart:PORT[@BAUD]"`` (or ``"PORT[@BAUD]"``) → (port, baud)."""
    body = spec[len("uart:"):] if spec.startswith("uart:") else spec
    port, sep, baud = body.rpartition("@")
    if not sep:
        port, baud = body, str(DEFAULT_BAUD)
    if not port:
        raise DeviceError(f"the uart device needs a port: uart:PORT[@BAUD] (e.g. uart:/dev/ttyUSB0@115200), "
                          f"not {spec!r}")
    if not baud.isdigit() or int(baud) <= 0:
        raise DeviceError(f"baud rate must be a positive integer, not {baud!r} (in {spec!r})")
    return port, int(baud)


def open_device(kind: str, config: AccelConfig | str | None = None, **options: Any) -> Device:
    """Open a device of backend ``kind`` ('fsim', 'verilator', 'icarus', 'cpu', 'gpu', 'uart:PORT[@BAUD]') for
    ``config`` (preset, file or object; the cpu and gpu devices need none)."""
    _register_builtin_backends()
    if kind.startswith("uart:"):         # "uart:PORT[@BAUD]", the board backend's spec string
        port, baud = parse_uart_spec(kind)
        kind, options = "uart", {"port": port, "baud": baud, **options}
    if kind in HOST_DEVICES:
        return _BACKENDS[kind](None, **options)
    config = load_config(config)
    try:
        factory = _BACKENDS[kind]
    except KeyError:
        raise DeviceError(f"unknown device {kind!r}; available: {', '.join(sorted(_BACKENDS))}") from None
    return factory(config, **options)


def _register_builtin_backends() -> None:
    """The built-in backends, each imported when first opened (an RTL simulator needs the
    HDL tool chain, the GPU the CUDA driver; neither is needed to open the others)."""
    if "fsim" in _BACKENDS:
        return

    def lazy(module: str, name: str) -> Callable[..., Device]:
        def factory(config, **options):
            from importlib import import_module
            return getattr(import_module(module, __package__), name)(config, **options)
        return factory
    register_backend("fsim", lazy(".fsim_device", "FsimDevice"))
    register_backend("verilator", lazy(".rtl_device", "VerilatorDevice"))
    register_backend("icarus", lazy(".rtl_device", "IcarusDevice"))
    # The LLVM back ends' devices: kernels on this CPU, or on a GPU through CUDA.
    register_backend("cpu", lazy(".host_device", "CpuDevice"))
    register_backend("gpu", lazy(".host_device", "GpuDevice"))
    # A board with the board top (gemforge.hw.board), through its UART bridge: "uart:PORT[@BAUD]".
    register_backend("uart", lazy(".uart_device", "UartDevice"))
