"""Suite-wide pytest setup: make tests/ importable so tests share `strategies`."""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
