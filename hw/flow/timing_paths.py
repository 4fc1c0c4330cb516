"""The slowest register-to-register paths of a routed design, from nextpnr's SDF.

nextpnr reports one critical path per clock: enough for the Fmax, not for deciding what to
pipeline next, since the next paths after it stay hidden. Its SDF back-annotation file
(``--sdf``) holds every cell's delays (clock-to-out, combinational arcs, setup checks) and every
routed connection's delay; `slowest_paths` replays them through a longest-path search and
reports the worst endpoint of each (source signal → endpoint signal) pair: which signals, how
many endpoints share the pair, and the path of the worst one. The worst delay is nextpnr's
critical path (the same delay figures, summed the same way, plus the endpoint's setup time).

Signals are named as nextpnr names cells: Amaranth's hierarchical signal name with the
technology-mapping suffix (``_TRELLIS_FF_Q_3``, ``_LUT4_Z``, ``$CCU2_COMB0``...) cut off and bit
indices written ``#``, so the 32 flip-flops of one register form one group.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from typing import Any

__all__ = ["parse_sdf", "slowest_paths", "signal_group"]

_TOKEN = re.compile(r'\s+|\(|\)|"[^"]*"|(?:\\.|[^\s()"\\])+')
_ESCAPE = re.compile(r"\\(.)")
#: Where a mapped cell's name stops being the Amaranth signal it came from.
_SUFFIX = re.compile(r"(_TRELLIS_|_LUT4|_CCU2C|_PFUMX|_L6MUX|_DPR16X4|\$|_SB_|_ICESTORM_|_DP16KD|_MULT18X18D)")


def _parse_sexpr(text: str) -> list:
    stack: list[list] = [[]]
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token[0].isspace():
            continue
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) < 2:
                raise ValueError("unbalanced parentheses in SDF")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token[1:-1] if token.startswith('"') else _ESCAPE.sub(r"\1", token))
    if len(stack) != 1 or not stack[0] or not isinstance(stack[0][0], list):
        raise ValueError("not an SDF file: expected one (DELAYFILE ...) expression")
    return stack[0][0]


def _worst(values: list) -> float:
    """The largest figure of SDF delay triples ``(min:typ:max)`` (the slow corner), in ps."""
    worst = 0.0
    for value in values:
        if isinstance(value, list) and value and isinstance(value[0], str):
            worst = max([worst] + [float(v) for v in value[0].split(":") if v])
    return worst


def _port(spec: Any) -> str:
    return spec[-1] if isinstance(spec, list) else spec         # (posedge CLK) → CLK


class TimingGraph:
    """Pins ``(instance, port)`` and the delays between them, in ps."""

    def __init__(self):
        self.edges: dict[tuple[str, str], list[tuple[tuple[str, str], float]]] = defaultdict(list)
        self.launch: dict[tuple[str, str], float] = {}      # register outputs: clock-to-out
        self.setup: dict[tuple[str, str], float] = {}       # register inputs: setup time


def parse_sdf(text: str) -> TimingGraph:
    """The timing graph of an SDF file as nextpnr writes it (``TIMESCALE 1ps``, ``DIVIDER /``)."""
    tree = _parse_sexpr(text)
    if tree[0] != "DELAYFILE":
        raise ValueError("not an SDF file: expected (DELAYFILE ...)")
    graph = TimingGraph()
    cells = [c for c in tree[1:] if isinstance(c, list) and c and c[0] == "CELL"]
    # A cell type's clock pins are the references of its timing checks.
    clocks: dict[str, set[str]] = defaultdict(set)
    for cell in cells:
        kind = next((item[1] for item in cell[1:] if item[0] == "CELLTYPE" and len(item) > 1), "")
        for item in cell[1:]:
            if item[0] == "TIMINGCHECK":
                for check in item[1:]:
                    if len(check) > 2:
                        clocks[kind].add(_port(check[2]))
    for cell in cells:
        kind = next((item[1] for item in cell[1:] if item[0] == "CELLTYPE" and len(item) > 1), "")
        instance = next((item[1] if len(item) > 1 else "" for item in cell[1:] if item[0] == "INSTANCE"), "")
        for item in cell[1:]:
            if item[0] == "DELAY":
                for block in item[1:]:
                    for arc in block[1:]:
                        if arc[0] == "IOPATH":
                            source, sink, delay = _port(arc[1]), arc[2], _worst(arc[3:])
                            if source in clocks[kind]:
                                pin = (instance, sink)
                                graph.launch[pin] = max(graph.launch.get(pin, 0.0), delay)
                            else:
                                graph.edges[(instance, source)].append(((instance, sink), delay))
                        elif arc[0] == "INTERCONNECT":
                            source_cell, _, source_port = arc[1].rpartition("/")
                            sink_cell, _, sink_port = arc[2].rpartition("/")
                            graph.edges[(source_cell, source_port)].append(((sink_cell, sink_port), _worst(arc[3:])))
            elif item[0] == "TIMINGCHECK":
                for check in item[1:]:
                    if check[0] in ("SETUP", "SETUPHOLD") and len(check) > 3:
                        pin = (instance, _port(check[1]))
                        if pin[1] not in clocks[kind]:
                            # (SETUPHOLD data clock setup hold): the setup is the first figure.
                            graph.setup[pin] = max(graph.setup.get(pin, 0.0), _worst(check[3:4]))
    return graph


def signal_group(instance: str) -> str:
    """The signal a mapped cell came from, bit indices as ``#`` (``load.reader.count``)."""
    name = instance.lstrip("\\")
    anonymous = re.match(r"\$\w+?\$\d+", name)        # Yosys's $signal$437: its number is its name
    if anonymous:
        return anonymous.group(0)
    return re.sub(r"\d+", "#", _SUFFIX.split(name, maxsplit=1)[0] or name)


def slowest_paths(graph: TimingGraph, limit: int = 10) -> list[dict[str, Any]]:
    """The ``limit`` slowest (source signal → endpoint signal) pairs, worst first: each with its
    worst delay (arrival plus setup, ns), how many endpoints share the pair, and that path's pins."""
    arrival: dict[tuple[str, str], float] = {}
    before: dict[tuple[str, str], tuple[str, str]] = {}
    indegree: dict[tuple[str, str], int] = defaultdict(int)
    for successors in graph.edges.values():
        for pin, _ in successors:
            indegree[pin] += 1
    pins = set(graph.edges) | set(indegree) | set(graph.launch)
    ready = deque(pin for pin in pins if indegree[pin] == 0)
    for pin in pins:
        arrival[pin] = graph.launch.get(pin, float("-inf"))
    while ready:      # a DAG: nextpnr has already refused combinational loops
        pin = ready.popleft()
        for successor, delay in graph.edges.get(pin, ()):
            if arrival[pin] + delay > arrival[successor]:
                arrival[successor] = arrival[pin] + delay
                before[successor] = pin
            indegree[successor] -= 1
            if indegree[successor] == 0:
                ready.append(successor)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for pin, setup in graph.setup.items():
        if arrival.get(pin, float("-inf")) == float("-inf"):
            continue
        path = [pin]
        while path[-1] in before:
            path.append(before[path[-1]])
        path.reverse()
        key = (signal_group(path[0][0]), signal_group(pin[0]))
        total = arrival[pin] + setup
        group = groups.setdefault(key, {"from": key[0], "to": key[1], "delay_ns": 0.0, "endpoints": 0})
        group["endpoints"] += 1
        if total / 1000 > group["delay_ns"]:
            group.update(delay_ns=round(total / 1000, 3),
                         path=[{"pin": f"{cell}.{port}", "arrival_ns": round(arrival[(cell, port)] / 1000, 3)}
                               for cell, port in path])
    return sorted(groups.values(), key=lambda g: -g["delay_ns"])[:limit]
