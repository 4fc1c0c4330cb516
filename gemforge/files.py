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


def _cannot_write(path: str | Path, code: int | None, why: str) -> OSError:
    """The error of an output that cannot be written: one sentence naming ``path`` as the
    caller gave it (never a temporary file), with ``filename`` set to it and the OSError
    subclass of the errno ``code``."""
    return OSError(code, f"cannot write {path}: {why}", str(path))


def _refusal(exc: OSError) -> str:
    """Why a folder refused a new file or folder, in parentheses; nothing for ENOENT, which
    /proc answers (to root too) although the folder exists: it makes no files of ours."""
    return "" if exc.errno == errno.ENOENT else f" ({exc.strerror})"


def _target(path: str | Path) -> tuple[Path, bool]:
    """The file to write for ``path`` and whether it is a regular file's place (else a
    device or pipe to write through). A symlink is followed; a directory is refused."""
    text = str(path)
    path = Path(path)
    if text.endswith(os.sep) and not path.is_dir():       # Path() drops the slash that makes it a folder
        raise _cannot_write(text, errno.ENOTDIR, "it names a folder (it ends with /), not a file to write")
    if path.is_symlink():
        path = path.resolve()
        if not path.parent.is_dir():        # a dangling link: never create folders it points into
            raise _cannot_write(text, errno.ENOENT, f"it is a link to {path}, whose folder does not exist")
    if path.is_dir():
        raise _cannot_write(text, errno.EISDIR, "it is a directory, not a file to write")
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
        raise _cannot_write(path, errno.ENOTDIR, f"{blocking} is a file, not a folder to write into")


def file_above(path: str | Path) -> Path | None:
    """The nearest existing folder-to-be of ``path`` (an ancestor) when it is not a folder (a
    file, a dangling link), which keeps ``path`` from being made; None when nothing does."""
    for ancestor in Path(path).parents:
        if os.path.lexists(ancestor):
            return None if ancestor.is_dir() else ancestor
    return None


@contextmanager
def _naming(shown: str | Path, *own: str) -> Iterator[None]:
    """Errors of the block about the files ``own`` or about no file (a write, a flush) as
    `_cannot_write` errors naming ``shown``; errors about other files pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None and exc.filename not in own:
            raise
        raise _cannot_write(shown, exc.errno, exc.strerror or str(exc)) from None


@contextmanager
def _replacing(path: Path, shown: str | Path) -> Iterator[str]:
    """A temporary file next to the regular-file place ``path``: the block fills it, then
    it is renamed over ``path`` (removed instead if the block fails). Errors name ``shown``,
    the path as the caller gave it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocking = file_above(path)
        if blocking is not None:            # a file where a folder of the path should be
            raise _cannot_write(shown, errno.ENOTDIR, f"{blocking} is a file, not a folder to write into") from None
        raise _cannot_write(shown, exc.errno, f"its folder {path.parent} cannot be created{_refusal(exc)}") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        # Even an existing file is written to a new file beside it first, which /proc, /sys
        # and read-only mounts refuse.
        raise _cannot_write(shown, exc.errno, f"its folder {path.parent} does not allow creating files"
                                              f"{_refusal(exc)}, and an output is first written to a new file "
                                              "there") from None
    os.close(fd)
    try:
        with _naming(shown, tmp):
            yield tmp
        # mkstemp makes the file private (0600); give it the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except OSError as exc:              # e.g. a bind-mounted file (EBUSY): the old one stays
            raise _cannot_write(shown, exc.errno, f"it cannot be replaced ({exc.strerror}); it is left as it "
                                                  "was") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def move_atomic(source: str | Path, path: str | Path) -> None:
    """Move the finished file ``source`` to ``path`` under the rules of `write_bytes_atomic`
    (for outputs a tool writes itself, such as a simulator's waveform)."""
    shown = path
    path, regular = _target(path)
    if not regular:
        with open(source, "rb") as src, _naming(shown, str(path)), open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(source)
        return
    with _replacing(path, shown) as tmp:
        shutil.move(source, tmp)       # a rename on one file system, else a copy


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it. Only a regular
    file is ever replaced: a symlink is followed (its target is written), a device or a
    pipe (``/dev/null``, ``/dev/stdout``) is written through, a directory is refused."""
    shown = path
    path, regular = _target(path)
    if not regular:
        with _naming(shown, str(path)), open(path, "wb") as handle:    # a device or FIFO: nothing to replace
            handle.write(data)
        return
    with _replacing(path, shown) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def write_files_atomic(files: Mapping[str | Path, bytes]) -> None:
    """Write several outputs of one command so that none is replaced unless every one was
    written: regular files go to temporaries beside them first, devices and pipes are then
    written through, and only when all of that succeeded are the temporaries renamed over
    their files (a failure removes them, leaving every previous file as it was)."""
    targets = [(shown, *_target(shown), data) for shown, data in files.items()]
    with ExitStack() as renames:
        for shown, path, regular, data in targets:
            if regular:
                tmp = renames.enter_context(_replacing(path, shown))
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
        for shown, path, regular, data in targets:
            if not regular:
                with _naming(shown, str(path)), open(path, "wb") as handle:
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
