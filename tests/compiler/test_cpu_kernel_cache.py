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


# ---------------------------------------------------------------------------- kernels found by their schedule

def _conv_in_network(k: int = 3, features: str = "host"):
    """`_conv` as a network's host layer builds it (`prebuilt.embedded`)."""
    from gemforge.compiler.backends.cpu import prebuilt
    with prebuilt.embedded({}):
        return _conv(k=k, features=features)


def test_a_network_kernel_built_before_is_found_without_lowering(kernel_cache, monkeypatch):
    """Inside a network's build (`prebuilt.embedded`) a kernel built before is found by its
    schedule: nothing is lowered again, and it computes what the first did."""
    import gemforge.compiler.pipeline as pipeline
    first = _conv_in_network()
    assert len(list(kernel_cache.glob("*.sig.json"))) == 1
    monkeypatch.setattr(pipeline, "lower", lambda *a, **k: pytest.fail("a kernel built before was lowered again"))
    again = _conv_in_network()
    assert [b.name for b in again.program.params] == [b.name for b in first.program.params]
    np.testing.assert_array_equal(_run(again), _run(first))
    # Outside a network (an operator compiled on its own) a build lowers, for the whole function.
    with pytest.raises(pytest.fail.Exception, match="lowered again"):
        _conv()


def test_the_schedule_key_is_the_schedule_and_the_cpu(kernel_cache):
    _conv_in_network(k=3), _conv_in_network(k=3), _conv_in_network(k=1), _conv_in_network(k=3, features="host,-avx2")
    assert len(list(kernel_cache.glob("*.sig.json"))) == 3


def test_a_signature_whose_object_is_gone_is_built_again(kernel_cache):
    expected = _run(_conv_in_network())
    for path in kernel_cache.glob("*.o"):
        path.unlink()
    np.testing.assert_array_equal(_run(_conv_in_network()), expected)
    assert len(list(kernel_cache.glob("*.o"))) == 1


def test_collected_kernels_travel_and_load_where_the_cpu_matches(kernel_cache, monkeypatch):
    """What `collecting` gathers survives its archive form (`to_archive`/`from_archive`) and
    loads without the cache; a changed member is refused by name."""
    from gemforge.compiler.backends.cpu import prebuilt
    collected: dict = {}
    with prebuilt.collecting(collected):
        expected = _run(_conv_in_network())
    index, members = prebuilt.to_archive(collected)
    restored = prebuilt.from_archive(index, members)
    assert restored == collected
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    import gemforge.compiler.pipeline as pipeline
    monkeypatch.setattr(pipeline, "lower", lambda *a, **k: pytest.fail("lowered although the kernel came along"))
    with prebuilt.embedded(restored):
        np.testing.assert_array_equal(_run(_conv(k=3)), expected)
    (name,) = [n for n in members if n.endswith(".o")]
    with pytest.raises(ValueError, match="is not the code its index names"):
        changed = bytearray(members[name])
        changed[len(changed) // 2] ^= 0xFF
        prebuilt.from_archive(index, {**members, name: bytes(changed)})
    with pytest.raises(ValueError, match="has no object code or IR"):
        prebuilt.from_archive(index, {n: m for n, m in members.items() if n != name})
