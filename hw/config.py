"""The accelerator's parameter set: one frozen, validated `AccelConfig`.

Every other part of gemforge (the ISA encoder, the functional simulator, the
gateware, the compiler) derives its widths, depths and layouts from this
object, and only from it. Each derived value is a property computed here, in
exactly one place.

On-chip buffers are arrays of *entries*; an entry is the tile one GEMM
micro-op touches. `ENTRY_LAYOUTS` gives each data buffer's entry (rows,
columns and element width, as the fields that set them); a micro-op entry is
one packed `Uop` of ``uop_bits`` (32 or 64). DRAM holds entries in the same
byte layout (row-major, little-endian two's complement), so a DMA moves whole
entries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from gemforge.files import check_regular_input, write_text_atomic

__all__ = [
    "AccelConfig",
    "ConfigError",
    "PRESETS",
    "load_config",
    "SUPPORTED_INPUT_WIDTHS",
    "SUPPORTED_ACC_WIDTHS",
    "SUPPORTED_OUT_WIDTHS",
    "SUPPORTED_BUS_WIDTHS",
    "MAX_BUFFER_DEPTH",
    "BUFFERS",
    "ENTRY_LAYOUTS",
    "MAX_UOP_BITS",
    "MAX_CORE_DIM",
    "QUEUE_DEPTH_RANGE",
    "CLOCK_MHZ_RANGE",
    "BUS_ADDR_BITS",
    "field_rules",
]


class ConfigError(ValueError):
    """An accelerator configuration is invalid; the message names the field and what is allowed."""


#: Element widths (bits) the input and weight operands may have.
SUPPORTED_INPUT_WIDTHS = (8, 16)
#: Accumulator widths (bits).
SUPPORTED_ACC_WIDTHS = (16, 32)
#: Output-buffer widths (bits); never wider than the accumulator.
SUPPORTED_OUT_WIDTHS = (8, 16, 32)
#: AXI data widths (bits) of the DRAM port.
SUPPORTED_BUS_WIDTHS = (64, 128, 256, 512)
#: The deepest buffer an SRAM address field may index. Addresses are at most
#: 16 bits wide so every instruction kind fits a 128- or 256-bit word.
MAX_BUFFER_DEPTH = 1 << 16
#: The on-chip buffers, each sized by ``<name>_buffer_bytes``: input, weight, accumulator,
#: output and micro-op. Every other part names them by these strings.
BUFFERS = ("inp", "wgt", "acc", "out", "uop")
#: Each data buffer's entry: the fields giving its rows, its columns and its element width
#: (`AccelConfig.entry_layout`). fsim's buffers, the datasheet's entry table and the entry
#: sizes read it.
ENTRY_LAYOUTS: dict[str, tuple[str, str, str]] = {
    "inp": ("batch", "block_in", "inp_width"),
    "wgt": ("block_out", "block_in", "wgt_width"),
    "acc": ("batch", "block_out", "acc_width"),
    "out": ("batch", "block_out", "out_width"),
}
#: A packed micro-op must fit one 64-bit word.
MAX_UOP_BITS = 64
#: The largest batch, block_in and block_out (each a power of two from 1).
MAX_CORE_DIM = 256
#: Inclusive range of cmd_queue_depth and token_queue_depth (each a power of two).
QUEUE_DEPTH_RANGE = (2, 4096)
#: Inclusive range of clock_mhz.
CLOCK_MHZ_RANGE = (1, 1000)
#: Width of a byte address on the DRAM bus (AXI4's AxADDR): the accelerator addresses a 4 GiB
#: space, and an access past its top is a fault, never a wrap to address 0.
BUS_ADDR_BITS = 32
#: The fixed widths of instruction fields that do not depend on buffer depths.
DRAM_ADDR_BITS = 32
DMA_SIZE_BITS = 16
DMA_PAD_BITS = 4
LOOP_ITER_BITS = 14
ALU_IMM_BITS = 16


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _bits_for(count: int) -> int:
    """Bits needed to index ``count`` distinct entries (at least 1)."""
    return max(1, (count - 1).bit_length())


class _RepeatedKey(Exception):
    """A JSON object names a field twice (json.loads would keep the last silently)."""


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object without repeated names, as TOML requires of its tables."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen[key] = value
    return seen


@dataclass(frozen=True)
class AccelConfig:
    """One accelerator design point.

    Parameters
    ----------
    name:
        A label carried into generated files; it has no effect on the design.
    batch, block_in, block_out:
        GEMM core shape. A micro-op computes
        ``acc[batch][block_out] += inp[batch][block_in] · wgt[block_out][block_in]ᵀ``.
    inp_width, wgt_width, acc_width, out_width:
        Element widths in bits (signed two's complement).
    inp_buffer_bytes, wgt_buffer_bytes, acc_buffer_bytes, out_buffer_bytes, uop_buffer_bytes:
        On-chip buffer capacities.
    bus_width:
        AXI4 data width of the DRAM port, in bits.
    cmd_queue_depth:
        Depth of each engine's command queue (fetch → load/compute/store).
    token_queue_depth:
        Capacity of each of the four dependency-token queues.
    clock_mhz:
        Target clock frequency for synthesis.
    """

    name: str = "custom"
    batch: int = 1
    block_in: int = 16
    block_out: int = 16
    inp_width: int = 8
    wgt_width: int = 8
    acc_width: int = 32
    out_width: int = 8
    inp_buffer_bytes: int = 32 * 1024
    wgt_buffer_bytes: int = 256 * 1024
    acc_buffer_bytes: int = 128 * 1024
    out_buffer_bytes: int = 32 * 1024
    uop_buffer_bytes: int = 32 * 1024
    bus_width: int = 64
    cmd_queue_depth: int = 512
    token_queue_depth: int = 512
    clock_mhz: float = 100.0

    def __post_init__(self) -> None:
        self._validate()

    # ------------------------------------------------------------------ validation

    def _validate(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigError(f"name must be {_RULES['name']}, not {_echo(self.name)}")
        for field in dataclasses.fields(self):
            if field.name in ("name", "clock_mhz"):
                continue
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{field.name} must be an integer, not {_echo(value)}")
        for field in ("batch", "block_in", "block_out"):
            value = getattr(self, field)
            if not _is_pow2(value) or value > MAX_CORE_DIM:
                raise ConfigError(f"{field} must be {_RULES[field]}, not {_echo(value)}")
        for field in ("inp_width", "wgt_width"):
            value = getattr(self, field)
            if value not in SUPPORTED_INPUT_WIDTHS:
                raise ConfigError(
                    f"{field} must be one of {_fmt(SUPPORTED_INPUT_WIDTHS)} bits, not {_echo(value)}")
        if self.acc_width not in SUPPORTED_ACC_WIDTHS:
            raise ConfigError(
                f"acc_width must be one of {_fmt(SUPPORTED_ACC_WIDTHS)} bits, not {_echo(self.acc_width)}")
        if self.out_width not in SUPPORTED_OUT_WIDTHS:
            raise ConfigError(
                f"out_width must be one of {_fmt(SUPPORTED_OUT_WIDTHS)} bits, not {_echo(self.out_width)}")
        if self.out_width > self.acc_width:
            raise ConfigError(
                f"out_width ({self.out_width}) must not exceed acc_width ({self.acc_width}): "
                "the output buffer holds the low bits of each accumulator")
        if self.bus_width not in SUPPORTED_BUS_WIDTHS:
            raise ConfigError(
                f"bus_width must be one of {_fmt(SUPPORTED_BUS_WIDTHS)} bits, not {_echo(self.bus_width)}")
        for buffer in BUFFERS:
            field = f"{buffer}_buffer_bytes"
            size = getattr(self, field)
            entry = self.entry_bytes(buffer)
            if not _is_pow2(size):
                raise ConfigError(f"{field} must be a power of two, not {_echo(size)}")
            if size < entry:
                raise ConfigError(
                    f"{field} ({size}) is smaller than one {_BUFFER_NAMES[buffer]} entry "
                    f"({entry} bytes for this core shape and width)")
            if size // entry > MAX_BUFFER_DEPTH:
                raise ConfigError(
                    f"{field} ({_echo(size)}) holds {_echo(size // entry)} entries, more than the "
                    f"{MAX_BUFFER_DEPTH} an instruction's SRAM address field can index; "
                    f"use at most {MAX_BUFFER_DEPTH * entry} bytes")
        total = sum(getattr(self, f"{b}_buffer_bytes") for b in BUFFERS)
        if total > MAX_ONCHIP_BYTES:
            raise ConfigError(
                f"the on-chip buffers add up to {total:,} bytes, more than the {MAX_ONCHIP_BYTES:,} "
                "(64 MiB) gemforge models; FPGA block RAM is a few MiB")
        if self.out_depth != self.acc_depth:
            raise ConfigError(
                f"out_buffer_bytes ({self.out_buffer_bytes}) must give the output buffer as many "
                f"entries as the accumulator buffer ({self.acc_depth}), i.e. "
                f"{self.acc_depth * self.out_entry_bytes} bytes: each accumulator write "
                "mirrors its low bits into the output entry of the same index")
        # Depths are capped at MAX_BUFFER_DEPTH, so a micro-op needs at most 3 × 16 bits.
        assert self.uop_bits_used <= MAX_UOP_BITS
        for field in ("cmd_queue_depth", "token_queue_depth"):
            value = getattr(self, field)
            if not _is_pow2(value) or not QUEUE_DEPTH_RANGE[0] <= value <= QUEUE_DEPTH_RANGE[1]:
                raise ConfigError(f"{field} must be {_RULES[field]}, not {_echo(value)}")
        if isinstance(self.clock_mhz, bool) or not isinstance(self.clock_mhz, (int, float)) \
                or not CLOCK_MHZ_RANGE[0] <= self.clock_mhz <= CLOCK_MHZ_RANGE[1]:
            raise ConfigError(f"clock_mhz must be {_RULES['clock_mhz']}, not {_echo(self.clock_mhz)}")
        # One spelling of each value: `clock_mhz = 100` in a file is the preset's 100.0 (its
        # dict, JSON and digest included).
        object.__setattr__(self, "clock_mhz", float(self.clock_mhz))

    # ------------------------------------------------------------------ derived values

    def entry_layout(self, buffer: str) -> tuple[int, int, int]:
        """(rows, columns, element bits) of one entry of the data buffer ``buffer`` ('inp',
        'wgt', 'acc' or 'out'), by `ENTRY_LAYOUTS`."""
        try:
            fields = ENTRY_LAYOUTS[buffer]
        except KeyError:
            raise KeyError(f"unknown data buffer {buffer!r}; expected one of {', '.join(ENTRY_LAYOUTS)}") from None
        rows, cols, bits = (getattr(self, name) for name in fields)
        return rows, cols, bits

    def entry_bytes(self, buffer: str) -> int:
        """Bytes of one entry of ``buffer`` ('inp', 'wgt', 'acc', 'out' or 'uop')."""
        if buffer == "uop":
            return self.uop_bits // 8
        if buffer not in ENTRY_LAYOUTS:
            raise KeyError(f"unknown buffer {buffer!r}; expected one of {', '.join(BUFFERS)}")
        rows, cols, bits = self.entry_layout(buffer)
        return rows * cols * bits // 8

    def depth(self, buffer: str) -> int:
        """Number of entries ``buffer`` holds."""
        return getattr(self, f"{buffer}_buffer_bytes") // self.entry_bytes(buffer)

    inp_entry_bytes = property(lambda self: self.entry_bytes("inp"))
    wgt_entry_bytes = property(lambda self: self.entry_bytes("wgt"))
    acc_entry_bytes = property(lambda self: self.entry_bytes("acc"))
    out_entry_bytes = property(lambda self: self.entry_bytes("out"))
    uop_entry_bytes = property(lambda self: self.entry_bytes("uop"))
    inp_depth = property(lambda self: self.depth("inp"))
    wgt_depth = property(lambda self: self.depth("wgt"))
    acc_depth = property(lambda self: self.depth("acc"))
    out_depth = property(lambda self: self.depth("out"))
    uop_depth = property(lambda self: self.depth("uop"))

    @property
    def inp_index_bits(self) -> int:
        return _bits_for(self.inp_depth)

    @property
    def wgt_index_bits(self) -> int:
        return _bits_for(self.wgt_depth)

    @property
    def acc_index_bits(self) -> int:
        return _bits_for(self.acc_depth)

    @property
    def uop_index_bits(self) -> int:
        return _bits_for(self.uop_depth)

    # Micro-op fields. `src` indexes the input buffer for GEMM and the
    # accumulator for ALU, so it is as wide as the wider of the two.
    @property
    def uop_dst_bits(self) -> int:
        return self.acc_index_bits

    @property
    def uop_src_bits(self) -> int:
        return max(self.inp_index_bits, self.acc_index_bits)

    @property
    def uop_wgt_bits(self) -> int:
        return self.wgt_index_bits

    @property
    def uop_bits_used(self) -> int:
        return self.uop_dst_bits + self.uop_src_bits + self.uop_wgt_bits

    @property
    def uop_bits(self) -> int:
        """Storage width of one micro-op in DRAM and SRAM: 32 or 64 bits."""
        return 32 if self.uop_bits_used <= 32 else 64

    @property
    def sram_addr_bits(self) -> int:
        """Width of a LOAD/STORE SRAM base: enough for the deepest buffer."""
        return max(_bits_for(self.depth(b)) for b in BUFFERS)

    @property
    def bus_bytes(self) -> int:
        return self.bus_width // 8

    @property
    def macs_per_uop(self) -> int:
        return self.batch * self.block_in * self.block_out

    # Limits of instruction fields whose widths do not depend on the buffers: the
    # compiler's planners and passes read them here (the ISA's field tables use the
    # same constants), so no limit is restated elsewhere.
    @property
    def max_loop_iterations(self) -> int:
        """Largest ``iter_out``/``iter_in`` of a GEMM or ALU instruction."""
        return (1 << LOOP_ITER_BITS) - 1

    @property
    def max_dma_pad(self) -> int:
        """Largest zero padding a LOAD adds on one side (``y_pad0`` … ``x_pad1``)."""
        return (1 << DMA_PAD_BITS) - 1

    @property
    def max_dma_size(self) -> int:
        """Largest ``y_size``/``x_size``/``x_stride`` of a LOAD or STORE."""
        return (1 << DMA_SIZE_BITS) - 1

    @property
    def alu_imm_range(self) -> tuple[int, int]:
        """Inclusive range of the ALU's signed immediate operand."""
        return -(1 << (ALU_IMM_BITS - 1)), (1 << (ALU_IMM_BITS - 1)) - 1

    def derived(self) -> dict[str, Any]:
        """Every derived parameter, for `gemforge info` and generated files."""
        out: dict[str, Any] = {}
        for buffer in BUFFERS:
            out[f"{buffer}_entry_bytes"] = self.entry_bytes(buffer)
            out[f"{buffer}_depth"] = self.depth(buffer)
        out.update(
            inp_index_bits=self.inp_index_bits,
            wgt_index_bits=self.wgt_index_bits,
            acc_index_bits=self.acc_index_bits,
            uop_index_bits=self.uop_index_bits,
            uop_dst_bits=self.uop_dst_bits,
            uop_src_bits=self.uop_src_bits,
            uop_wgt_bits=self.uop_wgt_bits,
            uop_bits=self.uop_bits,
            sram_addr_bits=self.sram_addr_bits,
            bus_bytes=self.bus_bytes,
            macs_per_uop=self.macs_per_uop,
            max_loop_iterations=self.max_loop_iterations,
            max_dma_pad=self.max_dma_pad,
            max_dma_size=self.max_dma_size,
            alu_imm_range=list(self.alu_imm_range),
        )
        return out

    # ------------------------------------------------------------------ serialization

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def digest(self) -> str:
        """A short hash of every field but the name: two configs with one name but different
        fields (a file with ``base = "tiny"`` and one field changed keeps the name) differ in it."""
        fields = {k: v for k, v in self.to_dict().items() if k != "name"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> AccelConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"{source} must be a table of fields, not {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        # A key of another type (1, None: a dict built in Python) is unknown too, shown as its
        # repr; so is a name that is not an identifier (quotes show its spaces, escapes its
        # control characters, which would break the message over lines).
        unknown = sorted((_echo(key, quote=not (isinstance(key, str) and key.isidentifier())), isinstance(key, str))
                         for key in data if key not in known)
        if unknown:
            typed = "" if all(is_str for _, is_str in unknown) else " (a field is named by a string)"
            names = [name for name, _ in unknown[:_ECHO_NAMES]]
            more = f" and {len(unknown) - _ECHO_NAMES} more" if len(unknown) > _ECHO_NAMES else ""
            raise ConfigError(
                f"{source} has unknown field(s) {', '.join(names)}{more}{typed}; "
                f"allowed fields are {', '.join(sorted(known))}")
        # A stored config (a program's, a model's) is complete: a missing field must not take
        # the class default under the name of a config whose value differs.
        missing = sorted(known - set(data))
        if missing:
            raise ConfigError(f"{source} lacks field(s) {', '.join(missing)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def save(self, path: str | Path) -> None:
        """Write the config as TOML or JSON, chosen by the file suffix (atomically)."""
        path = Path(path)
        if path.suffix == ".toml":
            write_text_atomic(path, self.to_toml())
        elif path.suffix == ".json":
            write_text_atomic(path, self.to_json())
        else:
            raise ConfigError(f"config file {path} must end in .toml or .json")

    @classmethod
    def load(cls, path: str | Path) -> AccelConfig:
        path = Path(path)
        try:
            check_regular_input(path)
            text = path.read_text(encoding="utf-8-sig")     # a byte-order mark is not part of the text
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start} cannot be decoded)") from None
        try:
            if path.suffix == ".toml":
                data = tomllib.loads(text)
            elif path.suffix == ".json":
                data = json.loads(text, object_pairs_hook=_refuse_repeated_keys)
            else:
                raise ConfigError(f"config file {path} must end in .toml or .json")
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"config file {path} is not valid {path.suffix[1:].upper()}: {exc}") from None
        except _RepeatedKey as exc:
            raise ConfigError(f"config file {path} gives {_echo(exc.args[0])} twice; give each field once") from None
        except ConfigError:
            raise
        except ValueError:       # Python's limit on integer digits (4300), far beyond any field's range
            raise ConfigError(f"config file {path} holds a number with thousands of digits, beyond any field's "
                              "range") from None
        except RecursionError:
            raise ConfigError(f"config file {path} nests too deeply; a config is one table of fields") from None
        return cls.from_file_dict(data, source=f"config file {path}")

    @classmethod
    def from_file_dict(cls, data: Any, *, source: str) -> AccelConfig:
        """A config written by a person: every field given, or ``base = "PRESET"`` naming the
        preset that supplies the fields left out (never an implicit default)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source} must be a table of fields, not {type(data).__name__}")
        data = dict(data)
        base = data.pop("base", None)
        if base is not None:
            if not isinstance(base, str) or base not in PRESETS:
                raise ConfigError(f"{source}: base must name a preset ({', '.join(PRESETS)}), not {_echo(base)}")
            data = {**PRESETS[base].to_dict(), **data}
        known = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(known - set(data))
        if missing and not set(data) - known:    # unknown fields are reported first, by from_dict
            raise ConfigError(f"{source} lacks field(s) {', '.join(missing)}; give every field, or "
                              f"base = \"PRESET\" ({', '.join(PRESETS)}) to take the rest from a preset")
        return cls.from_dict(data, source=source)

    def replace(self, **changes: Any) -> AccelConfig:
        return dataclasses.replace(self, **changes)


#: Upper bound on the sum of the on-chip buffers: far above any FPGA's block RAM, low enough
#: that the simulators' buffer arrays always fit in memory.
MAX_ONCHIP_BYTES = 64 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_BUFFER_NAMES = {"inp": "input", "wgt": "weight", "acc": "accumulator", "out": "output", "uop": "micro-op"}


#: Most characters of a value (a 400-digit number, a page of text) an error message echoes.
_ECHO_LIMIT = 40
#: Most unknown field names one message lists.
_ECHO_NAMES = 10


def _echo(value: Any, *, quote: bool = True) -> str:
    """``value`` as an error message shows it: its repr (a string bare with ``quote=False``),
    cut to its first `_ECHO_LIMIT` characters and '…' when longer."""
    try:
        text = value if isinstance(value, str) and not quote else repr(value)
    except ValueError:      # an integer beyond Python's 4300 digits (given in Python, not in a file)
        if isinstance(value, int):
            return f"an integer of {value.bit_length():,} bits"
        return f"a {type(value).__name__}"
    except Exception:       # a repr that fails otherwise (an object built in Python)
        return f"a {type(value).__name__}"
    return text if len(text) <= _ECHO_LIMIT else text[:_ECHO_LIMIT] + "…"


def _fmt(values: tuple[int, ...]) -> str:
    return ", ".join(str(v) for v in values)


#: What each field may be, as the datasheet's table and the errors of `_validate` say it.
_RULES: dict[str, str] = {
    "name": "1–64 letters, digits, '_', '-' or '.', starting with a letter or digit",
    **{f: f"a power of two between 1 and {MAX_CORE_DIM}" for f in ("batch", "block_in", "block_out")},
    **{f: f"one of {_fmt(SUPPORTED_INPUT_WIDTHS)} bits" for f in ("inp_width", "wgt_width")},
    "acc_width": f"one of {_fmt(SUPPORTED_ACC_WIDTHS)} bits",
    "out_width": f"one of {_fmt(SUPPORTED_OUT_WIDTHS)} bits, at most acc_width",
    **{f"{b}_buffer_bytes": (f"a power of two, at least one {_BUFFER_NAMES[b]} entry and at most "
                             f"{MAX_BUFFER_DEPTH} entries")
       for b in ("inp", "wgt", "acc", "uop")},
    "out_buffer_bytes": "the accumulator's depth times one output entry (as many entries as acc)",
    "bus_width": f"one of {_fmt(SUPPORTED_BUS_WIDTHS)} bits",
    **{f: f"a power of two between {QUEUE_DEPTH_RANGE[0]} and {QUEUE_DEPTH_RANGE[1]}"
       for f in ("cmd_queue_depth", "token_queue_depth")},
    "clock_mhz": f"a number between {CLOCK_MHZ_RANGE[0]} and {CLOCK_MHZ_RANGE[1]}",
}
#: The rule every config obeys across its fields.
_TOTAL_RULE = f"the five buffers add up to at most {MAX_ONCHIP_BYTES:,} bytes (64 MiB)"


def field_rules() -> list[tuple[str, str]]:
    """(field, what it may be) for every `AccelConfig` field in declaration order, then
    ("all buffers", the rule on their total): the ranges `AccelConfig` checks, in words."""
    return [(f.name, _RULES[f.name]) for f in dataclasses.fields(AccelConfig)] + [("all buffers", _TOTAL_RULE)]


#: Named design points. `tiny` keeps tests and RTL builds fast; `default` is the
#: VTA/PYNQ-class design; `large` doubles the array and widens the bus.
PRESETS: dict[str, AccelConfig] = {
    "tiny": AccelConfig(
        name="tiny", batch=1, block_in=4, block_out=4,
        inp_buffer_bytes=1024, wgt_buffer_bytes=4096, acc_buffer_bytes=4096,
        out_buffer_bytes=1024, uop_buffer_bytes=1024, bus_width=64,
        cmd_queue_depth=32, token_queue_depth=32),
    "default": AccelConfig(name="default"),
    "large": AccelConfig(
        name="large", batch=1, block_in=32, block_out=32,
        inp_buffer_bytes=64 * 1024, wgt_buffer_bytes=512 * 1024, acc_buffer_bytes=256 * 1024,
        out_buffer_bytes=64 * 1024, uop_buffer_bytes=64 * 1024, bus_width=256),
    # The board top on a ULX3S (LFE5U-85F, 25 MHz; `gemforge synth --board ulx3s`): tiny's
    # 4x4 core, its buffers and 64 KiB of board memory place, route and meet the 25 MHz clock
    # (BENCHMARKS.md). Larger cores synthesize within the device but have not routed: an 8x8
    # core's router had not converged after 20 minutes, and a 16x16 core (10 of its 16 GEMM
    # lanes' multipliers in LUTs, `gemforge synth --lut-lanes`) fills 90 % of the LUTs, where
    # router2's overuse stopped falling after seven iterations (2.5 hours).
    "ulx3s": AccelConfig(
        name="ulx3s", batch=1, block_in=4, block_out=4,
        inp_buffer_bytes=1024, wgt_buffer_bytes=4096, acc_buffer_bytes=4096,
        out_buffer_bytes=1024, uop_buffer_bytes=1024, bus_width=64,
        cmd_queue_depth=32, token_queue_depth=32, clock_mhz=25),
}


#: Why no config fits the iCE40UP5K (the iCEBreaker's part): the hint of `synth.DEVICES`'s fit
#: check for it, here so that `load_config` can say it without importing the EDA flow. Measured
#: with synth_ice40 at 9d41388: a 1×1 core with a 16-bit accumulator, the smallest buffers and
#: queues of depth 2 needs 19,400 LUT4, tiny's 4×4 core 22,378.
UP5K_TOO_SMALL = ("a smaller core does not help on this part: the accelerator's control plane (four DMA tile "
                  "loaders, three DMA writers, fetch and the registers) needs nearly four times its logic cells "
                  "whatever the core (a 1×1 core: 19,400 LUT4); use --target ecp5-85f")


def load_config(spec: str | Path | AccelConfig | None) -> AccelConfig:
    """A config from a preset name, a .toml/.json path, or an existing config (None: default)."""
    if spec is None:
        return PRESETS["default"]
    if isinstance(spec, AccelConfig):
        return spec
    text = str(spec)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if path.suffix in (".toml", ".json"):
        return AccelConfig.load(path)
    if text == "icebreaker":
        # The one board `gemforge synth --board` knows that has no preset: say why, with the
        # fit check's own figures (its device table's hint), rather than "unknown config".
        raise ConfigError(f"there is no 'icebreaker' preset: the iCEBreaker's iCE40UP5K cannot hold the "
                          f"accelerator, and {UP5K_TOO_SMALL}, with the ulx3s preset for a board")
    raise ConfigError(
        f"unknown config {_echo(text)}: give a preset ({', '.join(PRESETS)}) or a .toml/.json file")
