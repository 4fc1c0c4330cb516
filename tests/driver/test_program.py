"""The program container: exact serialization and clear errors on bad files."""

from __future__ import annotations

import numpy as np
import pytest

from gemforge.compiler import compile_dense
from gemforge.hw.program import Program, ProgramError, TensorRegion
from gemforge.hw.config import PRESETS
from gemforge.hw.isa import Finish, Uop


@pytest.mark.parametrize("name", PRESETS)
def test_roundtrip_is_exact(name, tmp_path):
    config = PRESETS[name]
    program = compile_dense(config, 37, 50, 21, bias=True, shift=4).program
    program.tensors["w"] = TensorRegion("w", 0, (2, 3), "int16")
    program.constants["w"] = np.arange(6, dtype=np.int16).reshape(2, 3)
    path = tmp_path / "p.gfp"
    program.save(path)
    again = Program.load(path)
    assert again.instructions == program.instructions
    assert again.uops == program.uops
    assert again.tensors == program.tensors and again.config == config
    np.testing.assert_array_equal(again.constants["w"], program.constants["w"])
    assert again.to_bytes() == program.to_bytes()


def test_bad_files_are_reported(tmp_path):
    bad = tmp_path / "bad.gfp"
    bad.write_bytes(b"not a program")
    with pytest.raises(ProgramError, match="not a gemforge program"):
        Program.load(bad)
    with pytest.raises(ProgramError, match="cannot read program"):
        Program.load(tmp_path / "missing.gfp")
    good = compile_dense(PRESETS["tiny"], 4, 4, 4).program.to_bytes()
    bad.write_bytes(good[:-3])
    with pytest.raises(ProgramError):
        Program.load(bad)
    bad.write_bytes(good + b"xx")
    with pytest.raises(ProgramError, match="trailing bytes"):
        Program.load(bad)


def test_layout_is_checked():
    config = PRESETS["tiny"]
    with pytest.raises(ProgramError, match="past the 4-byte arena"):
        Program(config, [Finish()], [Uop(0, 0, 0), Uop(1, 1, 1)], arena_bytes=4)
    with pytest.raises(ProgramError, match="does not fit"):
        Program(config, [Finish()], tensors={"x": TensorRegion("x", 8, (4,), "int32")}, arena_bytes=16)
    with pytest.raises(ProgramError, match="not a multiple"):
        Program(config, [Finish()], [Uop(0, 0, 0)], uop_offset=2, arena_bytes=64)


def test_truncated_and_corrupt_program_files_say_so():
    from gemforge.compiler import compile_dense
    from gemforge.hw.config import PRESETS
    from gemforge.hw.program import Program, ProgramError
    data = compile_dense(PRESETS["tiny"], 8, 8, 8).program.to_bytes()
    with pytest.raises(ProgramError, match=r"is truncated: \d+ bytes of the \d+ its header describes"):
        Program.from_bytes(data[:-4])
    corrupt = data[:16] + b"{" * (len(data) - 16)
    with pytest.raises(ProgramError) as info:
        Program.from_bytes(corrupt)
    assert len(str(info.value)) < 400


def test_hostile_program_headers_and_configs_are_one_error(tmp_path):
    """Found by an audit: each raised a Python error or was accepted."""
    import json
    from gemforge.hw.config import AccelConfig, ConfigError
    program = compile_dense(PRESETS["tiny"], 4, 8, 4).program
    data = program.to_bytes()
    # An infinite constant size (JSON's Infinity) raised OverflowError.
    import struct
    (length,) = struct.unpack_from("<I", data, 12)
    header = json.loads(data[16:16 + length])
    header["constants"] = [{"name": "w", "nbytes": float("inf")}]
    text = json.dumps(header).encode()
    bad = data[:12] + struct.pack("<I", len(text)) + text + data[16 + length:]
    with pytest.raises(ProgramError, match="malformed"):
        Program.from_bytes(bad)
    # A big-endian int32 passed as int32 and was read byte-swapped.
    with pytest.raises(ProgramError, match="dtype must be one of"):
        TensorRegion("y", 0, (4,), ">i4").check()
    # A stored config lacking a field took the class default under the preset's name.
    fields = {k: v for k, v in PRESETS["tiny"].to_dict().items() if k != "block_in"}
    with pytest.raises(ConfigError, match="lacks field.s. block_in"):
        AccelConfig.from_dict(fields)
    # clock_mhz = 100 in a file is the preset's 100.0, digest included.
    same = AccelConfig.from_dict({**PRESETS["tiny"].to_dict(), "clock_mhz": 100})
    assert same.digest == PRESETS["tiny"].digest and isinstance(same.clock_mhz, float)
    # A number of thousands of digits raised Python's ValueError.
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"base": "tiny"})[:-1] + ', "batch": ' + "9" * 5000 + "}")
    with pytest.raises(ConfigError, match="thousands of digits"):
        AccelConfig.load(huge)
