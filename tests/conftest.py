"""Suite-wide pytest setup: make tests/ importable so tests share `strategies`, and keep the
CPU kernel cache in a folder of the test runs' own (not the user's ~/.cache)."""

import os
import sys
import tempfile
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# Shared by the runs and their xdist workers: entries are keyed by the code that compiled them
# (`compiler/backends/cpu/cache.py`), so a kernel is reused only where it would compile the same.
os.environ.setdefault("GEMFORGE_CACHE", str(Path(tempfile.gettempdir()) / f"gemforge-tests-{os.getuid()}"))
