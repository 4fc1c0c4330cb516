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


def test_an_unwritable_place_is_named_as_the_caller_gave_it(tmp_path):
    (tmp_path / "f").write_bytes(b"a file")
    with pytest.raises(NotADirectoryError) as caught:
        write_bytes_atomic(tmp_path / "f" / "a.bin", b"x")
    assert caught.value.filename == str(tmp_path / "f" / "a.bin") and "is a file, not a folder" in caught.value.strerror
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked").chmod(0o500)
    try:
        if os.access(tmp_path / "locked", os.W_OK):
            return                  # root writes anywhere: nothing to refuse
        with pytest.raises(PermissionError) as caught:
            write_bytes_atomic(tmp_path / "locked" / "a.bin", b"x")
        assert caught.value.filename == str(tmp_path / "locked" / "a.bin")
    finally:
        (tmp_path / "locked").chmod(0o700)


def test_a_trailing_slash_or_a_dangling_link_never_writes_elsewhere(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    with pytest.raises(NotADirectoryError, match="names a folder"):
        write_bytes_atomic(f"{keep}/", b"new")          # POSIX: not a directory
    assert keep.read_text() == "precious"
    with pytest.raises(NotADirectoryError, match="names a folder"):
        write_bytes_atomic(f"{tmp_path / 'fresh'}/", b"new")   # was written as a file named fresh
    assert not (tmp_path / "fresh").exists()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "no" / "such" / "dir" / "x.gfp")
    with pytest.raises(FileNotFoundError, match="whose folder does not exist"):
        write_bytes_atomic(link, b"new")                  # made the link target's folders
    assert not (tmp_path / "no").exists()


def test_run_checks_its_outputs_before_the_run(tmp_path, capsys):
    from gemforge.files import check_writable
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a folder to write into"):
        check_writable(tmp_path / "afile" / "deeper" / "p.png")
    check_writable(tmp_path / "new" / "folder" / "p.png")      # folders are made when written
