"""Atomic output replaces only regular files: links are followed, devices written through."""

from __future__ import annotations

import os
import stat

import pytest

from gemforge.driver.cli import main
from gemforge.files import write_bytes_atomic


def test_symlink_is_followed_and_kept(tmp_path):
    target = tmp_path / "target.toml"
    target.write_text("old")
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    assert main(["config", "--config", "tiny", "-o", str(link)]) == 0
    assert link.is_symlink() and "tiny" in target.read_text()


@pytest.mark.skipif(not os.path.exists("/dev/null") or not stat.S_ISCHR(os.stat("/dev/null").st_mode),
                    reason="no /dev/null character device")
def test_device_is_written_through_not_replaced():
    write_bytes_atomic("/dev/null", b"data")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_directory_is_refused_in_one_line(tmp_path, capsys):
    target = tmp_path / "out.toml"
    target.mkdir()
    assert main(["config", "--config", "tiny", "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a directory" in err and ".tmp" not in err
