"""The program container: instruction words, micro-ops and the DRAM data layout.

A program is *relocatable*: every DRAM address in it (LOAD/STORE ``dram_base``,
micro-op and tensor offsets) is relative to the base of the program's arena,
a block of ``arena_bytes`` that the device allocates when it loads the
program. Loading adds the arena base, in entries of the addressed buffer, to
each LOAD/STORE, which is why arenas are aligned to `arena_alignment`.

File format (little-endian), suffix ``.gfp`` by convention::

    magic    8 bytes   b"GEMFORGE"
    version  u32       FORMAT_VERSION
    hlen     u32       length of the header
    header   hlen      UTF-8 JSON: config, n_insns, n_uops, uop_offset, arena_bytes,
                       tensors (name, offset, shape, dtype), constants (name, nbytes)
    insns    n_insns × insn_bytes(config)
    uops     n_uops × config.uop_entry_bytes
    consts   the constant tensors' bytes, in header order
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gemforge.hw.config import BUFFERS, BUS_ADDR_BITS, AccelConfig, ConfigError
from gemforge.hw.isa import (
    insn_bytes,
    IsaError,
    Instruction,
    Load,
    Store,
    Uop,
    decode_program,
    decode_uops,
    encode_program,
    encode_uops,
    mnemonic,
)

from gemforge.files import write_bytes_atomic

__all__ = ["Program", "TensorRegion", "ProgramError", "arena_alignment", "FORMAT_VERSION"]

MAGIC = b"GEMFORGE"
FORMAT_VERSION = 1


class ProgramError(ValueError):
    """A program file or container is malformed or inconsistent."""


def arena_alignment(config: AccelConfig) -> int:
    """Arenas start at a multiple of this, so relocation is a whole number of entries
    for every buffer (entry sizes are powers of two) and DMA rows stay bus-aligned."""
    return max(4096, config.bus_bytes,
               *(config.entry_bytes(b) for b in BUFFERS))


@dataclass(frozen=True)
class TensorRegion:
    """A named block of the arena holding one host-visible tensor in its device layout."""

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        # Python's integers: a shape read from a file may be far beyond int64 (then refused by
        # the arena check, not wrapped).
        return math.prod(int(d) for d in self.shape) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        return {"name": self.name, "offset": self.offset, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> TensorRegion:
        if not isinstance(data, dict) or not isinstance(data.get("shape"), list):
            raise ProgramError(f"a tensor region is an object with name, offset, shape (a list) and dtype, not "
                               f"{data!r}"[:300])
        region = cls(data["name"], data["offset"], tuple(data["shape"]), data["dtype"])
        region.check()
        return region

    def check(self) -> None:
        """A name, a whole non-negative offset and shape, and a numeric dtype."""
        if not isinstance(self.name, str) or not self.name:
            raise ProgramError(f"a tensor's name must be a non-empty string, not {self.name!r}"[:300])
        if not _is_int(self.offset) or self.offset < 0:
            raise ProgramError(f"tensor {self.name!r}: offset must be a whole number of bytes ≥ 0, not "
                               f"{self.offset!r}"[:300])
        if not all(_is_int(d) and d >= 0 for d in self.shape):
            raise ProgramError(f"tensor {self.name!r}: shape must be whole numbers ≥ 0, not {list(self.shape)}"[:300])
        try:
            dtype = np.dtype(self.dtype) if isinstance(self.dtype, str) else None
        except (TypeError, ValueError):
            dtype = None
        # By name only: ">i4" is an int32 too, but the device reads and writes little-endian.
        if dtype is None or self.dtype not in TENSOR_DTYPES:
            raise ProgramError(f"tensor {self.name!r}: dtype must be one of {', '.join(TENSOR_DTYPES)}, not "
                               f"{self.dtype!r}"[:300])


#: What a tensor region may hold: the accelerator's integer data and the host's floats.
TENSOR_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float32", "float64")
#: The largest arena: the accelerator addresses DRAM with 32 bits.
MAX_ARENA_BYTES = 1 << BUS_ADDR_BITS


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass
class Program:
    """Everything a device needs to run one accelerator program."""

    config: AccelConfig
    instructions: list[Instruction]
    uops: list[Uop] = field(default_factory=list)
    uop_offset: int = 0
    arena_bytes: int = 0
    tensors: dict[str, TensorRegion] = field(default_factory=dict)
    #: Tensor contents written into the arena when the program is loaded (e.g. weights).
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Consistency of the layout: sizes and offsets whole and in range, regions of numeric
        tensors inside the arena, aligned micro-ops."""
        for what, value in (("uop_offset", self.uop_offset), ("arena_bytes", self.arena_bytes)):
            if not _is_int(value) or not 0 <= value <= MAX_ARENA_BYTES:
                raise ProgramError(f"{what} must be a whole number of bytes from 0 to {MAX_ARENA_BYTES} (the "
                                   f"accelerator's 32-bit DRAM addresses), not {value!r}"[:300])
        for name, region in self.tensors.items():
            region.check()
            if name != region.name:
                raise ProgramError(f"tensor {name!r} holds the region of {region.name!r}")
        uop_bytes = len(self.uops) * self.config.uop_entry_bytes
        if self.uop_offset % self.config.uop_entry_bytes:
            raise ProgramError(f"uop_offset {self.uop_offset} is not a multiple of the "
                               f"{self.config.uop_entry_bytes}-byte micro-op size")
        if self.uop_offset + uop_bytes > self.arena_bytes:
            raise ProgramError(f"micro-ops end at byte {self.uop_offset + uop_bytes}, past the "
                               f"{self.arena_bytes}-byte arena")
        for region in self.tensors.values():
            if region.offset < 0 or region.offset + region.nbytes > self.arena_bytes:
                raise ProgramError(f"tensor {region.name} (bytes {region.offset}..{region.offset + region.nbytes})"
                                   f" does not fit the {self.arena_bytes}-byte arena")
        for name, data in self.constants.items():
            if name not in self.tensors:
                raise ProgramError(f"constant {name!r} has no tensor region")
            region = self.tensors[name]
            if tuple(data.shape) != region.shape or data.dtype != np.dtype(region.dtype):
                raise ProgramError(f"constant {name!r} is {data.dtype}{list(data.shape)}, but its region is "
                                   f"{region.dtype}{list(region.shape)}")

    def check_loadable(self) -> None:
        """What a device checks when it loads the program: no two of the tensors and the
        micro-ops share bytes of the arena (loading writes the micro-ops and the constants there),
        and every LOAD and STORE stays inside the arena its addresses are relative to (a
        transfer past it would read or overwrite whatever the device placed there, another
        layer's tensors say)."""
        uop_bytes = len(self.uops) * self.config.uop_entry_bytes
        spans = sorted([(r.offset, r.offset + r.nbytes, f"tensor {r.name}") for r in self.tensors.values() if r.nbytes]
                       + ([(self.uop_offset, self.uop_offset + uop_bytes, "the micro-ops")] if uop_bytes else []))
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:
                raise ProgramError(f"{first} and {second} overlap in the arena (bytes {start}..{end})")
        for index, insn in enumerate(self.instructions):
            if isinstance(insn, (Load, Store)) and insn.y_size and insn.x_size:
                _, end = self.dram_span(insn)
                if end > self.arena_bytes:
                    raise ProgramError(f"instruction {index} ({mnemonic(insn)}) reaches byte {end} of its arena, "
                                       f"past the {self.arena_bytes} bytes the program has (its DRAM addresses are "
                                       "relative to the arena)")

    def dram_span(self, insn: Load | Store) -> tuple[int, int]:
        """The bytes ``start, end`` of the arena a LOAD or STORE of ``y_size, x_size ≥ 1`` moves,
        before relocation: from its first row's first entry to its last row's end."""
        entry = self.config.entry_bytes(insn.dram_buffer)
        return insn.dram_base * entry, insn.dram_end * entry

    def arena_image(self) -> np.ndarray:
        """The arena as loading the program leaves it (`Device.load_program`): the micro-ops
        and the constants at their offsets, zeros elsewhere, as bytes (instructions at arena
        base 0 address it directly)."""
        image = np.zeros(self.arena_bytes, np.uint8)
        if self.uops:
            raw = np.frombuffer(encode_uops(self.uops, self.config), np.uint8)
            image[self.uop_offset:self.uop_offset + raw.size] = raw
        for name, data in self.constants.items():
            raw = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            offset = self.tensors[name].offset
            image[offset:offset + raw.size] = raw
        return image

    # ------------------------------------------------------------------ relocation

    def relocated(self, arena_base: int, bindings: dict[str, int] | None = None) -> list[Instruction]:
        """The instructions with DRAM addresses moved to an arena at ``arena_base``.

        ``bindings`` maps tensor names to byte addresses outside the arena: a LOAD or
        STORE that starts inside a bound tensor's region moves to the bound address
        instead (how a network hands one layer's output to the next in place)."""
        align = arena_alignment(self.config)
        if arena_base % align:
            raise ProgramError(f"arena base {arena_base:#x} is not aligned to {align} bytes")
        bound = []
        for name, address in (bindings or {}).items():
            if name not in self.tensors:
                raise ProgramError(f"cannot bind {name!r}: the program has no such tensor; it has "
                                   f"{', '.join(self.tensors) or 'none'}")
            bound.append((self.tensors[name], address))
        out = []
        for insn in self.instructions:
            if isinstance(insn, (Load, Store)):
                entry = self.config.entry_bytes(insn.dram_buffer)
                start = insn.dram_base * entry
                target = arena_base + start
                for region, address in bound:
                    if region.offset <= start < region.offset + region.nbytes:
                        target = address + start - region.offset
                        break
                if target % entry:
                    raise ProgramError(f"tensor bound at {target - start:#x} is not aligned to the "
                                       f"{entry}-byte entries a {insn.dram_buffer} transfer moves")
                insn = dataclasses.replace(insn, dram_base=target // entry)
            out.append(insn)
        return out

    # ------------------------------------------------------------------ serialization

    def to_bytes(self) -> bytes:
        header = {
            "config": self.config.to_dict(),
            "n_insns": len(self.instructions),
            "n_uops": len(self.uops),
            "uop_offset": self.uop_offset,
            "arena_bytes": self.arena_bytes,
            "tensors": [r.to_json() for r in self.tensors.values()],
            "constants": [{"name": n, "nbytes": int(a.nbytes)} for n, a in self.constants.items()],
        }
        head = json.dumps(header, sort_keys=True).encode()
        parts = [MAGIC, struct.pack("<II", FORMAT_VERSION, len(head)), head,
                 encode_program(self.instructions, self.config),
                 encode_uops(self.uops, self.config)]
        parts += [np.ascontiguousarray(a).tobytes() for a in self.constants.values()]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "program") -> Program:
        if data[:8] != MAGIC:
            raise ProgramError(f"{source} is not a gemforge program (bad magic)")
        try:
            version, hlen = struct.unpack_from("<II", data, 8)
            if version != FORMAT_VERSION:
                raise ProgramError(f"{source} has format version {version}; this gemforge reads {FORMAT_VERSION}")
            if len(data) < 16 + hlen:
                raise ProgramError(f"{source} is truncated: its header needs {hlen} bytes, "
                                   f"{max(0, len(data) - 16)} follow")
            header = json.loads(data[16:16 + hlen])
            config = AccelConfig.from_dict(header["config"], source=f"{source} config")
            for key in ("n_insns", "n_uops"):
                if not _is_int(header[key]) or header[key] < 0:
                    raise ProgramError(f"{source}: {key} must be a whole number ≥ 0, not {header[key]!r}"[:300])
            pos = 16 + hlen
            insn_len = header["n_insns"] * insn_bytes(config)
            uop_len = header["n_uops"] * config.uop_entry_bytes
            consts = sum(int(item["nbytes"]) for item in header["constants"])
            expected = pos + insn_len + uop_len + consts
            if len(data) < expected:
                raise ProgramError(f"{source} is truncated: {len(data)} bytes of the {expected} its header "
                                   "describes")
            insns = decode_program(data[pos:pos + insn_len], config)
            pos += insn_len
            uops = decode_uops(data[pos:pos + uop_len], config)
            pos += uop_len
            tensors = {}
            for r in header["tensors"]:
                region = TensorRegion.from_json(r)
                if region.name in tensors:
                    raise ProgramError(f"{source} describes tensor {region.name!r} twice")
                tensors[region.name] = region
            constants = {}
            for item in header["constants"]:
                region = tensors[item["name"]]
                raw = data[pos:pos + item["nbytes"]]
                if len(raw) != item["nbytes"]:
                    raise ProgramError(f"{source} is truncated")
                constants[region.name] = np.frombuffer(raw, dtype=region.dtype).reshape(region.shape).copy()
                pos += item["nbytes"]
            if pos != len(data):
                raise ProgramError(f"{source} has {len(data) - pos} unexpected trailing bytes")
            try:
                return cls(config, insns, uops, header["uop_offset"], header["arena_bytes"], tensors, constants)
            except ProgramError as exc:
                raise ProgramError(f"{source}: {exc}") from None
        except (KeyError, TypeError, ValueError, ArithmeticError, struct.error, RecursionError) as exc:
            if isinstance(exc, ProgramError):
                raise
            if isinstance(exc, RecursionError):
                raise ProgramError(f"{source} is malformed: its header nests too deeply") from None
            text = str(exc) if isinstance(exc, (ConfigError, IsaError)) else repr(exc)
            if len(text) > 300:       # e.g. a JSON error quoting a whole corrupted header
                text = text[:300] + " …"
            raise ProgramError(f"{source} is malformed: {text}") from None

    def save(self, path: str | Path) -> None:
        write_bytes_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | Path) -> Program:
        path = Path(path)
        if path.exists() and not path.is_file():
            raise ProgramError(f"program {path} is not a regular file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ProgramError(f"cannot read program {path}: {exc.strerror}") from None
        return cls.from_bytes(data, source=f"program {path}")
