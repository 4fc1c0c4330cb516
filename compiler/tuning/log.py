"""Tuning logs: what `gemforge tune` found, as JSON lines.

The first line is the header: the format and its version, the version of the search space
(`SPACE_VERSION`: a log from a space whose knobs meant something else is refused), the target
the configurations were measured on (`dispatch.target_identity`), the device that measured them
(``cpu``: this machine's clock; ``fsim``: the accelerator's calibrated cycle model), the ONNX
model's SHA-256 (None: a log for any model, e.g. one of common shapes), the seed and the trial
budget. Every other line is a `Record`: an operator kind, its workload, the best configuration
found, its cost and the untuned configuration's, in the device's unit (seconds or cycles).

A log is read whole and checked before any of it is used (`TuningLog.load`): a malformed one is
refused with one sentence. `TuningLog.applicable` says in one sentence why a well-formed log does
not apply to a compile (another model, CPU or config): the compile goes on untuned.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from gemforge.files import write_text_atomic

from .dispatch import TuningError, canonical, record_key, workload_key

__all__ = ["Record", "TuningLog", "records_from_dicts", "default_records", "DEFAULTS", "FORMAT", "FORMAT_VERSION",
           "SPACE_VERSION", "MAX_LOG_BYTES"]

FORMAT = "gemforge-tuning"
FORMAT_VERSION = 1
#: Bumped whenever a kind's knobs change meaning (`space`): older logs are refused.
SPACE_VERSION = 1
#: A tuning log larger than this is refused unread (a log holds one line per tuned operator).
MAX_LOG_BYTES = 16 << 20
#: The most records a model file keeps.
MAX_RECORDS = 100_000
#: The operator kinds a log may hold, by the device that measures them.
KINDS = {"cpu": ("cpu.conv2d", "cpu.dense"), "fsim": ("accel.conv2d",)}
UNITS = {"cpu": "seconds", "fsim": "cycles"}


@dataclass
class Record:
    """The best configuration found for one operator."""

    kind: str
    target: dict[str, Any]
    workload: dict[str, Any]
    config: dict[str, Any]
    cost: float
    default_cost: float
    trials: int

    @property
    def key(self) -> str:
        return record_key(self.kind, self.target, self.workload)

    @property
    def gain(self) -> float:
        """The untuned configuration's cost over the tuned one's (≥ 1: the default is a trial)."""
        return self.default_cost / self.cost if self.cost > 0 else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "workload": self.workload, "config": self.config,
                "cost": self.cost, "default_cost": self.default_cost, "trials": self.trials}


@dataclass
class TuningLog:
    device: str
    target: dict[str, Any]
    model_sha256: str | None
    seed: int
    trials: int
    records: list[Record] = field(default_factory=list)

    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION, "space_version": SPACE_VERSION, "device": self.device,
                "unit": UNITS[self.device], "target": self.target, "model_sha256": self.model_sha256,
                "seed": self.seed, "trials": self.trials}

    def save(self, path: str | Path) -> None:
        """Write the log whole or not at all (`gemforge.files.write_text_atomic`)."""
        write_text_atomic(path, "".join(json.dumps(line, sort_keys=True) + "\n"
                                        for line in [self.header(), *(r.as_dict() for r in self.records)]))

    @classmethod
    def load(cls, path: str | Path) -> TuningLog:
        """The log at ``path``, checked whole; `TuningError` names the first problem."""
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_LOG_BYTES:
                raise TuningError(f"tuning log {path} is {size:,} bytes, more than the {MAX_LOG_BYTES:,} a log may be")
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise TuningError(f"cannot read tuning log {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise TuningError(f"tuning log {path} is not UTF-8 text (JSON lines)") from None
        rows = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line)))
            except ValueError as exc:
                raise TuningError(f"tuning log {path}, line {number}: not JSON ({exc.msg})") from None
        if not rows or not isinstance(rows[0][1], dict) or rows[0][1].get("format") != FORMAT:
            raise TuningError(f"{path} is not a gemforge tuning log (its first line must be a header with "
                              f'"format": "{FORMAT}")')
        head = rows[0][1]
        if head.get("version") != FORMAT_VERSION:
            raise TuningError(f"tuning log {path} has format version {head.get('version')!r}; this gemforge reads "
                              f"version {FORMAT_VERSION}")
        if head.get("space_version") != SPACE_VERSION:
            raise TuningError(f"tuning log {path} was made for search space version {head.get('space_version')!r}, "
                              f"this gemforge's is {SPACE_VERSION}: its configurations mean other schedules; re-tune")
        device = head.get("device")
        if device not in KINDS:
            raise TuningError(f"tuning log {path}: device must be {' or '.join(KINDS)}, not {device!r}")
        target, sha = head.get("target"), head.get("model_sha256")
        if not isinstance(target, dict) or target.get("kind") != ("cpu" if device == "cpu" else "accel"):
            raise TuningError(f"tuning log {path}: the header's target does not describe a "
                              f"{'CPU' if device == 'cpu' else 'accelerator config'}")
        if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
            raise TuningError(f"tuning log {path}: model_sha256 must be a SHA-256 in hex or null")
        seed, trials = head.get("seed"), head.get("trials")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (seed, trials)):
            raise TuningError(f"tuning log {path}: seed and trials must be non-negative integers")
        log = cls(device, target, sha, seed, trials)
        seen = set()
        for number, row in rows[1:]:
            record = _record(row, device, target, f"tuning log {path}, line {number}")
            if record.key in seen:
                raise TuningError(f"tuning log {path}, line {number}: a second record for {record.kind} "
                                  f"{workload_key(record.workload)}")
            seen.add(record.key)
            log.records.append(record)
        return log

    def applicable(self, target: dict[str, Any] | None, model_sha256: str | None) -> str | None:
        """None if the log applies to a compile of the model ``model_sha256`` for ``target``
        (`dispatch.target_identity`; None: any), else why not, in one sentence."""
        if self.model_sha256 is not None and model_sha256 is not None and self.model_sha256 != model_sha256:
            return (f"it was tuned for another model (SHA-256 {self.model_sha256[:12]}…, this one is "
                    f"{model_sha256[:12]}…)")
        if target is not None and canonical(target) != canonical(self.target):
            return f"it was measured on {_describe(self.target)}, not {_describe(target)}"
        return None


#: Tuning logs shipped with gemforge, one per accelerator preset (``<name>.jsonl``): the tilings the
#: cycle model found best for the layers of ResNet-18 and MobileNetV2 (`make tuning-defaults`).
DEFAULTS = Path(__file__).parent / "defaults"


@lru_cache(maxsize=None)
def _default_log(name: str) -> TuningLog | None:
    path = DEFAULTS / f"{name}.jsonl"
    return TuningLog.load(path) if path.is_file() else None


def default_records(config) -> list[Record]:
    """The shipped log's records for an accelerator ``config`` (none unless a preset's log exists
    and was measured on exactly this config: same name and digest)."""
    log = _default_log(config.name) if config is not None and config.name.replace("-", "").isalnum() else None
    if log is None or log.device != "fsim" or log.target.get("digest") != config.digest:
        return []
    return list(log.records)


def records_from_dicts(rows: Any, where: str) -> list[Record]:
    """Records kept as dicts (a model file's ``tuning``), each checked as a log's line is."""
    if not isinstance(rows, list) or len(rows) > MAX_RECORDS:
        raise TuningError(f"{where} must be a list of at most {MAX_RECORDS:,} tuning records")
    out = []
    for k, row in enumerate(rows):
        kind = row.get("kind") if isinstance(row, dict) else None
        device = next((d for d, kinds in KINDS.items() if kind in kinds), None)
        if device is None:
            raise TuningError(f"{where}[{k}]: kind must be one of {', '.join(sum(KINDS.values(), ()))}, not {kind!r}")
        target = row.get("target")
        if not isinstance(target, dict):
            raise TuningError(f"{where}[{k}]: target must be a JSON object")
        out.append(_record(row, device, target, f"{where}[{k}]"))
    return out


def _describe(target: dict[str, Any]) -> str:
    if target.get("kind") == "cpu":
        return f"CPU {target.get('cpu')} with {target.get('threads') or 'all'} thread(s) and its features"
    return f"accelerator config {target.get('config')!r} (digest {str(target.get('digest'))[:12]})"


def _record(row: Any, device: str, target: dict, where: str) -> Record:
    if not isinstance(row, dict):
        raise TuningError(f"{where}: a record is a JSON object")
    kind = row.get("kind")
    if kind not in KINDS[device]:
        raise TuningError(f"{where}: kind must be one of {', '.join(KINDS[device])} in a {device} log, not {kind!r}")
    if canonical(row.get("target")) != canonical(target):
        raise TuningError(f"{where}: the record's target is not the header's")
    workload, config = row.get("workload"), row.get("config")
    if not isinstance(workload, dict) or not isinstance(config, dict) or not config:
        raise TuningError(f"{where}: workload and config must be JSON objects")
    cost, default, trials = row.get("cost"), row.get("default_cost"), row.get("trials")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
               for v in (cost, default)):
        raise TuningError(f"{where}: cost and default_cost must be positive finite numbers")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise TuningError(f"{where}: trials must be a positive integer")
    try:
        workload, config = canonical(workload), canonical(config)
    except TypeError as exc:
        raise TuningError(f"{where}: {exc}") from None
    return Record(kind, target, workload, config, float(cost), float(default), trials)
