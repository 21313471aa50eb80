"""Where results go, and what is read: every target is checked before the work starts, only a
regular file is ever replaced, and only a regular file is ever read.

A command that runs for minutes and only then finds it cannot write its result has lost the
work; one that renames its result over whatever sits at the path can destroy a device node, a
FIFO, a directory's link, or the very file it read. So a command checks its outputs first
(``check_file``, ``check_dir``): the path is not empty and does not end in ``/`` (a file's
path names a file; ``dir/new/`` is refused, never read as a file called ``new``), its name fits
the file system, the folder exists, or can be made, under a directory this process can write
in; the target is absent or a regular file (a link to a regular file is written through, to
the file it names) and is not the same file (device and inode, links resolved) as any of the
command's inputs; anything else is refused with one line that says what is there. Writing
(``write_file``, ``writing``, ``EpisodeWriter``) goes to a fresh temporary file beside the
target and renames it over the target only if the target is still absent or a regular file,
so a crash never leaves half a file under the final name; a write that fails (a full disk, a
read-only mount, a file size limit) removes its temporary file, keeps the old file, and says
so in one line (:class:`OutputError`). A folder written as a whole (``make-model``) is built
beside its target the same way and renamed into place (``writing_dir``).

Inputs are opened by ``open_input``: a FIFO, a device or a socket would block a reader forever
(or feed it without end), so anything but a regular file is refused before it is read, and
opening never waits (``O_NONBLOCK``) for a FIFO's writer.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO


class OutputError(ValueError):
    """An output path this command must not, or cannot, write."""


class InputError(ValueError):
    """An input path this command must not read (not a regular file)."""


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


def _nearest_folder(folder: Path) -> Path:
    while not folder.is_dir() and folder.parent != folder:
        folder = folder.parent
    return folder


def _name_fits(path: Path, label: str) -> None:
    """The name (and every folder's name on the way) fits the file system's NAME_MAX."""
    try:
        longest = os.pathconf(_nearest_folder(path.parent), "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > longest:
            raise OutputError(
                f"{label}: the name {part[:24]}... is {size} bytes, longer than the "
                f"{longest} this file system allows"
            )


def _target(path: Path, label: str) -> Path:
    """The file ``path`` names (a link's target), if it is absent or a regular file."""
    target = path
    try:
        if path.is_symlink():
            target = path.resolve(strict=False)
    except (OSError, RuntimeError) as e:  # RuntimeError: Python 3.11's "Symlink loop"
        why = getattr(e, "strerror", None) or "a symlink loop"
        raise OutputError(f"{label}: cannot use {path} ({why})") from None
    if target != path and not target.exists():
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


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _stat(path: str | Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def not_an_input(
    path: str | Path, inputs: Iterable[str | Path], label: str, shown: str | Path = ""
) -> None:
    """Refuse ``path`` (``shown``: as the user gave it) if it is, device and inode, links
    resolved, one of ``inputs``: writing it would destroy what the command reads."""
    shown = shown or path
    out = _stat(path)
    if out is None:
        return
    for given in inputs:
        st = _stat(given) if given else None
        if st is not None and _same(out, st):
            via = "" if Path(given) == Path(shown) else f" (the same file as {given})"
            raise OutputError(
                f"{label}: {shown} is an input of this command{via}; writing it would destroy "
                "it: pick another path"
            )


def _raw_path(path: str | Path, label: str) -> Path:
    text = os.fspath(path)
    if text == "":
        raise OutputError(f"{label}: an empty path")
    return Path(text)


def check_file(path: str | Path, label: str = "output", inputs: Iterable[str | Path] = ()) -> Path:
    """The file to write for ``path``, checked now; :class:`OutputError` if it must not be
    written (see the module's docstring). A link to a regular file resolves to that file."""
    text = os.fspath(path)
    path = _raw_path(path, label)
    if text.endswith(os.sep) or path.name in ("", ".", ".."):
        raise OutputError(f"{label}: {text} names a folder, not a file")
    _name_fits(path, label)
    target = _target(path, label)
    not_an_input(target, inputs, label, text)
    _writable_folder(target.parent, label)
    return target


def check_dir(
    path: str | Path,
    label: str = "output",
    inputs: Iterable[str | Path] = (),
    writes: Iterable[str] = (),
) -> Path:
    """A folder to write into: a writable directory, or absent under one (made when written).
    ``writes``: the names the command writes in it, none of which may be one of ``inputs``."""
    path = _raw_path(path, label)
    _name_fits(path, label)
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
        inputs = list(inputs)
        for name in writes:
            not_an_input(path / name, inputs, label)
    else:
        _writable_folder(path.parent, label)
    return path


# -- reading ----------------------------------------------------------------------------------


def open_input(path: str | Path, label: str = "input") -> BinaryIO:
    """``path`` open for reading, if it is a regular file (links followed). A FIFO, device,
    socket or folder is refused in one line before a byte is read: opening does not wait for
    a FIFO's writer (``O_NONBLOCK``), and the kind is checked on the open file itself, so
    nothing can be swapped in between. A missing or unreadable file: ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{label}: {path} is {_kind(mode)}; only a regular file is read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_input(path: str | Path, label: str = "input") -> None:
    """Refuse ``path`` now if it exists and is not a regular file (see :func:`open_input`);
    for readers that open the file themselves (``torch.load``, ``tomllib``)."""
    st = _stat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InputError(f"{label}: {path} is {_kind(st.st_mode)}; only a regular file is read")


# -- writing ----------------------------------------------------------------------------------


def _tmp_beside(target: Path) -> Path:
    # The target's name, cut so that the temporary name fits wherever the target's does.
    return target.with_name(f".{target.name[:200]}.{secrets.token_hex(4)}.tmp")


def _cause(e: BaseException, folder: Path) -> str | None:
    """Why a write into ``folder`` failed, in the system's words (None: not the disk's fault).
    A library that wraps the system's error (torch, safetensors) is asked again by a probe."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    if not isinstance(e, Exception) or isinstance(e, (OutputError, InputError)):
        return None  # Ctrl-C, or an error already in words
    probe = folder / f".collective-probe-{secrets.token_hex(4)}"
    try:
        with open(probe, "xb") as f:
            f.write(bytes(1 << 16))
            f.flush()
            os.fsync(f.fileno())
    except OSError as probed:
        return probed.strerror or str(probed)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def _failed(target: Path, e: BaseException, folder: Path, label: str) -> OutputError | None:
    cause = _cause(e, folder)
    if cause is None:
        return None
    kept = " (the old file is kept)" if target.exists() else ""
    return OutputError(f"{label}: cannot write {target} ({cause}){kept}")


def begin_file(
    path: str | Path, label: str = "output", buffering: int = -1
) -> tuple[Path, Path, BinaryIO]:
    """Start writing ``path``: the file it names (a link's target), a fresh temporary file
    beside it, and that file open for writing. :func:`finish_file` puts it in place."""
    target = _target(Path(path), label)
    tmp = _tmp_beside(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
    except OSError as e:
        raise OutputError(f"{label}: cannot write {target} ({e.strerror})") from None
    return target, tmp, os.fdopen(fd, "w+b", buffering=buffering)


def abandon_file(
    target: Path, tmp: Path, f: BinaryIO | None, e: BaseException, label: str
) -> OutputError | None:
    """A write into ``tmp`` failed with ``e``: remove it, and return the one-line error to
    raise instead (None: ``e`` is not the disk's doing; raise it as it is)."""
    err = _failed(target, e, tmp.parent, label)
    if f is not None:
        with contextlib.suppress(OSError):
            f.close()
    tmp.unlink(missing_ok=True)
    return err


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
    try:
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{label}: cannot write {target} ({e.strerror})") from None
    return target


@contextlib.contextmanager
def writing(path: str | Path, label: str = "output", buffering: int = -1) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through: a temporary beside it, renamed over it when
    the block ends; on any error the temporary goes, the old file stays, and an error of the
    disk (full, read-only, a size limit) becomes one :class:`OutputError` line."""
    target, tmp, f = begin_file(path, label, buffering)
    try:
        with f:
            yield f
    except BaseException as e:
        err = abandon_file(target, tmp, f, e, label)
        if err is None:
            raise
        raise err from None
    finish_file(target, tmp, label)


def write_file(path: str | Path, data: bytes | memoryview, label: str = "output") -> Path:
    """Write ``data`` to ``path`` atomically, replacing only a regular file; returns the file
    written (a link's target)."""
    with writing(path, label) as f:
        f.write(data)
    return _target(Path(path), label)


@contextlib.contextmanager
def writing_dir(path: str | Path, label: str = "output") -> Iterator[Path]:
    """A folder to build ``path`` in (absent, or empty: checked by :func:`check_dir`), renamed
    into place when the block ends; on any error it goes, and a disk error is one line."""
    target = Path(path)
    tmp = _tmp_beside(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise OutputError(f"{label}: cannot write {target} ({e.strerror})") from None
    try:
        yield tmp
        os.replace(tmp, target)  # over an empty folder too (rename(2))
    except BaseException as e:
        err = _failed(target, e, tmp, label)
        shutil.rmtree(tmp, ignore_errors=True)
        if err is None:
            raise
        raise err from None


def save_torch(obj: object, path: str | Path, label: str = "checkpoint") -> Path:
    """``torch.save`` through :func:`write_file`: serialised in memory first, so that a full
    disk is the system's one-line error, not torch's wrapped one, and no half file is left."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return write_file(path, buffer.getbuffer(), label)


def save_figure(fig: object, path: str | Path, label: str = "output", dpi: int = 150) -> Path:
    """A matplotlib figure written through :func:`writing` (its format from the suffix)."""
    path = Path(path)
    with writing(path, label) as f:
        fig.savefig(f, dpi=dpi, format=path.suffix.lstrip(".") or None)  # type: ignore[attr-defined]
    return path


# -- what reaches a terminal ------------------------------------------------------------------

# C0 and C1 controls, DEL, and the characters that reorder or break a line (bidirectional
# overrides and isolates, line and paragraph separators): what lets text from a file or an
# agent set a terminal's title, clear its screen, or show a line other than the one printed.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_NEWLINE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: str, keep_newlines: bool = False) -> str:
    """``text`` safe to print to a terminal: every control character written as an escape
    (``\\x1b``, ``\\n``, ``\\u202e``), as ``repr`` would, the rest as it is. ``keep_newlines``
    keeps line breaks (where the layout puts them). The one place every human-readable output
    of the command line goes through (``collective.cli.shared.say``); JSON is escaped by its
    encoder."""
    if text.isprintable():
        return text
    return (_CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL).sub(_escaped, text)
