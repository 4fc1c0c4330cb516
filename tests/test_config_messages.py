"""`AccelConfig`'s error messages on hostile input (hw/config.py): a ConfigError with one clear
sentence, never a TypeError. (Beside tests/hw/test_config.py, which covers the rules themselves.)"""

from __future__ import annotations

import pytest

from gemforge.hw.config import PRESETS, AccelConfig, ConfigError, load_config


@pytest.mark.parametrize("data, shown", [
    ({1: 2}, "1"),
    ({None: 3}, "None"),
    ({"colour": "red", None: 3}, "None, colour"),
    ({**PRESETS["tiny"].to_dict(), b"batch": 4}, "b'batch'"),
])
def test_a_field_named_by_something_other_than_a_string_is_an_unknown_field(data, shown):
    """A dict with a key that is not a string (built in Python) raised a TypeError from sorting or
    joining the unknown names."""
    for load in (AccelConfig.from_dict, AccelConfig.from_file_dict):
        with pytest.raises(ConfigError, match=rf"^c has unknown field\(s\) {shown} \(a field is named by a string\); "
                                              r"allowed fields are acc_buffer_bytes, .*, wgt_width$"):
            load(data, source="c")


def test_echoed_values_are_cut_to_forty_characters():
    """Every field check echoes the value through one helper: the first 40 characters and '…'."""
    tiny = PRESETS["tiny"]
    with pytest.raises(ConfigError, match=r"^inp_buffer_bytes \(1071508607186267320948425049060001810561…\) "
                                          r"holds 2678771517965668302371062622650004526403… entries, more than"):
        tiny.replace(inp_buffer_bytes=2 ** 1000)
    with pytest.raises(ConfigError, match=r"^cmd_queue_depth must be a power of two between 2 and 4096, not 3{40}…$"):
        tiny.replace(cmd_queue_depth=int("3" * 100))
    with pytest.raises(ConfigError, match=rf"^clock_mhz must be a number between 1 and 1000, not 'fas{'tfas' * 9}…$"):
        tiny.replace(clock_mhz="fast" * 50)
    # Beyond Python's 4300 digits repr() itself fails: the size is shown instead.
    with pytest.raises(ConfigError, match=r"^batch must be a power of two between 1 and 256, not an integer of "
                                          r"16,610 bits$"):
        tiny.replace(batch=10 ** 5000)
    many = {f"field{i:02}": 1 for i in range(30)}
    with pytest.raises(ConfigError, match=r"^config has unknown field\(s\) field00, field01, .*, field09 and 20 more; "
                                          r"allowed fields are"):
        AccelConfig.from_dict(many)
    with pytest.raises(ConfigError, match=r"^unknown config 'x{39}…: give a preset"):
        load_config("x" * 300)
