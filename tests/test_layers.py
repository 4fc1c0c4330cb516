"""The import layers: no module imports one of a higher layer, or a sibling of its own layer.

gemforge is built in layers, each importing only those below it (function-level imports
included: an import inside a function is still a dependency, only a hidden one):

0. base: ``gemforge`` itself, its files helpers and the models built in code;
1. the hardware spec: config, ISA, register map, program files, the microarchitecture's facts,
   timing, the assembler and the generated references (``gemforge.hw`` outside the gateware and
   the EDA flow);
2. the executable models of that spec: fsim, its tracer and the cycle model;
3. siblings that must not import each other: the gateware (with the board tops) and the
   compiler's operator level (IR, schedules, back ends, the operator library);
4. siblings again: the EDA and verification flow (Verilog generation, synthesis, the datasheet,
   co-simulation, regression, mutants) and the graph compiler;
5. the runtime: devices, the compiled model and its executor, profiles;
6. the tools: the command line, benchmarks, sweeps, the demo, regression runs.

A test of the structure the docs describe (`compiler/EXTENDING.md`, `hw/EXTENDING.md`): it fails
naming each import that goes up, or across between siblings.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The installed package's folders (pyproject.toml's package-dir).
_FOLDERS = {"gemforge": ROOT / "gemforge", "gemforge.hw": ROOT / "hw", "gemforge.sim": ROOT / "sim",
            "gemforge.compiler": ROOT / "compiler", "gemforge.driver": ROOT / "driver"}

#: (module prefix, layer, group): the longest matching prefix classifies a module; modules of
#: one layer in different groups must not import each other.
_LAYERS = [
    ("gemforge", 0, "base"),
    ("gemforge.hw", 1, "spec"),
    ("gemforge.sim", 2, "models"),
    ("gemforge.hw.gateware", 3, "gateware"), ("gemforge.hw.board", 3, "gateware"),
    ("gemforge.compiler", 3, "compiler"),
    ("gemforge.hw.flow", 4, "flow"), ("gemforge.sim.cosim", 4, "flow"),
    ("gemforge.sim.regress", 4, "flow"), ("gemforge.sim.mutants", 4, "flow"),
    ("gemforge.compiler.graph", 4, "graph"),
    ("gemforge.driver", 5, "runtime"),
    ("gemforge.driver.tools", 6, "tools"),
]


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in _FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            if package == "gemforge" and parts and parts[0] in ("hw", "sim", "compiler", "driver"):
                continue
            modules[".".join([package, *parts])] = path
    return modules


def _imports(name: str, path: Path, modules) -> set[str]:
    """The project's modules that ``name`` imports, anywhere in it."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            # Each name imported: a module of its own (`from . import isa` is gemforge.hw.isa),
            # else something the module `base` defines.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _layer(module: str) -> tuple[int, str]:
    prefix = max((p for p, _, _ in _LAYERS if module == p or module.startswith(p + ".")), key=len)
    return next((layer, group) for p, layer, group in _LAYERS if p == prefix)


def test_no_module_imports_upwards_or_across():
    modules = _modules()
    wrong = []
    for name, path in sorted(modules.items()):
        layer, group = _layer(name)
        for target in sorted(_imports(name, path, modules)):
            target_layer, target_group = _layer(target)
            if target_layer > layer or (target_layer == layer and target_group != group):
                wrong.append(f"{name} ({layer}, {group}) imports {target} ({target_layer}, {target_group})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_layer_check_sees_function_level_imports(tmp_path):
    """The check would catch what it is for: an import inside a function counts."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gemforge.driver.runtime import model\n")
    assert _imports("gemforge.hw.config", module, {"gemforge.driver.runtime.model": module}) == {
        "gemforge.driver.runtime.model"}
    assert _layer("gemforge.driver.runtime.model") > _layer("gemforge.hw.config")
    # Every name of an import statement counts, not the first alone.
    module.write_text("from gemforge.hw import isa, flow\nimport gemforge.hw.isa, gemforge.driver.tools.cli\n")
    known = {m: module for m in ("gemforge.hw", "gemforge.hw.isa", "gemforge.hw.flow", "gemforge.driver.tools.cli")}
    assert _imports("gemforge.hw.config", module, known) == {"gemforge.hw.isa", "gemforge.hw.flow",
                                                              "gemforge.driver.tools.cli"}
