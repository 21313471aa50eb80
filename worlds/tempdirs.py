"""Temporary directories that the next process can tell are abandoned, and remove.

A process killed with ``kill -9`` runs no cleanup: its temporary directories stay, and so may a
sandboxed child still running in one (the engine enforced its wall-time limit). So each
directory holds a lock for as long as its owner lives: an ``flock`` on its ``.owner`` file,
which the kernel releases when the owner dies, however it dies, whichever PID namespace it ran
in. :func:`sweep` removes only directories whose lock it can take, after killing any process of
this user still working in one; a directory without a ``.owner`` file (made by something else,
or not finished yet) is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import stat
import tempfile
from pathlib import Path

LOCK = ".owner"
_NEW = ".new-"  # a directory being made: it gets its locked .owner before its final name


class OwnedDir:
    """A fresh directory ``<tmp>/<prefix><random>`` locked by this process until :meth:`remove`."""

    def __init__(self, prefix: str) -> None:
        staging = Path(tempfile.mkdtemp(prefix=_NEW + prefix))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(staging / (LOCK + _NEW), flags, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        # Renames keep the lock (it belongs to the open file): a sweeper never sees the
        # directory or its .owner unlocked.
        os.rename(staging / (LOCK + _NEW), staging / LOCK)
        self.path = staging.with_name(prefix + secrets.token_hex(8))
        os.rename(staging, self.path)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_swept: set[str] = set()


def sweep_once(prefix: str) -> None:
    """:func:`sweep`, the first time this process asks for ``prefix``: a new process clears
    what killed ones left, once."""
    if prefix not in _swept:
        _swept.add(prefix)
        sweep(prefix)


def sweep(prefix: str) -> list[Path]:
    """Remove the abandoned ``<prefix>*`` directories of this user in the temporary directory."""
    removed = []
    top = Path(tempfile.gettempdir())
    for entry in os.scandir(top):
        if not entry.name.startswith((prefix, _NEW + prefix)):
            continue
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fd = os.open(Path(entry.path) / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its owner lives
                _kill_workers(Path(entry.path))
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
            finally:
                os.close(fd)
    return removed


def _kill_workers(directory: Path) -> None:
    """SIGKILL every process of this user whose working directory is in ``directory``: a
    sandboxed run whose engine died before its time limit (its ``unshare`` takes the whole
    PID namespace with it)."""
    inside = str(directory)
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if proc.stat().st_uid != os.geteuid():
                continue
            cwd = os.readlink(proc / "cwd")
            if cwd == inside or cwd.startswith(inside + os.sep):
                os.kill(int(proc.name), signal.SIGKILL)
