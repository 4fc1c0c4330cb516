"""Where a compile asks the tuning records for its schedule, and where tuning finds its tasks.

An operator's compile calls `choice` at the point it would pick a schedule knob itself (a CPU
product's register tile, an accelerator convolution's tiling). Outside `applied` and `recording`
it gets None and keeps its own choice. Inside `applied(records)` it gets the configuration the
records hold for its workload on its target, checked against the operator's own candidates: a
configuration that is not one of them is refused, naming the workload. Inside `recording()` every
call also leaves a `Task`: what `gemforge tune` measures.

The dispatch is TVM's ``apply_history_best`` context, kept small: a record applies to one
operator kind, one workload (the compile's arguments) and one target (`target_identity`).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from ..errors import CompileError

__all__ = ["Task", "active", "choice", "applied", "recording", "target_identity", "workload_key", "canonical",
           "TuningError"]


class TuningError(CompileError):
    """A tuning log or record that cannot be used, or a tuning run that cannot go on."""


@dataclass(frozen=True)
class Task:
    """One operator instance to tune.

    ``build`` compiles the operator as the model does (a picklable callable: dask workers run
    it), under whatever configuration `applied` gives; ``candidates`` lists the configurations it
    may take with the operator's own estimate of each (lower is faster); ``default`` is the one
    the compile picks untuned."""

    kind: str
    target: dict[str, Any]
    workload: dict[str, Any]
    default: dict[str, Any]
    candidates: Callable[[], list[tuple[dict[str, Any], float]]]
    build: Callable[[], Any]

    @property
    def key(self) -> str:
        return record_key(self.kind, self.target, self.workload)


_APPLIED: ContextVar[dict[str, tuple[dict, bool]] | None] = ContextVar("gemforge_tuning_applied", default=None)
class Recorded(dict):
    """The tasks `recording` found, by key, and how many compiles asked for each (``counts``:
    a network's repeated layers are one task, measured once, weighed by its count)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}


_RECORDING: ContextVar[Recorded | None] = ContextVar("gemforge_tuning_recording", default=None)


def canonical(value: Any) -> Any:
    """JSON's form of a workload or configuration: tuples as lists, numpy integers as ints."""
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "__index__"):
        return int(value)
    if isinstance(value, float):
        return value
    raise TypeError(f"a tuning workload holds numbers, strings, lists and objects, not {type(value).__name__}")


def workload_key(workload: dict[str, Any]) -> str:
    return json.dumps(canonical(workload), sort_keys=True, separators=(",", ":"))


def record_key(kind: str, target: dict[str, Any], workload: dict[str, Any]) -> str:
    return f"{kind}|{workload_key(target)}|{workload_key(workload)}"


def target_identity(target) -> dict[str, Any]:
    """What a measured configuration is valid for: a CPU target's LLVM CPU name, its feature
    string and its thread count; an accelerator config's name and digest (the cycle model's
    figures depend on nothing else)."""
    from ..target import CpuTarget
    if isinstance(target, CpuTarget):
        from ..backends.cpu import _host
        cpu, features = _host(target)
        return {"kind": "cpu", "cpu": cpu, "features": features, "threads": int(target.threads)}
    if getattr(target, "kind", None) == "accel":
        target = target.config
    from gemforge.hw.config import AccelConfig
    if isinstance(target, AccelConfig):
        return {"kind": "accel", "config": target.name, "digest": target.digest}
    raise TuningError(f"tuning measures the cpu and the accelerator, not {getattr(target, 'kind', target)!r}")


def active() -> bool:
    """Whether a compile must ask `choice` (records applied, or tasks recorded)."""
    return _APPLIED.get() is not None or _RECORDING.get() is not None


def choice(kind: str, target: dict[str, Any], workload: dict[str, Any], *, default: dict[str, Any],
           candidates: Callable[[], list[tuple[dict[str, Any], float]]], build: Callable[[], Any]) -> dict[str, Any]:
    """The configuration a compile of ``kind`` on ``workload`` uses: the applied records' (one
    of ``candidates``, else `TuningError`), else ``default``. Records a `Task` while recording."""
    key = record_key(kind, target, workload)
    recording_into = _RECORDING.get()
    if recording_into is not None:
        if key not in recording_into:
            recording_into[key] = Task(kind, target, canonical(workload), canonical(default), candidates, build)
        recording_into.counts[key] = recording_into.counts.get(key, 0) + 1
    held = (_APPLIED.get() or {}).get(key)
    if held is None:
        return default
    config, strict = held
    if not any(canonical(c) == config for c, _ in candidates()):
        if not strict:
            return default
        raise TuningError(f"the tuning record for {kind} {workload_key(workload)} names {workload_key(config)}, "
                          f"which is not one of the operator's configurations on this target; re-tune, or "
                          f"compile without the log")
    return dict(config)


@contextmanager
def applied(records: Iterable, *, strict: bool = True) -> Iterator[None]:
    """Compiles inside use ``records``' configurations (`Record`s or their dicts) where their
    kind, target and workload match; inner contexts add to and override outer ones. A record
    naming no configuration of its operator is refused (`TuningError`), or with ``strict=False``
    (the logs shipped with gemforge, `log.default_records`) passed over."""
    table = dict(_APPLIED.get() or {})
    for r in records:
        r = r if isinstance(r, dict) else r.as_dict()
        table[record_key(r["kind"], r["target"], r["workload"])] = (canonical(r["config"]), strict)
    token = _APPLIED.set(table)
    try:
        yield
    finally:
        _APPLIED.reset(token)


@contextmanager
def recording() -> Iterator[Recorded]:
    """Collect the `Task` of every tunable compile inside (once per kind, target and workload)."""
    into = Recorded()
    token = _RECORDING.set(into)
    try:
        yield into
    finally:
        _RECORDING.reset(token)
