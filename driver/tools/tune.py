"""``gemforge tune``: search a model's operator schedules and write a tuning log.

The model is compiled as ``gemforge compile`` would compile it, recording every operator whose
schedule a tuning log may choose (`gemforge.compiler.tuning`): for ``--device cpu`` the host
kernels' products (every node of the network on the CPU), for ``--device fsim`` the
accelerator's convolutions (measured on the calibrated cycle model). Each is searched within the
trial and time budgets; the log is rewritten (atomically) after every operator, so an
interrupted run keeps what it found. ``gemforge compile --tuning-log LOG`` uses it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from gemforge.compiler.target import CpuTarget
from gemforge.compiler.tuning import TuningError, recording, target_identity
from gemforge.compiler.tuning.log import KINDS, TuningLog
from gemforge.compiler.tuning.search import DaskMeasurer, LocalMeasurer, tune
from gemforge.compiler.tuning.space import describe

from .progress import ProgressBar

__all__ = ["tune_model"]


def tune_model(model, output: str | Path, *, device: str = "cpu", trials: int = 32, seed: int = 0,
               time_budget: float | None = None, scheduler: str | None = None, quantize: str | None = None,
               calibrate=None, config=None, batch: int = 1, input_shapes=None, progress: bool = True,
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> dict[str, Any]:
    """Tune ``model``'s operators on ``device`` and write the log to ``output``; returns a summary
    (operators, trials, seconds, the estimated gain over the network's tuned operators)."""
    from ..runtime.model import compile_model
    if device not in KINDS:
        raise TuningError(f"tuning measures on {' or '.join(KINDS)} (the accelerator's cycle model), not "
                          f"{device!r}; the GPU back end has no tunable schedule yet")
    if device == "fsim" and quantize is None:
        raise TuningError("--device fsim tunes the accelerator's layers of an int8 network: add --quantize int8")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise TuningError(f"--trials must be a positive integer, not {trials!r}")
    with recording() as found:
        model = compile_model(model, quantize=quantize, calibrate=calibrate,
                              config=(config or "default") if quantize else None, batch=batch,
                              input_shapes=input_shapes)
        if device == "cpu":
            model.compile_host_kernels("cpu", every_node=True)
    tasks = [t for t in found.values() if t.kind in KINDS[device]]
    counts = {t.key: found.counts[t.key] for t in tasks}
    target = target_identity(CpuTarget()) if device == "cpu" else target_identity(model.config)
    tuning_log = TuningLog(device, target, model.graph.notes.model_sha256, seed, trials)
    if not tasks:
        tuning_log.save(output)
        log(f"no tunable operator runs on {device} in this model; wrote an empty log")
        return _summary(tuning_log, output, tasks, counts, None)
    measurer = DaskMeasurer(scheduler, device, target, log) if scheduler else LocalMeasurer(device)
    unit = "ms" if device == "cpu" else "cycles"
    scale = 1e3 if device == "cpu" else 1

    def record_done(record) -> None:
        tuning_log.records.append(record)
        tuning_log.save(output)
        log(f"{record.kind} {_workload_text(record.workload)}: {record.default_cost * scale:,.4g} → "
            f"{record.cost * scale:,.4g} {unit} ({record.gain:.2f}×, {describe(record.kind, record.config)}; "
            f"{record.trials} trials)")

    budget = sum(min(trials, len(t.candidates())) for t in tasks)
    try:
        with ProgressBar(f"tuning {len(tasks)} operators on {device}", budget, progress) as bar:
            result = tune(tasks, device=device, trials=trials, seed=seed, time_budget=time_budget, measurer=measurer,
                          progress=lambda e: bar.advance(f"operator {e['task'] + 1}, trial {e['trial']}/{e['trials']}"),
                          on_record=record_done)
    finally:
        measurer.close()
    if result.stopped:
        log(f"stopped: {result.stopped}")
    for failure in result.failures[:5]:
        log(f"a candidate failed: {failure}")
    return _summary(tuning_log, output, tasks, counts, result)


def _workload_text(workload: dict) -> str:
    if "input" in workload:
        w = workload["weight"]
        return (f"{'x'.join(map(str, workload['input']))} * {w[0]}x{w[1]}x{w[2]}x{w[3]} "
                f"stride {workload['stride']} pad {workload['padding']}")
    return f"{workload['m']}x{workload['k']} @ {workload['k']}x{workload['n']}"


def _summary(tuning_log: TuningLog, output, tasks, counts: dict[str, int], result) -> dict[str, Any]:
    """The run in figures: the tuned operators' total cost per inference, untuned and tuned (each
    weighed by how many of the network's nodes it is)."""
    weighed = [(counts.get(r.key, 1), r) for r in tuning_log.records]
    default = sum(n * r.default_cost for n, r in weighed)
    tuned = sum(n * r.cost for n, r in weighed)
    return {"log": str(output), "device": tuning_log.device,
            "unit": "seconds" if tuning_log.device == "cpu" else "cycles",
            "target": _target_text(tuning_log.target), "operators": len(tasks), "tuned": len(tuning_log.records),
            "trials": result.trials if result else 0, "seconds": round(result.seconds, 2) if result else 0.0,
            "stopped": result.stopped if result else None,
            "operators_cost_untuned": default, "operators_cost_tuned": tuned,
            "gain": round(default / tuned, 4) if tuned else 1.0}


def _target_text(target: dict) -> str:
    if target["kind"] == "cpu":
        return f"cpu {target['cpu']}, {target['threads'] or 'all'} thread(s)"
    return f"accelerator config {target['config']} ({target['digest'][:12]})"


#: The networks whose accelerator layers the shipped tuning logs cover (`write_default_logs`).
DEFAULT_NETWORKS = ("resnet18", "mobilenet_v2")


def merge_logs(logs: list[TuningLog]) -> TuningLog:
    """One log of every operator of ``logs`` (all measured on one target; the cheaper record where
    two tuned the same operator), for any model."""
    first = logs[0]
    if any(log.device != first.device or log.target != first.target for log in logs):
        raise TuningError("merged tuning logs must be measured on one device and target")
    best: dict[str, Any] = {}
    for log in logs:
        for record in log.records:
            if record.key not in best or record.cost < best[record.key].cost:
                best[record.key] = record
    return TuningLog(first.device, first.target, None, first.seed, max(log.trials for log in logs),
                     sorted(best.values(), key=lambda r: r.key))


def write_default_logs(config_names: list[str], trials: int = 32,
                       log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> None:
    """The shipped tuning logs (`compiler/tuning/defaults/<config>.jsonl`): ResNet-18's and
    MobileNetV2's accelerator layers tuned on the cycle model for each preset (deterministic:
    the same files on any machine)."""
    import tempfile

    import numpy as np

    from gemforge.compiler.tuning.log import DEFAULTS
    from gemforge.hw.config import load_config
    from gemforge.models import build_mobilenet_v2, build_resnet18
    builders = {"resnet18": build_resnet18, "mobilenet_v2": build_mobilenet_v2}
    samples = np.random.default_rng(0).normal(size=(1, 1, 3, 224, 224)).astype(np.float32)
    for name in config_names:
        config = load_config(name)
        logs = []
        with tempfile.TemporaryDirectory() as folder:
            for network in DEFAULT_NETWORKS:
                path = Path(folder) / f"{network}.jsonl"
                log(f"tuning {network} for {name} on the cycle model")
                tune_model(builders[network](), path, device="fsim", trials=trials, quantize="int8",
                           calibrate=samples, config=config, log=log)
                logs.append(TuningLog.load(path))
        merge_logs(logs).save(DEFAULTS / f"{name}.jsonl")


if __name__ == "__main__":       # python -m gemforge.driver.tools.tune PRESET… (make tuning-defaults)
    write_default_logs(sys.argv[1:] or ["default"])
