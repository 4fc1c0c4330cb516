"""Every Python package folder is installed: pyproject's explicit package list is complete."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    for name, folder in setup["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            sub = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((name, *sub)) in listed, f"{init.parent} is not in pyproject's packages list"


@pytest.mark.parametrize("folder", ["hw", "sim", "compiler", "driver"])
def test_importing_a_folder_by_its_short_name_is_refused_clearly(folder):
    """From the repository root `import hw` would find the folder itself and build a second
    module tree (whose AccelConfig is not gemforge's); it is refused with the right name."""
    result = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode != 0
    assert f"ImportError: this folder is the package gemforge.{folder}: import gemforge.{folder}, not {folder}" \
        in result.stderr
