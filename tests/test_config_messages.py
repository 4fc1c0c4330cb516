"""`AccelConfig`'s error messages on hostile input (hw/config.py): a ConfigError with one clear
sentence, never a TypeError. (Beside tests/hw/test_config.py, which covers the rules themselves.)"""

from __future__ import annotations

import pytest

from gemforge.hw.config import PRESETS, AccelConfig, ConfigError


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
