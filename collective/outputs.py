"""Where results go: every target is checked before the work starts, and only a regular file is
ever replaced.

A command that runs for minutes and only then finds it cannot write its result has lost the
work; one that renames its result over whatever sits at the path can destroy a device node, a
FIFO or a directory's link. So a command checks its outputs first (``check_file``,
``check_dir``): the folder exists, or can be made, under a directory this process can write
in; the target is absent or a regular file (a link to a regular file is written through, to
the file it names); anything else is refused with one line that says what is there. Writing
(``write_file``) goes to a fresh temporary file beside the target and renames it over the
target only if the target is still absent or a regular file, so a crash never leaves half a
file under the final name.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO


class OutputError(ValueError):
    """An output path this command must not, or cannot, write."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def _writable_folder(folder: Path, label: str) -> None:
    """``folder`` is a writable directory, or the nearest part of it that exists is one (the
    rest is made when the output is written)."""
    probe = folder
    while True:
        try:
            st = probe.stat()
            break
        except FileNotFoundError:
            if probe.parent == probe:
                raise OutputError(f"{label}: no part of {folder} exists") from None
            probe = probe.parent
        except OSError as e:
            raise OutputError(f"{label}: cannot use {probe} ({e.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{label}: {probe} is {_kind(st.st_mode)}, not a folder")
    # os.access cannot see everything (a read-only mount seen as root, /sys): try for real.
    name = probe / f".collective-probe-{secrets.token_hex(4)}"
    try:
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as e:
        raise OutputError(f"{label}: cannot write in {probe} ({e.strerror})") from None
    name.unlink()


def _target(path: Path, label: str) -> Path:
    """The file ``path`` names (a link's target), if it is absent or a regular file."""
    target = path
    if path.is_symlink():
        target = path.resolve()
        if not target.exists():
            raise OutputError(f"{label}: {path} is a link to nothing ({target})")
    try:
        st = target.stat()
    except (FileNotFoundError, NotADirectoryError):  # absent (the folder is checked apart)
        return target
    except OSError as e:
        raise OutputError(f"{label}: cannot use {path} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        via = f" (a link to {target})" if target != path else ""
        raise OutputError(
            f"{label}: {path}{via} is {_kind(st.st_mode)}; only a regular file is replaced"
        )
    return target


def check_file(path: str | Path, label: str = "output") -> Path:
    """The file to write for ``path``, checked now; :class:`OutputError` if it must not be
    written. A link to a regular file resolves to that file."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise OutputError(f"{label}: {path} names a folder, not a file")
    target = _target(path, label)
    _writable_folder(target.parent, label)
    return target


def check_dir(path: str | Path, label: str = "output") -> Path:
    """A folder to write into: a writable directory, or absent under one (made when written)."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"{label}: cannot use {path} ({e.strerror})") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{label}: {path} is {_kind(st.st_mode)}, not a folder")
        _writable_folder(path, label)
    else:
        _writable_folder(path.parent, label)
    return path


def begin_file(path: str | Path, label: str = "output") -> tuple[Path, Path, BinaryIO]:
    """Start writing ``path``: the file it names (a link's target), a fresh temporary file
    beside it, and that file open for writing. :func:`finish_file` puts it in place."""
    target = _target(Path(path), label)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
    return target, tmp, os.fdopen(fd, "w+b")


def finish_file(target: Path, tmp: Path, label: str = "output") -> Path:
    """Rename the written ``tmp`` over ``target``, if that is still absent or a regular file."""
    # Checked again just before the rename: the work may have taken hours, and what was
    # written is kept either way.
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(
            f"{label}: {target} became {_kind(st.st_mode)} while this ran; "
            f"the output is kept in {tmp}"
        )
    os.replace(tmp, target)
    return target


def write_file(path: str | Path, data: bytes, label: str = "output") -> Path:
    """Write ``data`` to ``path`` atomically, replacing only a regular file; returns the file
    written (a link's target)."""
    target, tmp, f = begin_file(path, label)
    try:
        with f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return finish_file(target, tmp, label)
