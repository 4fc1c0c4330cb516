"""Atomic file output: a reader never sees a half-written file, and a failed
write leaves the previous file in place."""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import tempfile
import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

__all__ = ["write_bytes_atomic", "write_files_atomic", "write_text_atomic", "move_atomic", "npz_bytes",
           "check_writable", "check_regular_input", "file_above"]


def _target(path: str | Path) -> tuple[Path, bool]:
    """The file to write for ``path`` and whether it is a regular file's place (else a
    device or pipe to write through). A symlink is followed; a directory is refused."""
    text = str(path)
    path = Path(path)
    if text.endswith(os.sep) and not path.is_dir():       # Path() drops the slash that makes it a folder
        raise NotADirectoryError(20, "names a folder (it ends with /), not a file to write", text)
    if path.is_symlink():
        link = path
        path = path.resolve()
        if not path.parent.is_dir():        # a dangling link: never create folders it points into
            raise FileNotFoundError(2, f"is a link to {path}, whose folder does not exist", str(link))
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory, not a file to write", str(path))
    return path, not (path.exists() and not path.is_file())


def check_regular_input(path: str | Path) -> None:
    """Refuse an input that exists but is neither a regular file nor a directory (a FIFO, a
    socket, a device): reading one blocks until something writes to it, forever if nothing
    does. An OSError like the read's own, so each reader words it as it words those."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return              # missing, unreadable or an invalid name: the read itself says so
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise OSError(errno.EINVAL, "is not a regular file (a pipe or device would block the read)", str(path))


def check_writable(path: str | Path) -> None:
    """Refuse, before any work, an output path that cannot be written: a directory, a name
    ending in a slash, a dangling link, or one whose nearest existing ancestor is a file."""
    target, _ = _target(path)
    blocking = file_above(target)
    if blocking is not None:
        raise NotADirectoryError(20, f"{blocking} is a file, not a folder to write into", str(path))


def file_above(path: str | Path) -> Path | None:
    """The nearest existing folder-to-be of ``path`` (an ancestor) when it is not a folder (a
    file, a dangling link), which keeps ``path`` from being made; None when nothing does."""
    for ancestor in Path(path).parents:
        if os.path.lexists(ancestor):
            return None if ancestor.is_dir() else ancestor
    return None


@contextmanager
def _replacing(path: Path) -> Iterator[str]:
    """A temporary file next to the regular-file place ``path``: the block fills it, then
    it is renamed over ``path`` (removed instead if the block fails)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except FileExistsError as exc:          # a file where a folder of the path should be
        raise NotADirectoryError(exc.errno, f"{exc.filename} is a file, not a folder to write into",
                                 str(path)) from None
    except OSError as exc:                  # name the file asked for, not the temporary one
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    os.close(fd)
    try:
        yield tmp
        # mkstemp makes the file private (0600); give it the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def move_atomic(source: str | Path, path: str | Path) -> None:
    """Move the finished file ``source`` to ``path`` under the rules of `write_bytes_atomic`
    (for outputs a tool writes itself, such as a simulator's waveform)."""
    path, regular = _target(path)
    if not regular:
        with open(source, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(source)
        return
    with _replacing(path) as tmp:
        shutil.move(source, tmp)       # a rename on one file system, else a copy


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it. Only a regular
    file is ever replaced: a symlink is followed (its target is written), a device or a
    pipe (``/dev/null``, ``/dev/stdout``) is written through, a directory is refused."""
    path, regular = _target(path)
    if not regular:
        with open(path, "wb") as handle:     # a character device or FIFO: nothing to replace
            handle.write(data)
        return
    with _replacing(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def write_files_atomic(files: Mapping[str | Path, bytes]) -> None:
    """Write several outputs of one command so that none is replaced unless every one was
    written: regular files go to temporaries beside them first, devices and pipes are then
    written through, and only when all of that succeeded are the temporaries renamed over
    their files (a failure removes them, leaving every previous file as it was)."""
    targets = [(_target(path), data) for path, data in files.items()]
    with ExitStack() as renames:
        for (path, regular), data in targets:
            if regular:
                tmp = renames.enter_context(_replacing(path))
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
        for (path, regular), data in targets:
            if not regular:
                with open(path, "wb") as handle:
                    handle.write(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An ``.npz`` archive of ``arrays`` (what ``np.savez`` writes, read back by ``np.load``).
    Written entry by entry rather than through ``np.savez(file, **arrays)``, whose own
    parameters would take an array named ``file`` or ``allow_pickle`` (ONNX tensor names
    are free text)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asanyarray(array), allow_pickle=False)
    return buffer.getvalue()
