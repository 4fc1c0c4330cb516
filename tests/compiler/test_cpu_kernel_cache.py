"""The CPU kernel cache (`compiler/backends/cpu/cache.py`): a kernel compiled once per machine."""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.compiler.backends.cpu import cache
from gemforge.compiler.ops import host
from gemforge.compiler.target import CpuTarget
from gemforge.driver.runtime.host_device import CpuDevice


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    return tmp_path / "cpu-kernels"


def _conv(k: int = 3, dtype: str = "float32", features: str = "host"):
    return host.compile_conv2d(CpuTarget(features=features), (1, 8, 12, 12), (16, 8, k, k), padding=1, dtype=dtype)


def _run(op, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    args = op.pack_inputs(x=rng.standard_normal((1, 8, 12, 12)).astype(np.float32),
                          w=rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
    return CpuDevice().run_program(op.program, args, [op.output])[0][op.output]


def test_a_kernel_compiles_once_and_is_loaded_after(kernel_cache, monkeypatch):
    first = _conv()
    entries = sorted(p.name for p in kernel_cache.iterdir())
    assert len(entries) == 2 and entries[0].endswith(".ll.z") and entries[1].endswith(".o")
    import gemforge.compiler.backends.cpu as cpu
    monkeypatch.setattr(cpu, "optimize_o3", lambda *a, **k: pytest.fail("a cached kernel was optimized again"))
    again = _conv()
    assert again.program.llvm_ir == first.program.llvm_ir
    np.testing.assert_array_equal(_run(again), _run(first))


def test_the_key_is_the_function_and_the_cpu(kernel_cache):
    three, again, one = _conv(k=3), _conv(k=3), _conv(k=1)
    assert len(list(kernel_cache.glob("*.o"))) == 2
    func = three.program.func
    keys = {cache.kernel_key(func, "znver4", "+avx2"), cache.kernel_key(func, "znver4", "+avx2,+avx512f"),
            cache.kernel_key(func, "haswell", "+avx2"), cache.kernel_key(one.program.func, "znver4", "+avx2")}
    assert len(keys) == 4 and cache.kernel_key(again.program.func, "znver4", "+avx2") in keys


def test_a_damaged_entry_is_compiled_again(kernel_cache):
    expected = _run(_conv())
    for path in kernel_cache.glob("*.o"):
        path.write_bytes(path.read_bytes()[:100])       # cut short: its checksum no longer matches
    np.testing.assert_array_equal(_run(_conv()), expected)
    assert all(len(p.read_bytes()) > 100 for p in kernel_cache.glob("*.o"))   # and kept whole again


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    monkeypatch.chdir(tmp_path)
    assert cache.cache_dir() is None
    _conv()
    assert not list(tmp_path.rglob("*.o"))


def test_a_folder_others_may_write_is_not_used(kernel_cache):
    """The cache holds native code the process runs: a folder others could plant entries in
    (group- or world-writable, or another user's) is skipped, and kernels compile as without it."""
    kernel_cache.mkdir(parents=True)
    kernel_cache.chmod(0o777)
    expected = _run(_conv())
    assert not list(kernel_cache.iterdir())
    kernel_cache.chmod(0o700)
    np.testing.assert_array_equal(_run(_conv()), expected)
    assert len(list(kernel_cache.glob("*.o"))) == 1
