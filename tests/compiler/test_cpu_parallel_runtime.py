"""The parallel-loop runner (`compiler/backends/cpu/runtime.py`, `pool.py`): every iteration of a
parallel loop runs exactly once on any thread count, from several Python threads at once, and
in a forked child; the native runner (Linux) and the Python one agree."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from gemforge.compiler import CpuTarget, build, create_schedule
from gemforge.compiler.backends.cpu import pool, runtime
from gemforge.compiler.te import compute, placeholder


def _counting_kernel(n: int, threads: int):
    """``out[i] = a[i] + 1`` over a parallel loop of ``n`` iterations."""
    a = placeholder((n,), "int32", "a")
    out = compute((n,), lambda i: a[i] + 1, name="out")
    s = create_schedule(out)
    s[out].parallel(s[out].leaf[0])
    return build(s, CpuTarget(threads=threads), [a, out])


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1001])
@pytest.mark.parametrize("threads", [0, 1, 2, 3, 8])
def test_every_iteration_runs_once(n, threads):
    kernel = _counting_kernel(n, threads)
    a = np.arange(n, dtype=np.int32)
    out = np.full(n, -7, np.int32)
    for _ in range(5):
        kernel(a, out)
        np.testing.assert_array_equal(out, a + 1)
        a = out.copy()


def test_kernels_from_several_python_threads_at_once():
    """The pool runs one loop at a time; a loop that finds it taken runs serially, still whole."""
    failures: list[int] = []
    threads = [threading.Thread(target=_loop, args=(_counting_kernel(4099, 0), seed, failures)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and not failures


def _loop(kernel, seed, failures):
    rng = np.random.default_rng(seed)
    for _ in range(200):
        a = rng.integers(-1000, 1000, 4099).astype(np.int32)
        out = np.zeros_like(a)
        kernel(a, out)
        if not np.array_equal(out, a + 1):
            failures.append(seed)


_CHILD = """
import os, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_cpu_parallel_runtime import _counting_kernel
kernel = _counting_kernel(5000, 0)
a = np.arange(5000, dtype=np.int32)
out = np.zeros_like(a)
kernel(a, out)                        # the parent's workers have started
pid = os.fork()
if pid == 0:
    out[:] = 0
    kernel(a, out)                    # the child's own workers
    os._exit(0 if np.array_equal(out, a + 1) else 3)
_, status = os.waitpid(pid, 0)
kernel(a, out)
print(os.waitstatus_to_exitcode(status), int(np.array_equal(out, a + 1)))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_runs_parallel_loops():
    tests = os.path.dirname(__file__)
    done = subprocess.run([sys.executable, "-c", _CHILD.format(tests=tests)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "1"]


@pytest.mark.skipif(not pool.supported(), reason="the native runner runs on Linux x86-64 and AArch64")
def test_the_native_runner_is_the_one_installed():
    _counting_kernel(8, 2)                # installs the runtime
    assert runtime._native is not None
    assert runtime._native._workers.value == min(runtime.cores() - 1, pool.MAX_WORKERS)


_PYTHON_RUNNER = """
import numpy as np, sys
sys.path.insert(0, {tests!r})
from gemforge.compiler.backends.cpu import runtime
from test_cpu_parallel_runtime import _counting_kernel
kernel = _counting_kernel(1001, 2)
a = np.arange(1001, dtype=np.int32)
out = np.zeros_like(a)
kernel(a, out)
print(runtime._native is None, bool(np.array_equal(out, a + 1)))
"""


def test_the_python_runner_remains_where_asked():
    tests = os.path.dirname(__file__)
    done = subprocess.run([sys.executable, "-c", _PYTHON_RUNNER.format(tests=tests)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, GEMFORGE_NATIVE_POOL="0"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]
