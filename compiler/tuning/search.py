"""The search: measure candidate configurations of each task, chosen by a cost model.

For each task the untuned configuration is measured first (so a record is never slower than
the default by the measurement), then, trial after trial, the candidate a cost model predicts
fastest among those not yet measured, or, one time in ten, a random one (the seed decides which):
AutoTVM's loop with a small model. The model (`CostModel`) is a ridge regression of the
logarithm of the measured cost on `space.features`, the operator's own estimate first; it learns
from every measurement of the same kind, so what one convolution teaches ranks the next one's
candidates. Until it has a few points it ranks by the estimate alone.

A measurement (`measure`) compiles the operator under the configuration and runs it: a CPU kernel
on random data, timed (the best of a few repeats of enough calls to last a couple of
milliseconds), or an accelerator program on the calibrated cycle model (cycles, exact: tuning
on the cycle model is reproducible). Budgets: trials per task and wall-clock seconds in all.
`DaskMeasurer` measures a round's candidates on a dask.distributed cluster's workers at once,
refusing workers whose CPU is not the target's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .dispatch import Task, TuningError, canonical, applied, target_identity
from .log import Record, UNITS
from .space import features

__all__ = ["CostModel", "LocalMeasurer", "DaskMeasurer", "TuneResult", "measure", "tune", "EXPLORATION"]

#: The share of trials that measure a random candidate instead of the model's best.
EXPLORATION = 0.1
#: Rounds in which a CPU task's best configuration and its default are measured again, alternately.
CONFIRM_ROUNDS = 2
#: Points the cost model needs before it ranks by its fit rather than by the estimate alone.
MIN_FIT_POINTS = 4


def measure(task: Task, config: dict[str, Any], device: str, *, repeat: int = 5,
            min_seconds: float = 0.002) -> float:
    """``task``'s cost under ``config``: seconds on this CPU (``cpu``), or cycles on the
    accelerator's cycle model (``fsim``)."""
    with applied([{"kind": task.kind, "target": task.target, "workload": task.workload, "config": config}]):
        op = task.build()
    if device == "fsim":
        from gemforge.sim.cycle_model import run_cycle_model
        return float(run_cycle_model(op.program.instructions, op.program.config).cycles)
    kernel = op.program
    rng = np.random.default_rng(0)
    arrays = [_random(tuple(p.shape), np.dtype(p.dtype), rng) for p in kernel.params]
    kernel(*arrays)                                   # first call: workspaces, pages, caches
    started = time.perf_counter()
    kernel(*arrays)
    once = time.perf_counter() - started
    number = max(1, math.ceil(min_seconds / max(once, 1e-7)))
    best = math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            kernel(*arrays)
        best = min(best, (time.perf_counter() - started) / number)
    return best


def _random(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -128), min(info.max, 127) + 1, size=shape).astype(dtype)


class CostModel:
    """Ridge regression of log(cost) on configuration features, over every measurement of one
    operator kind (`space.features`)."""

    def __init__(self, ridge: float = 1e-2):
        self.ridge = ridge
        self._x: list[list[float]] = []
        self._y: list[float] = []
        self._weights: np.ndarray | None = None

    def add(self, x: list[float], cost: float) -> None:
        self._x.append(x)
        self._y.append(math.log(cost))
        self._weights = None

    def predict(self, xs: np.ndarray) -> np.ndarray:
        """Predicted log-costs (before `MIN_FIT_POINTS` measurements: the estimate's logarithm)."""
        if len(self._y) < MIN_FIT_POINTS:
            return xs[:, 1]
        if self._weights is None:
            x, y = np.asarray(self._x), np.asarray(self._y)
            scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
            gram = (x / scale).T @ (x / scale) + self.ridge * np.eye(x.shape[1])
            self._weights = np.linalg.solve(gram, (x / scale).T @ y) / scale
        return xs @ self._weights


class LocalMeasurer:
    """Measures in this process, one configuration at a time."""

    width = 1

    def __init__(self, device: str):
        self.device = device

    def __call__(self, task: Task, configs: list[dict]) -> list[float | str]:
        return [_measured(task, c, self.device) for c in configs]

    def close(self) -> None:
        pass


def _measured(task: Task, config: dict, device: str) -> float | str:
    """`measure`, or why the configuration failed (a candidate that does not compile)."""
    try:
        return measure(task, config, device)
    except Exception as exc:                          # noqa: BLE001 - a failed candidate, not a failed tuning
        return f"{type(exc).__name__}: {exc}"


def _worker_identity(target: dict) -> dict | None:
    """On a dask worker: this machine's identity for the CPU target a log is tuned for."""
    from ..target import CpuTarget
    return target_identity(CpuTarget(threads=int(target.get("threads", 0))))


class DaskMeasurer:
    """Measures a round's candidates on a dask.distributed cluster, one per worker at a time.
    For the CPU, workers whose CPU (LLVM's name and features) is not the target's are refused:
    their timings would tune another machine. Run one single-threaded worker per machine
    (``dask worker ADDRESS --nworkers 1 --nthreads 1``): two measurements on one machine at once
    disturb each other."""

    def __init__(self, address: str, device: str, target: dict, log: Callable[[str], None] = print):
        try:
            from distributed import Client
        except ImportError:                                      # pragma: no cover - pinned dependency
            raise TuningError("--scheduler needs dask.distributed (pip install distributed)") from None
        try:
            self.client = Client(address, timeout=30)
        except (OSError, TimeoutError) as exc:
            raise TuningError(f"cannot reach the dask scheduler at {address}: {exc}") from None
        self.device = device
        workers = sorted(self.client.scheduler_info()["workers"])
        if device == "cpu":
            identities = self.client.run(_worker_identity, target)
            refused = [w for w in workers if canonical(identities.get(w)) != canonical(target)]
            for w in refused:
                got = identities.get(w) or {}
                log(f"refusing worker {w}: its CPU is {got.get('cpu')} with other features or threads than the "
                    f"target's {target.get('cpu')}")
            workers = [w for w in workers if w not in refused]
        if not workers:
            self.client.close()
            raise TuningError(f"no worker of the dask cluster at {address} can measure for this target "
                              f"({'none has its CPU' if device == 'cpu' else 'it has no workers'})")
        self.workers = workers
        self.width = len(workers)

    def __call__(self, task: Task, configs: list[dict]) -> list[float | str]:
        futures = [self.client.submit(_measured, task, c, self.device, workers=[self.workers[k % len(self.workers)]],
                                      pure=False)
                   for k, c in enumerate(configs)]
        out: list[float | str] = []
        for f in futures:
            try:
                out.append(f.result())
            except Exception as exc:                     # noqa: BLE001 - a worker lost: that trial failed
                out.append(f"worker lost: {type(exc).__name__}: {exc}")
        return out

    def close(self) -> None:
        self.client.close()


@dataclass
class TuneResult:
    records: list[Record]
    tasks: int
    trials: int
    seconds: float
    #: Why tuning stopped before every task had its trials (None: it did not).
    stopped: str | None = None
    failures: list[str] = field(default_factory=list)


def tune(tasks: list[Task], *, device: str, trials: int, seed: int = 0, time_budget: float | None = None,
         measurer=None, progress: Callable[[dict], None] | None = None,
         on_record: Callable[[Record], None] | None = None) -> TuneResult:
    """Search each task's candidates (`measure`), up to ``trials`` each and ``time_budget``
    seconds in all; the best of each task tuned is a `Record` (passed to ``on_record`` as it is
    made). ``progress`` gets a dict after every trial (task index, trial, cost, best, default)."""
    if device not in UNITS:
        raise TuningError(f"tuning measures on the cpu or on fsim (the cycle model), not {device!r}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise TuningError(f"trials must be a positive integer, not {trials!r}")
    if time_budget is not None and not time_budget > 0:
        raise TuningError(f"the time budget must be a positive number of seconds, not {time_budget!r}")
    measurer = measurer or LocalMeasurer(device)
    rng = np.random.default_rng(seed)
    models: dict[str, CostModel] = {}
    started = time.perf_counter()
    records, failures, total, stopped = [], [], 0, None
    for index, task in enumerate(tasks):
        if time_budget is not None and time.perf_counter() - started >= time_budget:
            stopped = f"the time budget of {time_budget:g} s ran out after {index} of {len(tasks)} operators"
            break
        candidates = [(canonical(c), estimate) for c, estimate in task.candidates()]
        configs = [c for c, _ in candidates]
        xs = np.asarray([features(task.kind, c, e) for c, e in candidates])
        model = models.setdefault(task.kind, CostModel())
        costs: dict[int, float] = {}
        default = configs.index(task.default) if task.default in configs else None
        if default is None:
            raise TuningError(f"{task.kind} {task.workload}: the untuned configuration is not among its candidates")
        budget = min(trials, len(configs))
        queue = [default]
        while len(costs) < budget:
            if time_budget is not None and time.perf_counter() - started >= time_budget and costs:
                stopped = f"the time budget of {time_budget:g} s ran out during operator {index + 1} of {len(tasks)}"
                break
            if not queue:
                queue = _next_round(model, xs, costs, min(measurer.width, budget - len(costs)), rng)
            batch, queue = queue, []
            results = measurer(task, [configs[i] for i in batch])
            for i, result in zip(batch, results):
                total += 1
                if isinstance(result, str):
                    if i == default:
                        raise TuningError(f"{task.kind} {task.workload}: the untuned configuration failed: {result}")
                    failures.append(f"{task.kind} {configs[i]}: {result}")
                    costs[i] = math.inf
                else:
                    costs[i] = result
                    model.add(xs[i].tolist(), result)
                if progress:
                    best = min(costs.values())
                    progress({"task": index, "trial": len(costs), "trials": budget, "cost": costs[i], "best": best,
                              "default": costs.get(default)})
        if default in costs:
            best = min(costs, key=lambda i: (costs[i], i != default))
            if best != default and device == "cpu":
                # Timings move by several percent between runs: the winner and the default are
                # measured again, alternately, and the winner kept only if it still wins.
                for _ in range(CONFIRM_ROUNDS):
                    again = measurer(task, [configs[best], configs[default]])
                    total += len(again)
                    for i, result in zip((best, default), again):
                        if not isinstance(result, str):
                            costs[i] = min(costs[i], result)
                if costs[default] <= costs[best]:
                    best = default
            records.append(Record(task.kind, task.target, task.workload, configs[best], costs[best], costs[default],
                                  len(costs)))
            if on_record:
                on_record(records[-1])
        if stopped:
            break
    return TuneResult(records, len(tasks), total, time.perf_counter() - started, stopped, failures)


def _next_round(model: CostModel, xs: np.ndarray, costs: dict[int, float], width: int,
                rng: np.random.Generator) -> list[int]:
    """The next ``width`` candidates to measure: the model's best unmeasured ones, each replaced
    with probability `EXPLORATION` by a random unmeasured one."""
    left = [i for i in range(len(xs)) if i not in costs]
    predicted = model.predict(xs[left])
    ranked = [left[k] for k in np.argsort(predicted, kind="stable")]
    chosen: list[int] = []
    for _ in range(min(width, len(left))):
        pool = [i for i in ranked if i not in chosen]
        chosen.append(int(pool[rng.integers(len(pool))]) if rng.random() < EXPLORATION else pool[0])
    return chosen
