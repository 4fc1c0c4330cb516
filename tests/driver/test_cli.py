"""The `gemforge` command line, end to end, including its error messages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from gemforge.driver.tools.cli import main
from gemforge.hw import isa
from gemforge.hw.config import PRESETS


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", PRESETS)
def test_run_op_gemm_matches_numpy_on_every_preset(tmp_path, capsys, name):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    m, k, n = (int(v) for v in rng.integers(1, 80, 3))
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    code, out, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                         "-o", tmp_path / "c.npy", "--config", name, "--stats")
    assert code == 0, err
    c = np.load(tmp_path / "c.npy")
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))
    stats = json.loads(out)
    assert stats["counters"]["gemm_uops"] > 0 and stats["output"] == {"shape": [m, n], "dtype": "int32"}


@pytest.mark.parametrize("latency", [[], ["--no-latency-hiding"]])
@pytest.mark.parametrize("epilogue", [[], ["--shift", "7"], ["--shift", "5", "--relu"], ["--relu"]])
def test_run_op_dense_with_epilogue(tmp_path, capsys, latency, epilogue):
    rng = np.random.default_rng(len(epilogue) + 10 * len(latency))
    a = rng.integers(-128, 128, (21, 40), dtype=np.int8)
    b = rng.integers(-128, 128, (40, 19), dtype=np.int8)
    bias = rng.integers(-5000, 5000, 19, dtype=np.int32)
    for name, arr in (("a", a), ("b", b), ("bias", bias)):
        np.save(tmp_path / f"{name}.npy", arr)
    code, out, err = run(capsys, "run-op", "dense", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                         "--bias", tmp_path / "bias.npy", "-o", tmp_path / "c.npy", "--config", "tiny",
                         "--stats", *latency, *epilogue)
    assert code == 0, err
    acc = a.astype(np.int64) @ b.astype(np.int64) + bias
    if "--shift" in epilogue:
        shift = int(epilogue[epilogue.index("--shift") + 1])
        expect = np.clip(acc >> shift, 0 if "--relu" in epilogue else -128, 127).astype(np.int8)
    else:
        expect = (np.maximum(acc, 0) if "--relu" in epilogue else acc).astype(np.int32)
    got = np.load(tmp_path / "c.npy")
    assert got.dtype == expect.dtype
    np.testing.assert_array_equal(got, expect)
    assert json.loads(out)["latency_hiding"] is (not latency)


@pytest.mark.parametrize("stride, padding, kernel", [(1, 1, 3), (2, 0, 1), (2, 3, 7)])
def test_run_op_conv2d(tmp_path, capsys, stride, padding, kernel):
    rng = np.random.default_rng(stride * 100 + kernel)
    x = rng.integers(-128, 128, (1, 5, 9, 10), dtype=np.int8)
    w = rng.integers(-128, 128, (6, 5, kernel, kernel), dtype=np.int8)
    bias = rng.integers(-1000, 1000, 6, dtype=np.int32)
    for name, arr in (("x", x), ("w", w), ("bias", bias)):
        np.save(tmp_path / f"{name}.npy", arr)
    code, _, err = run(capsys, "run-op", "conv2d", "--input", tmp_path / "x.npy", "--weight", tmp_path / "w.npy",
                       "--bias", tmp_path / "bias.npy", "--stride", stride, "--padding", padding,
                       "--shift", 6, "--relu", "-o", tmp_path / "y.npy", "--config", "tiny")
    assert code == 0, err
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (9 + 2 * padding - kernel) // stride + 1
    ow = (10 + 2 * padding - kernel) // stride + 1
    acc = np.zeros((1, 6, oh, ow), np.int64)
    for i in range(kernel):
        for j in range(kernel):
            patch = xp[:, :, i:i + (oh - 1) * stride + 1:stride, j:j + (ow - 1) * stride + 1:stride]
            acc += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(np.int64))
    expect = np.clip((acc + bias[None, :, None, None]) >> 6, 0, 127).astype(np.int8)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expect)


@pytest.mark.parametrize("trace", [False, True])
def test_compile_op_of_a_global_max_pool(trace, tmp_path, capsys):
    """A 28x28 window (no --kernel) reduces through a 784-deep chain of maxima, which formatting
    the IR for a trace that discarded it overflowed the stack on (a RecursionError traceback)."""
    extra = ["--trace"] if trace else []
    code, out, err = run(capsys, "compile-op", "max-pool", "--shape", "1,16,28,28", "--dtype", "int32", "--config",
                         "default", "-o", tmp_path / "p.gfp", *extra)
    assert code == 0, err
    assert "nested too deeply to print" in err if trace else "Traceback" not in err


def test_compile_op_then_disasm(tmp_path, capsys):
    code, out, err = run(capsys, "compile-op", "conv2d", "--input-shape", "1,16,8,8", "--weight-shape",
                         "16,16,3,3", "--padding", "1", "--bias", "--shift", "8", "-o", tmp_path / "c.gfp")
    assert code == 0, err
    summary = json.loads(out)
    assert set(summary["tensors"]) == {"x", "w", "bias", "out"}
    code, text, err = run(capsys, "disasm", tmp_path / "c.gfp")
    assert code == 0, err
    assert "gemm" in text and "store.acc" in text and "requant" in text and "finish" in text
    code, _, err = run(capsys, "compile-op", "dense", "--shape", "4,x,4", "-o", tmp_path / "d.gfp")
    assert code == 2 and "--shape (M,K,N) must be 3 positive integers" in err


def test_run_op_conv2d_bad_inputs(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((1, 5, 4, 4), np.int8))
    np.save(tmp_path / "w.npy", np.zeros((2, 3, 3, 3), np.int8))
    code, _, err = run(capsys, "run-op", "conv2d", "--input", tmp_path / "x.npy", "--weight", tmp_path / "w.npy",
                       "-o", tmp_path / "y.npy")
    assert code == 2 and "input has 5 channels" in err
    np.save(tmp_path / "w.npy", np.zeros((2, 5, 3, 3), np.int8))
    code, _, err = run(capsys, "run-op", "conv2d", "--input", tmp_path / "x.npy", "--weight", tmp_path / "w.npy",
                       "--padding", "99", "-o", tmp_path / "y.npy")
    assert code == 2 and "padding must be an integer between 0 and" in err and "Traceback" not in err


def test_run_op_gemm_with_config_file(tmp_path, capsys):
    config = PRESETS["tiny"].replace(name="mine", batch=2)
    config.save(tmp_path / "mine.toml")
    a = np.ones((3, 5), np.int8)
    b = np.ones((5, 2), np.int8)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                       "-o", tmp_path / "c.npy", "--config", tmp_path / "mine.toml")
    assert code == 0, err
    assert (np.load(tmp_path / "c.npy") == 5).all()


@pytest.mark.parametrize("a, b, message", [
    (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.int8), "A must be int8, but .* holds float32"),
    (np.zeros((2, 3), np.int8), np.zeros((3,), np.int8), "B must have 2 dimensions"),
    (np.zeros((2, 3), np.int8), np.zeros((4, 2), np.int8), "A's columns must equal B's rows"),
])
def test_run_op_gemm_bad_inputs(tmp_path, capsys, a, b, message):
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    (tmp_path / "c.npy").write_bytes(b"previous result")
    code, out, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                         "-o", tmp_path / "c.npy")
    assert code == 2
    assert err.startswith("gemforge: error: ") and "Traceback" not in err
    assert __import__("re").search(message, err), err
    assert (tmp_path / "c.npy").read_bytes() == b"previous result"  # nothing written on failure


def test_missing_and_garbage_files(tmp_path, capsys):
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "nope.npy", "--b", tmp_path / "b.npy",
                       "-o", tmp_path / "c.npy")
    assert code == 2 and "A file" in err and "does not exist" in err
    (tmp_path / "junk.npy").write_bytes(b"junk")
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "junk.npy", "--b", tmp_path / "junk.npy",
                       "-o", tmp_path / "c.npy")
    assert code == 2 and "not a .npy array of numbers" in err
    code, _, err = run(capsys, "disasm", tmp_path / "junk.npy")
    assert code == 2 and "not a gemforge program" in err


def test_bad_config_and_device(tmp_path, capsys):
    code, _, err = run(capsys, "info", "--config", "huge")
    assert code == 2 and "unknown config 'huge'" in err
    (tmp_path / "bad.toml").write_text('base = "tiny"\nbatch = 3\n')
    code, _, err = run(capsys, "info", "--config", tmp_path / "bad.toml")
    assert code == 2 and "batch must be a power of two" in err
    np.save(tmp_path / "a.npy", np.zeros((2, 2), np.int8))
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "a.npy",
                       "-o", tmp_path / "c.npy", "--device", "fpga9000")
    assert code == 2 and "unknown device 'fpga9000'" in err


def test_info_reports_derived_parameters(capsys):
    code, out, _ = run(capsys, "info", "--config", "default")
    info = json.loads(out)
    assert code == 0
    assert info["config"]["block_in"] == 16 and info["derived"]["inp_depth"] == 2048
    assert info["derived"] == isa.derived(PRESETS["default"])


def test_info_isa_is_generated_for_the_config(capsys):
    code, tiny, _ = run(capsys, "info", "--isa", "--config", "tiny")
    code2, default, _ = run(capsys, "info", "--isa", "--config", "default")
    assert code == code2 == 0
    assert "GEMM" in tiny and "SHR" in tiny and tiny != default


def test_asm_disasm_roundtrip(tmp_path, capsys):
    source = tmp_path / "p.s"
    source.write_text("""
        ; a tiny program
        .uop dst=0 src=0 wgt=0
        load.uop sram_base=0 dram_base=0 y_size=1 x_size=1 x_stride=1
        load.inp push_next sram_base=0 dram_base=64 y_size=1 x_size=1 x_stride=1
        gemm pop_prev push_next uop_bgn=0 uop_end=1 iter_out=1 iter_in=1
        alu.shr uop_bgn=0 uop_end=1 iter_out=1 iter_in=1 imm=-3
        store.out pop_prev push_prev sram_base=0 dram_base=128 y_size=1 x_size=1 x_stride=1
        finish pop_next
    """)
    code, _, err = run(capsys, "asm", source, "-o", tmp_path / "p.gfp", "--config", "tiny")
    assert code == 0, err
    code, text, err = run(capsys, "disasm", tmp_path / "p.gfp")
    assert code == 0, err
    assert "alu.shr" in text and "imm=-3" in text
    (tmp_path / "again.s").write_text(text)
    code, _, err = run(capsys, "asm", tmp_path / "again.s", "-o", tmp_path / "again.gfp", "--config", "tiny")
    assert code == 0, err
    assert (tmp_path / "again.gfp").read_bytes() == (tmp_path / "p.gfp").read_bytes()


def test_asm_reports_bad_source(tmp_path, capsys):
    source = tmp_path / "bad.s"
    source.write_text("gemm uop_bgn=0 uop_end=1 iter_out=99999 iter_in=1\nfinish\n")
    code, _, err = run(capsys, "asm", source, "-o", tmp_path / "x.gfp", "--config", "tiny")
    assert code == 2 and "line 1" in err and "iter_out" in err
    assert not (tmp_path / "x.gfp").exists()


def test_bench_quick_prints_ratio(capsys):
    code, out, _ = run(capsys, "bench", "--quick", "--config", "tiny")
    assert code == 0
    result = json.loads(out)["fsim_gemm"]
    assert result["uops_per_second"] > 0 and result["time_ratio_vs_numpy"] > 0


def test_demo_runs(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "every result equals numpy" in out and "int8 accuracy" in out
    assert (tmp_path / "digits_profile.png").exists() and (tmp_path / "rtl" / "gemforge_top.v").exists()


def test_unwritable_output_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(capsys, "generate", "--config", "tiny", "-o", blocker / "sub")
    assert code == 2 and err.startswith("gemforge: error: ") and "Traceback" not in err


@pytest.mark.parametrize("argv", [["generate", "--config", "tiny"], ["synth", "--config", "tiny"],
                                  ["sweep", "examples/sweeps/small.toml", "--quiet"], ["demo"]])
def test_an_output_directory_that_is_a_file_is_refused_by_name(tmp_path, capsys, argv):
    """mkdir's own message was all there was: 'File exists: PATH' (or 'Not a directory' under a file)."""
    blocker = tmp_path / "file"
    blocker.write_text("kept")
    argv = [str(Path(__file__).parents[2] / a) if a.endswith(".toml") else a for a in argv]
    code, _, err = run(capsys, *argv, "-o", blocker)
    assert code == 2 and err == (f"gemforge: error: -o {blocker} exists and is not a directory; give a directory "
                                 "to write into (created if needed)\n")
    code, _, err = run(capsys, *argv, "-o", blocker / "sub")
    assert code == 2 and err == (f"gemforge: error: -o {blocker / 'sub'} lies under {blocker}, which exists and is "
                                 "not a directory; give a directory to write into (created if needed)\n")
    assert blocker.read_text() == "kept"


# ---------------------------------------------------------------------------- the LLVM back ends

def test_run_op_on_the_cpu_float32_and_grouped_int8(tmp_path, capsys):
    rng = np.random.default_rng(31)
    a, b = rng.standard_normal((9, 17)).astype(np.float32), rng.standard_normal((17, 5)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    for name, arr in (("a", a), ("b", b), ("bias", bias)):
        np.save(tmp_path / f"{name}.npy", arr)
    code, out, err = run(capsys, "run-op", "dense", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                         "--bias", tmp_path / "bias.npy", "--relu", "-o", tmp_path / "c.npy", "--device", "cpu",
                         "--stats")
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-5)
    assert json.loads(out)["dtype"] == "float32" and "seconds" in json.loads(out)
    x = rng.integers(-128, 128, (1, 6, 8, 8), dtype=np.int8)
    w = rng.integers(-128, 128, (6, 2, 3, 3), dtype=np.int8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    code, _, err = run(capsys, "run-op", "conv2d", "--input", tmp_path / "x.npy", "--weight", tmp_path / "w.npy",
                       "--groups", 3, "--padding", 1, "--shift", 6, "-o", tmp_path / "y.npy", "--device", "cpu")
    assert code == 0, err
    from gemforge.compiler.ops import conv2d_reference
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), conv2d_reference(x, w, None, 1, 1, 6, groups=3))


def test_run_op_elementwise_and_softmax_on_the_cpu(tmp_path, capsys):
    rng = np.random.default_rng(32)
    x, y = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((3, 1)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    code, _, err = run(capsys, "run-op", "mul", "--input", tmp_path / "x.npy", "--other", tmp_path / "y.npy",
                       "-o", tmp_path / "o.npy", "--device", "cpu")
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), x * y, rtol=1e-6)
    code, _, err = run(capsys, "run-op", "softmax", "--input", tmp_path / "x.npy", "-o", tmp_path / "s.npy",
                       "--device", "cpu")
    assert code == 0, err
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), e / e.sum(-1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("device,emit,marker", [("cpu", "llvm", "define void @dense"), ("cpu", "asm", "vfmadd"),
                                                ("gpu", "ptx", ".entry dense")])
def test_compile_op_writes_llvm_assembly_or_ptx(tmp_path, capsys, device, emit, marker):
    code, out, err = run(capsys, "compile-op", "dense", "--shape", "64,64,64", "--dtype", "float32", "--device",
                         device, "--emit", emit, "-o", tmp_path / "k.txt", "--trace")
    assert code == 0, err
    assert marker in (tmp_path / "k.txt").read_text()
    assert "== lower" in err and "== make_llvm_ir" in err         # --trace: the IR after every stage
    assert json.loads(out)["emit"] == emit


@pytest.mark.parametrize("argv,message", [
    (["compile-op", "dense", "--shape", "4,4,4", "--dtype", "float32", "--shift", "3", "--device", "cpu"],
     "shift .* applies to int8 operands"),
    (["compile-op", "dense", "--shape", "4,4,4", "--device", "gpu", "--emit", "asm"], "--emit asm is not available"),
    (["compile-op", "dense", "--shape", "4,4,4", "--device", "cpu", "--emit", "program"], "--emit program"),
    (["compile-op", "softmax", "--shape", "4,4"], "softmax runs on the cpu or gpu"),
    (["compile-op", "conv2d", "--input-shape", "1,8,5,5", "--weight-shape", "4,3,3,3", "--groups", "3",
      "--device", "cpu"], "input has 8 channels"),
])
def test_llvm_back_end_mistakes_are_one_line(tmp_path, capsys, argv, message):
    code, _, err = run(capsys, *argv, "-o", tmp_path / "out")
    assert code == 2 and err.startswith("gemforge: error: ") and "Traceback" not in err
    assert __import__("re").search(message, err), err


def test_gpu_device_without_a_gpu_is_a_clear_error(tmp_path, capsys):
    from gemforge.compiler.backends.gpu import cuda
    if cuda.available():
        pytest.skip("this machine has a GPU")
    np.save(tmp_path / "a.npy", np.zeros((2, 2), np.float32))
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "a.npy",
                       "-o", tmp_path / "c.npy", "--device", "gpu")
    assert code == 2 and "device gpu is not available" in err


@pytest.mark.parametrize("op,dtype,other", [("softmax", np.float32, False), ("mul", np.int32, True),
                                            ("avg-pool", np.int8, False)])
def test_host_only_operator_on_the_accelerator_is_refused_by_name(tmp_path, capsys, op, dtype, other):
    """Whatever the input type, the error says the accelerator lacks the operator."""
    np.save(tmp_path / "x.npy", np.ones((1, 2, 4, 4), dtype))
    extra = ["--other", tmp_path / "x.npy"] if other else []
    code, _, err = run(capsys, "run-op", op, "--input", tmp_path / "x.npy", *extra, "--device", "fsim",
                       "-o", tmp_path / "y.npy")
    assert code == 2 and f"the accelerator has no {op}" in err
    code, _, err = run(capsys, "compile-op", op, "--shape", "1,2,4,4", "--device", "fsim", "-o", tmp_path / "p.gfp")
    assert code == 2 and f"the accelerator has no {op}" in err


@pytest.mark.parametrize("arch,chosen", [("sm_75", None), ("sm_86", "sm_86"), ("sm_87", "sm_86"), ("sm_120", "sm_90")])
def test_gpu_device_targets_the_newest_supported_arch_at_or_below_its_own(monkeypatch, arch, chosen):
    from types import SimpleNamespace

    from gemforge.compiler.backends.gpu import cuda
    from gemforge.driver.runtime.device import DeviceError
    from gemforge.driver.runtime.host_device import GpuDevice
    monkeypatch.setattr(cuda, "device", lambda: SimpleNamespace(arch=arch, name="a test GPU"))
    if chosen is None:
        with pytest.raises(DeviceError, match="sm_80 or newer"):
            GpuDevice()
    else:
        assert GpuDevice().target.arch == chosen


@pytest.mark.parametrize("text,message", [
    ("", "the program has no instructions"),
    ("; nothing\n", "the program has no instructions"),
    ("gemm reset uop_bgn=0 uop_end=1 iter_out=1 iter_in=1\n", "line 1: the program must end with finish"),
    ("finish\ngemm reset uop_bgn=0 uop_end=1 iter_out=1 iter_in=1\nfinish\n", "line 1: finish before the end"),
    (".config default\nfinish\n", "line 1: the program says .config default, but it is being assembled for config "
                                  "'tiny'"),
])
def test_asm_refuses_programs_that_cannot_run(tmp_path, capsys, text, message):
    source = tmp_path / "p.s"
    source.write_text(text)
    code, _, err = run(capsys, "asm", source, "-o", tmp_path / "p.gfp", "--config", "tiny")
    assert code == 2 and message in err and not (tmp_path / "p.gfp").exists()


def test_results_beyond_a_16_bit_accumulator_are_refused_not_wrapped(tmp_path, capsys):
    config = tmp_path / "acc16.toml"
    config.write_text('base = "tiny"\nname = "acc16"\nacc_width = 16\nout_buffer_bytes = 2048\n')
    big = np.full((4, 64), 100, np.int8)
    np.save(tmp_path / "a.npy", big)
    np.save(tmp_path / "b.npy", np.full((64, 4), 100, np.int8))
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "-o",
                       tmp_path / "c.npy", "--config", config)
    assert code == 2 and "reach 640000, beyond the int16 accumulator of config 'acc16'" in err
    small = np.ones((4, 8), np.int8)
    np.save(tmp_path / "a.npy", small)
    np.save(tmp_path / "b.npy", small.T.copy())
    code, _, _ = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "-o",
                     tmp_path / "c.npy", "--config", config)
    assert code == 0 and (np.load(tmp_path / "c.npy") == 8).all()
    np.save(tmp_path / "bias.npy", np.full(4, 40000, np.int32))
    code, _, err = run(capsys, "run-op", "dense", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "--bias",
                       tmp_path / "bias.npy", "-o", tmp_path / "c.npy", "--config", config)
    assert code == 2 and "the bias holds values up to 40000, beyond the int16 accumulator" in err


def test_run_op_takes_the_configs_own_input_width(tmp_path, capsys):
    config = tmp_path / "w16.toml"
    config.write_text('base = "tiny"\nname = "w16"\ninp_width = 16\nwgt_width = 16\ninp_buffer_bytes = 2048\n'
                      'wgt_buffer_bytes = 8192\n')
    rng = np.random.default_rng(16)
    a = rng.integers(-3000, 3000, (5, 12), dtype=np.int16)
    b = rng.integers(-3000, 3000, (12, 7), dtype=np.int16)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "-o",
                       tmp_path / "c.npy", "--config", config)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), a.astype(np.int64) @ b.astype(np.int64))
    # int16 products can leave a 32-bit accumulator: refused, as for a narrow accumulator.
    np.save(tmp_path / "a.npy", np.full((2, 4), -32768, np.int16))
    np.save(tmp_path / "b.npy", np.full((4, 4), -32768, np.int16))
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "-o",
                       tmp_path / "c.npy", "--config", config)
    assert code == 2 and "reach 4294967296, beyond the int32 accumulator of config 'w16'" in err


@pytest.mark.parametrize("device", ["fsim", "cpu"])
def test_conv2d_and_mul_sums_beyond_int32_are_refused_not_wrapped(tmp_path, capsys, device):
    """The conv2d check compared the reference's already wrapped sums, so it never fired;
    mul had no check at all."""
    np.save(tmp_path / "x.npy", np.full((1, 16384, 3, 3), -128, np.int8))
    np.save(tmp_path / "w.npy", np.full((1, 16384, 3, 3), 127, np.int8))
    code, _, err = run(capsys, "run-op", "conv2d", "--input", tmp_path / "x.npy", "--weight", tmp_path / "w.npy",
                       "-o", tmp_path / "y.npy", "--device", device)
    assert code == 2 and "the exact conv2d results reach 2397044736, beyond the int32 accumulator" in err
    if device == "cpu":         # the accelerator's element-wise operators take NCHW int32 tensors
        np.save(tmp_path / "m.npy", np.array([100000, 3], np.int32))
        code, _, err = run(capsys, "run-op", "mul", "--input", tmp_path / "m.npy", "--other", tmp_path / "m.npy",
                           "-o", tmp_path / "y.npy", "--device", device)
        assert code == 2 and "the exact mul results reach 10000000000" in err
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("inp, wgt", [(16, 8), (8, 16)])
def test_weights_take_the_configs_weight_width(tmp_path, capsys, inp, wgt):
    """With inp_width ≠ wgt_width the weights were typed by inp_width: int16 weights were
    truncated to int8 without a word, or 16-bit weights could not be given at all."""
    config = tmp_path / "mixed.toml"
    config.write_text(f'base = "tiny"\nname = "mixed"\ninp_width = {inp}\nwgt_width = {wgt}\n'
                      'inp_buffer_bytes = 4096\nwgt_buffer_bytes = 16384\n')
    rng = np.random.default_rng(17)
    data, weight = (np.dtype(f"int{w}") for w in (inp, wgt))
    a = rng.integers(-3000 if inp == 16 else -128, 3000 if inp == 16 else 128, (5, 12)).astype(data)
    b = rng.integers(-3000 if wgt == 16 else -128, 3000 if wgt == 16 else 128, (12, 7)).astype(weight)
    x = rng.integers(-100, 100, (1, 6, 5, 5)).astype(data)
    w = rng.integers(-100, 100, (4, 6, 3, 3)).astype(weight)
    for name, array in (("a", a), ("b", b), ("x", x), ("w", w)):
        np.save(tmp_path / f"{name}.npy", array)
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "-o",
                       tmp_path / "c.npy", "--config", config)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), a.astype(np.int64) @ b.astype(np.int64))
    code, _, err = run(capsys, "run-op", "conv2d", "--input", tmp_path / "x.npy", "--weight", tmp_path / "w.npy",
                       "--padding", "1", "-o", tmp_path / "y.npy", "--config", config)
    assert code == 0, err
    from gemforge.compiler.ops.reference import conv2d_sums
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), conv2d_sums(x, w, 1, 1))
    # Weights of the data's type are refused by name, not truncated.
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "a.npy", "-o",
                       tmp_path / "c.npy", "--config", config)
    assert code == 2 and f"must be int{wgt}, but" in err


def test_shift_on_a_config_without_int8_outputs_and_global_max_pool(tmp_path, capsys):
    config = tmp_path / "ow16.toml"
    config.write_text('base = "tiny"\nname = "ow16"\nout_width = 16\nout_buffer_bytes = 2048\n')
    np.save(tmp_path / "a.npy", np.ones((4, 8), np.int8))
    np.save(tmp_path / "b.npy", np.ones((8, 4), np.int8))
    code, _, err = run(capsys, "run-op", "dense", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy", "--shift", "2",
                       "-o", tmp_path / "c.npy", "--config", config)
    assert code == 2 and "dense with a shift writes int8 outputs, but config 'ow16' has 16-bit outputs" in err
    # Global max pooling (no --kernel) of a square image runs on the accelerator.
    x = np.random.default_rng(18).integers(-1000, 1000, (1, 3, 5, 5)).astype(np.int32)
    np.save(tmp_path / "x.npy", x)
    code, _, err = run(capsys, "run-op", "max-pool", "--input", tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.maximum(x.max(axis=(2, 3), keepdims=True), 0))


def test_the_python_api_refuses_what_the_accumulator_would_wrap():
    from gemforge.compiler import run_dense
    from gemforge.compiler.ops import OpError
    from gemforge.driver.runtime.device import open_device
    config = PRESETS["tiny"].replace(name="acc16", acc_width=16, out_buffer_bytes=2048)
    a = np.full((2, 8), -128, np.int8)
    with pytest.raises(OpError, match="reach 131072, beyond the int16 accumulator"):
        run_dense(open_device("fsim", config), a, a.T.copy())


@pytest.mark.parametrize("text, message", [
    ('{"base": ["tiny"]}', "base must name a preset"),
    ('{"base": {"x": 1}}', "base must name a preset"),
    (b'{"base": "tiny", "name": "\xff"}', "is not UTF-8 text"),
    ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
])
def test_malformed_config_files_are_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "c.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, _, err = run(capsys, "info", "--config", path)
    assert code == 2 and message in err and "Traceback" not in err


BIG = "9" * 400
CLOCK = "clock_mhz must be a number between 1 and 1000, not "


@pytest.mark.parametrize("name, text, message", [
    ("c.json", f'{{"base": "tiny", "clock_mhz": {BIG}}}', f"{CLOCK}{BIG[:40]}…"),
    ("c.toml", f'base = "tiny"\nclock_mhz = {BIG}\n', f"{CLOCK}{BIG[:40]}…"),
    ("c.json", f'{{"base": "tiny", "clock_mhz": "{BIG}"}}', f"{CLOCK}'{BIG[:39]}…"),
    ("c.toml", f'base = "tiny"\nclock_mhz = "{BIG}"\n', f"{CLOCK}'{BIG[:39]}…"),
    ("c.json", f'{{"base": "tiny", "batch": {BIG}}}', f"batch must be a power of two between 1 and 256, not {BIG[:40]}…"),
    ("c.toml", f'base = "tiny"\nbatch = [{", ".join(["1"] * 300)}]\n',
     "batch must be an integer, not [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, …"),
    ("c.toml", f'base = "tiny"\nname = "{"x" * 500}"\n', f"not '{'x' * 39}…"),
    ("c.json", f'{{"base": "{"x" * 500}"}}', f"base must name a preset (tiny, default, large, ulx3s), not '{'x' * 39}…"),
    ("c.json", f'{{"base": "tiny", "{"x" * 500}": 1}}', f"has unknown field(s) {'x' * 40}…; allowed fields are"),
    ("c.json", f'{{"{"y" * 500}": 1, "{"y" * 500}": 2}}', f"gives '{'y' * 39}… twice; give each field once"),
])
def test_config_errors_shorten_the_values_they_echo(tmp_path, capsys, name, text, message):
    """A 400-digit clock_mhz (or a page of text) was echoed in full in the one-line error."""
    (tmp_path / name).write_text(text)
    code, _, err = run(capsys, "info", "--config", tmp_path / name)
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert len(err) < 500, err


def test_asm_refuses_binary_sources_and_shapes_beyond_any_arena(tmp_path, capsys):
    (tmp_path / "bin.s").write_bytes(b"\x93\x00binary")
    code, _, err = run(capsys, "asm", tmp_path / "bin.s", "-o", tmp_path / "p.gfp")
    assert code == 2 and "not UTF-8 text" in err
    (tmp_path / "big.s").write_text(".config tiny\n.arena_bytes 16384\n"
                                    ".tensor out offset=0 shape=99999999999999999999999999 dtype=int32\nfinish\n")
    code, _, err = run(capsys, "asm", tmp_path / "big.s", "-o", tmp_path / "p.gfp", "--config", "tiny")
    assert code == 2 and "past the 16384-byte arena" in err


def test_host_back_ends_refuse_what_int32_would_wrap_and_outputs_never_overwrite_inputs(tmp_path, capsys):
    """The cpu back end's int32 accumulator wrapped silently where fsim refused; an output path
    naming an input destroyed the input."""
    a = np.full((1, 140_000), -128, np.int8)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a.T.copy())
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                       "-o", tmp_path / "c.npy", "--device", "cpu")
    assert code == 2 and "int32 accumulator of the cpu back end" in err and "wrap" in err
    small = np.ones((2, 3), np.int8)
    np.save(tmp_path / "a.npy", small)
    np.save(tmp_path / "b.npy", small.T.copy())
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                       "-o", tmp_path / "a.npy", "--device", "cpu")
    assert code == 2 and "also an input" in err
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), small)
    (tmp_path / "p.s").write_text("finish\n")
    code, _, err = run(capsys, "asm", tmp_path / "p.s", "-o", tmp_path / "p.s", "--config", "tiny")
    assert code == 2 and "also an input" in err and (tmp_path / "p.s").read_text() == "finish\n"


def test_empty_and_special_input_files_are_one_line(tmp_path, capsys):
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "b.npy", np.ones((3, 2), np.int8))
    code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / "empty.npy", "--b", tmp_path / "b.npy",
                       "-o", tmp_path / "c.npy", "--config", "tiny")
    assert code == 2 and "is not a readable .npy array" in err
    # Text, or an array of Python objects: not numpy's advice to unpickle it.
    (tmp_path / "text.npy").write_text("1 2 3\n")
    np.save(tmp_path / "objects.npy", np.array([{}, 1], dtype=object))
    for name in ("text.npy", "objects.npy"):
        code, _, err = run(capsys, "run-op", "gemm", "--a", tmp_path / name, "--b", tmp_path / "b.npy",
                           "-o", tmp_path / "c.npy", "--config", "tiny")
        assert code == 2 and "is not a .npy array of numbers" in err and "allow_pickle" not in err, err
    code, _, err = run(capsys, "disasm", "/dev/zero")
    assert code == 2 and "not a regular file" in err
    # A FIFO blocks a read until something writes to it: every loader refuses one at once.
    if hasattr(os, "mkfifo"):
        for name in ("fifo.npy", "fifo.toml", "fifo.gfm", "fifo.gfp", "fifo.json"):
            os.mkfifo(tmp_path / name)
        for argv in (("run-op", "gemm", "--a", tmp_path / "fifo.npy", "--b", tmp_path / "b.npy", "-o",
                      tmp_path / "c.npy", "--config", "tiny"),
                     ("info", "--config", tmp_path / "fifo.toml"),
                     ("run", tmp_path / "fifo.gfm", "--input", tmp_path / "b.npy", "-o", tmp_path / "c.npy"),
                     ("regress", "--replay", tmp_path / "fifo.gfp"),
                     ("bench", "--merge", tmp_path / "fifo.json")):
            code, _, err = run(capsys, *argv)
            assert code == 2 and "not a regular file" in err and err.count("\n") == 1, (argv, err)
    # A byte-order mark before the first line is not part of it.
    (tmp_path / "bom.s").write_bytes("\ufefffinish\n".encode())
    assert run(capsys, "asm", tmp_path / "bom.s", "-o", tmp_path / "bom.gfp", "--config", "tiny")[0] == 0


def test_operators_beyond_the_dram_address_space_are_refused_before_compiling(tmp_path, capsys):
    """compile-op hung on a huge M, and the cpu back end wrapped dimensions beyond int64."""
    code, _, err = run(capsys, "compile-op", "gemm", "--shape", "1000000000,4,4", "-o", tmp_path / "x.gfp",
                       "--config", "tiny")
    assert code == 2 and "beyond the 4,294,967,296 the accelerator can address" in err
    for device in ("tiny", "cpu"):
        where = ["--config", device] if device == "tiny" else ["--device", device]
        code, _, err = run(capsys, "compile-op", "gemm", "--shape", "99999999999999999999999,4,4", "-o",
                           tmp_path / "x.out", *where)
        assert code == 2 and "dimensions up to 2,147,483,647" in err


def test_more_hostile_arguments_are_one_line(tmp_path, capsys):
    for argv, message in [(["regress", "--config-seed", "-1", "--count", "1"], "--config-seed must be 0 or more"),
                          (["regress", "--seed", "-1", "--count", "1"], "--seed must be 0 or more"),
                          (["bench", "--quick", "--sections", "fsim", "--device", "bogus"], "an RTL simulator")]:
        code, _, err = run(capsys, *argv)
        assert code == 2 and message in err, err
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    code, _, err = run(capsys, "run-op", "clip", "--input", tmp_path / "x.npy", "--min", "nan", "--max", "5",
                       "--device", "cpu", "-o", tmp_path / "c.npy")
    assert code == 2 and "clip needs bounds" in err
    (tmp_path / "list.json").write_text("[1, 2]")
    code, _, err = run(capsys, "bench", "--quick", "--sections", "fsim", "--merge", tmp_path / "list.json")
    assert code == 2 and "is not the JSON object of sections" in err
    (tmp_path / "datasheet.md").mkdir()
    code, _, err = run(capsys, "generate", "--config", "tiny", "-o", tmp_path)
    assert code == 2 and "is a directory" in err and not (tmp_path / "gemforge_top.v").exists()


def test_an_npz_of_inputs_that_unpacks_beyond_reason_is_refused_unread(tmp_path, capsys, monkeypatch):
    from gemforge.driver.tools import cli
    np.savez_compressed(tmp_path / "x.npz", x=np.zeros((1 << 20,), np.float32))    # 4 MiB of zeros, packed small
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 20)
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "--quantize", "int8", "--calibrate",
                       tmp_path / "x.npz", "-o", tmp_path / "m.gfm")
    assert code == 2 and "unpacks to" in err, err


def test_run_replaces_no_output_when_its_profile_cannot_be_written(tmp_path, capsys):
    """`run --profile /dev/full` replaced the output file, then failed writing the PNG: the
    outputs are now written together, so the previous output stays and nothing is half done."""
    from onnx import helper
    from gemforge.driver.runtime.model import compile_model
    from onnx_models import model
    weights = np.ones((3, 4), np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, 3])], [("y", [2, 4])], {"w": weights})
    compile_model(m).save(tmp_path / "m.gfm")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    (tmp_path / "y.npy").write_bytes(b"previous result")
    argv = ("run", tmp_path / "m.gfm", "--input", tmp_path / "x.npy", "-o", tmp_path / "y.npy", "--device", "cpu")
    if Path("/dev/full").exists():
        code, _, err = run(capsys, *argv, "--profile", "/dev/full")
        assert code == 2 and err.startswith("gemforge: error: ") and err.count("\n") == 1, err
        assert (tmp_path / "y.npy").read_bytes() == b"previous result"
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    code, _, err = run(capsys, *argv, "--profile", tmp_path / "y.npy")
    assert code == 2 and "is the output file itself" in err
    # The same file spelled another way, before it exists: the PNG replaced the result.
    fresh = ("run", tmp_path / "m.gfm", "--input", tmp_path / "x.npy", "-o", tmp_path / "new.npy", "--device", "cpu")
    code, _, err = run(capsys, *fresh, "--profile", f"{tmp_path}/./new.npy")
    assert code == 2 and "is the output file itself" in err and not (tmp_path / "new.npy").exists()
    # One output asked for as a .npz: an archive holding it by name, not .npy bytes under that name.
    code, _, _ = run(capsys, *fresh[:4], "-o", tmp_path / "y.npz", "--device", "cpu")
    assert code == 0
    with np.load(tmp_path / "y.npz") as archive:
        np.testing.assert_array_equal(archive["y"], np.full((2, 4), 3, np.float32))
    code, out, _ = run(capsys, *argv, "--profile", tmp_path / "p.png")
    assert code == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.full((2, 4), 3, np.float32))


def _save_model(path: Path, shape) -> None:
    """A one-node ONNX model (ReLU) whose input has ``shape`` ("N": a symbolic batch)."""
    from onnx import helper
    from onnx_models import model
    path.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], [("x", shape)], [("y", shape)])
                     .SerializeToString())


def test_compile_refuses_a_batch_whose_inputs_no_run_reads(tmp_path, capsys, monkeypatch):
    """`compile --batch 1000000000` was accepted, and every run of the model was then refused (no
    input file of a whole batch is read): the compile refuses it, naming the bound and the
    largest batch within it, which compiles and runs."""
    from gemforge.driver.tools import cli
    _save_model(tmp_path / "m.onnx", ["N", 3, 8, 8])         # 768 bytes of float32 an item
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "--batch", 10 ** 9, "-o", tmp_path / "m.gfm")
    assert code == 2 and err == ("gemforge: error: the model's inputs take 768,000,000,000 bytes (float32) at --batch "
                                 "1,000,000,000, more than the 17,179,869,184 a run reads; --batch 22,369,621 is the "
                                 "largest that fits\n"), err
    assert not (tmp_path / "m.gfm").exists()
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 4 * 768)
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "--batch", 5, "-o", tmp_path / "m.gfm")
    assert code == 2 and "--batch 4 is the largest that fits" in err
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "--batch", 4, "-o", tmp_path / "m.gfm")
    assert code == 0, err
    x = np.random.default_rng(5).normal(size=(4, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    code, _, err = run(capsys, "run", tmp_path / "m.gfm", "--input", tmp_path / "x.npz", "-o", tmp_path / "y.npy")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.maximum(x, 0))
    _save_model(tmp_path / "fixed.onnx", [1000, 3, 8, 8])    # no batch to lower: the inputs alone are too large
    code, _, err = run(capsys, "compile", tmp_path / "fixed.onnx", "-o", tmp_path / "f.gfm")
    assert code == 2 and err.endswith("more than the 3,072 a run reads\n"), err


def test_run_and_calibration_take_float32_arrays_only(tmp_path, capsys):
    """`run` and `--calibrate` took int8 .npy files (read as float values of another scale) where
    the README says float32, while run-op refuses an array of the wrong type: both refuse one
    now, naming the file and the type found."""
    _save_model(tmp_path / "m.onnx", [2, 3])
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "-o", tmp_path / "m.gfm")
    assert code == 0, err
    x = np.float32([[1, -2, 3], [-4, 5, -6]])
    for dtype in (np.int8, np.float64):
        np.save(tmp_path / "x.npy", x.astype(dtype))
        code, _, err = run(capsys, "run", tmp_path / "m.gfm", "--input", tmp_path / "x.npy", "-o", tmp_path / "y.npy")
        assert code == 2 and err == (f"gemforge: error: input must be float32, but {tmp_path / 'x.npy'} holds "
                                     f"{np.dtype(dtype).name}\n"), err
    np.savez(tmp_path / "x.npz", x=x.astype(np.int8))
    code, _, err = run(capsys, "run", tmp_path / "m.gfm", "--input", tmp_path / "x.npz", "-o", tmp_path / "y.npy")
    assert code == 2 and err.endswith(f"input must be float32, but {tmp_path / 'x.npz'} holds int8 array 'x'\n"), err
    assert not (tmp_path / "y.npy").exists()
    for archive in (False, True):      # float32 in either byte order is float32
        path = tmp_path / ("b.npz" if archive else "b.npy")
        (np.savez if archive else np.save)(path, *([] if archive else [x.astype(">f4")]),
                                           **({"x": x.astype(">f4")} if archive else {}))
        code, _, err = run(capsys, "run", tmp_path / "m.gfm", "--input", path, "-o", tmp_path / "y.npy")
        assert code == 0, err
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.maximum(x, 0))
    np.save(tmp_path / "s.npy", np.stack([x, -x]).astype(np.int8))
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "--quantize", "int8", "--calibrate", tmp_path / "s.npy",
                       "-o", tmp_path / "q.gfm")
    assert code == 2 and err.endswith(f"calibration samples must be float32, but {tmp_path / 's.npy'} holds int8\n")
    assert not (tmp_path / "q.gfm").exists()


def test_compile_builds_the_host_kernels_so_a_run_compiles_nothing(tmp_path, capsys, monkeypatch):
    """`gemforge compile` compiles the host layers' kernels for this CPU into the kernel cache;
    a run in a new process (the model loaded from its file) then loads them, optimizing nothing."""
    from onnx import helper
    from onnx_models import model
    import gemforge.compiler.backends.cpu as cpu
    monkeypatch.setenv("GEMFORGE_CACHE", str(tmp_path / "cache"))
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["r"]),
               helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              [("x", [1, 3, 8, 8])], [("y", None)],
              {"w": np.random.default_rng(3).normal(size=(4, 3, 3, 3)).astype(np.float32)})
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "-o", tmp_path / "m.gfm")
    assert code == 0 and "host kernels: 2 compiled for this CPU" in err, err
    assert len(list((tmp_path / "cache" / "cpu-kernels").glob("*.o"))) == 2
    monkeypatch.setattr(cpu, "optimize_o3", lambda *a, **k: pytest.fail("a run compiled a kernel"))
    np.save(tmp_path / "x.npy", np.ones((1, 3, 8, 8), np.float32))
    code, _, err = run(capsys, "run", tmp_path / "m.gfm", "--input", tmp_path / "x.npy", "-o", tmp_path / "y.npy",
                       "--device", "cpu")
    assert code == 0, err
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "-o", tmp_path / "n.gfm", "--no-host-kernels")
    assert code == 0 and "host kernels" not in err


def test_compile_for_an_x86_64_level_runs_its_kernels_here_without_compiling(tmp_path, capsys, monkeypatch):
    """`gemforge compile --cpu x86-64-v3` builds AVX2 kernels; this machine (a later level) runs
    them as they are. A file naming features this machine lacks compiles its own, and a file
    whose host_target is not a level's is refused."""
    import zipfile
    from onnx import helper
    from onnx_models import model
    import gemforge.compiler.backends.cpu as cpu
    from gemforge.driver.runtime.model import Model
    monkeypatch.setenv("GEMFORGE_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(4)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4), helper.make_node("Relu", ["c"], ["y"])],
              [("x", [1, 3, 8, 8])], [("y", None)], {"w": rng.normal(size=(4, 3, 3, 3)).astype(np.float32)})
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    code, out, err = run(capsys, "compile", tmp_path / "m.onnx", "-o", tmp_path / "m.gfm", "--cpu", "x86-64-v3")
    assert code == 0 and "compiled for x86-64-v3" in err, err
    assert json.loads(out)["host_kernels_cpu"] == "x86-64-v3"
    x = rng.normal(size=(1, 3, 8, 8)).astype(np.float32)
    expected = Model.load(tmp_path / "m.gfm", file_kernels=False).run(x, "cpu")
    loaded = Model.load(tmp_path / "m.gfm")
    if not cpu.runs_here(loaded._host_cpu()) or loaded._host_cpu().cpu != "x86-64-v3":
        pytest.skip("this machine is below x86-64-v3")
    assert cpu.vector_bits(loaded._host_cpu()) == 256
    monkeypatch.setattr(cpu, "optimize_o3", lambda *a, **k: pytest.fail("a run compiled a kernel"))
    np.testing.assert_allclose(loaded.run(x, "cpu"), expected, rtol=1e-5, atol=1e-5)
    monkeypatch.undo()
    # The same file claiming a level's features with one this machine lacks: refused as no level's.
    with zipfile.ZipFile(tmp_path / "m.gfm") as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    manifest["host_target"]["features"] += ",+amx-tile"
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(tmp_path / "t.gfm", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    np.save(tmp_path / "x.npy", x)
    code, _, err = run(capsys, "run", tmp_path / "t.gfm", "--input", tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert code == 2 and "host_target must name an x86-64 level" in err
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "-o", tmp_path / "n.gfm", "--cpu", "pentium")
    assert code == 2 and "--cpu takes host or an x86-64 level" in err
    code, _, err = run(capsys, "compile", tmp_path / "m.onnx", "-o", tmp_path / "n.gfm", "--cpu", "x86-64-v4",
                       "--no-host-kernels")
    assert code == 2 and "leave out --no-host-kernels" in err


def test_kernels_for_features_this_machine_lacks_are_compiled_here_instead(tmp_path):
    """A model whose kernels were built for a CPU with features this machine does not have runs
    kernels compiled for this machine (never the file's code)."""
    from onnx import helper
    from onnx_models import model
    from gemforge.compiler.target import CpuTarget
    from gemforge.driver.runtime.model import Model, compile_model
    rng = np.random.default_rng(5)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"])], [("x", [1, 3, 6, 6])], [("y", None)],
              {"w": rng.normal(size=(2, 3, 1, 1)).astype(np.float32)})
    compiled = compile_model(m)
    compiled.compile_host_kernels(cpu="x86-64-v4")
    compiled.net.host_target = {"cpu": "x86-64-v4", "features": compiled.net.host_target["features"] + ",+amx-tile"}
    fresh = Model(compiled.net)
    assert fresh._host_cpu() == CpuTarget()
    x = rng.normal(size=(1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(fresh.run(x, "cpu"), compile_model(m).run(x, "cpu"), rtol=1e-5, atol=1e-5)
