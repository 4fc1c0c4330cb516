"""Atomic output replaces only regular files: links are followed, devices written through."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest

from gemforge import files
from gemforge.driver.tools.cli import main
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


def _refuses_new_files(folder: str) -> bool:
    """Whether ``folder`` exists and refuses a new file even to root (as /proc does)."""
    if not os.path.isdir(folder):
        return False
    try:
        fd, name = tempfile.mkstemp(dir=folder)
    except OSError:
        return True
    os.close(fd)
    os.unlink(name)
    return False


@pytest.mark.skipif(not os.path.isfile("/proc/version") or not _refuses_new_files("/proc"),
                    reason="no /proc that refuses new files")
def test_an_existing_file_whose_folder_takes_no_new_file_is_refused_by_its_own_name(tmp_path, capsys):
    """`-o /proc/version` said 'No such file or directory' (about the temporary file beside
    it) of a file that exists: the sentence now says what is wrong, naming the path given."""
    before = Path("/proc/version").read_bytes()
    with pytest.raises(OSError) as caught:
        write_bytes_atomic("/proc/version", b"x")
    assert caught.value.filename == "/proc/version"
    assert caught.value.strerror.startswith("cannot write /proc/version: its folder /proc does not allow creating "
                                            "files")
    (tmp_path / "p.s").write_text("finish\n")
    assert main(["asm", str(tmp_path / "p.s"), "-o", "/proc/version"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gemforge: error: cannot write /proc/version: its folder /proc does not allow creating ")
    assert err.count("\n") == 1 and err.count("/proc/version") == 1, err
    assert ".tmp" not in err and "No such file or directory" not in err, err
    assert Path("/proc/version").read_bytes() == before


def test_places_that_cannot_hold_a_file_are_named_as_given(tmp_path, capsys):
    (tmp_path / "p.s").write_text("finish\n")
    (tmp_path / "file").write_text("kept")
    (tmp_path / "dir").mkdir()
    cases = {tmp_path / "file" / "x": f"{tmp_path / 'file'} is a file, not a folder to write into",
             tmp_path / "file" / "x" / "y": f"{tmp_path / 'file'} is a file, not a folder to write into",
             tmp_path / "dir": "it is a directory, not a file to write"}
    for path, why in cases.items():
        assert main(["asm", str(tmp_path / "p.s"), "-o", str(path)]) == 2
        assert capsys.readouterr().err == f"gemforge: error: cannot write {path}: {why}\n"
    assert (tmp_path / "file").read_text() == "kept" and list((tmp_path / "dir").iterdir()) == []


def test_a_file_that_cannot_be_replaced_is_named_and_kept(tmp_path, monkeypatch):
    """A rename that fails (a bind-mounted file says EBUSY) named the temporary file, and
    the temporary file stayed; the old file must stay as it was."""
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def busy(source, destination):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), source, destination)
    monkeypatch.setattr(files.os, "replace", busy)
    with pytest.raises(OSError) as caught:
        write_bytes_atomic(target, b"new")
    monkeypatch.undo()
    assert caught.value.errno == errno.EBUSY and caught.value.filename == str(target)
    assert caught.value.strerror == (f"cannot write {target}: it cannot be replaced (Device or resource busy); "
                                     "it is left as it was")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.bin"]


@pytest.mark.skipif(not os.path.exists("/dev/full") or not stat.S_ISCHR(os.stat("/dev/full").st_mode),
                    reason="no /dev/full character device")
def test_a_write_that_fails_names_the_output():
    """A failed write has no file name of its own: the error named nothing."""
    with pytest.raises(OSError) as caught:
        write_bytes_atomic("/dev/full", b"data")
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.strerror == "cannot write /dev/full: No space left on device"
