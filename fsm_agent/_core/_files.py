"""Bounded, never-blocking file access: every file fsm-agent reads or writes goes through here.

A path on the command line (or inside a trace) may name anything: a FIFO (opening it blocks until
a writer comes, reading it blocks for ever), ``/dev/zero`` (endless), a directory, a terminal.
Specs and traces are regular files, so anything else is refused with one line before a byte is
read or written. The type is checked twice: ``stat`` before opening, so a device is never opened
at all, and ``fstat`` on the descriptor, so a path swapped in between is caught too; the open
itself is non-blocking, so even a FIFO that appears in that window cannot hang. Reads are capped.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

__all__ = [
    "FileRefused",
    "open_regular",
    "printable",
    "printable_lines",
    "read_bounded",
    "read_tail_under",
    "read_under",
    "require_regular",
]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(OSError):
    """A file that cannot be used as asked; ``strerror`` says why in a few words.

    An ``OSError``, so code that already turns ``OSError`` into a one-line message (``e.strerror``)
    handles it too. ``str()`` is ``PATH: REASON``.
    """

    def __init__(self, path: str, reason: str, code: int = errno.EINVAL) -> None:
        super().__init__(code, reason, path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _refuse_special(path: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = _kind(mode)
        reason = kind if kind.startswith("not ") else f"not a regular file ({kind})"
        raise FileRefused(path, reason, errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL)


def _stat_mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except ValueError as e:  # "embedded null byte"
        raise FileRefused(path, str(e)) from None


def require_regular(path: str | os.PathLike[str], *, missing_ok: bool = False) -> None:
    """Check, without opening it, that ``path`` is a regular file (or, with ``missing_ok``, does
    not exist yet in an existing directory); ``FileRefused`` or ``OSError`` if not."""
    shown = os.fspath(path)
    try:
        _refuse_special(shown, _stat_mode(shown))
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(shown))
        if not missing_ok:
            raise
        if not os.path.isdir(parent):
            raise FileRefused(shown, f"no such directory: {parent}", errno.ENOENT) from None


def open_regular(path: str | os.PathLike[str], flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags)`` for a regular file only; a file descriptor (close-on-exec).

    Raises ``FileRefused`` for a directory, FIFO, device or socket (nothing is opened for a
    device; a FIFO is opened non-blocking and closed again), ``OSError`` as ``os.open`` does.
    With ``O_CREAT`` a missing file is created.
    """
    shown = os.fspath(path)
    try:
        _refuse_special(shown, _stat_mode(shown))
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    # O_NONBLOCK: an open never waits for a FIFO's other end; on a regular file it changes nothing.
    fd = os.open(shown, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode)
    try:
        _refuse_special(shown, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
    """The whole content of the regular file ``path``; ``FileRefused`` if it exceeds ``limit``."""
    shown = os.fspath(path)
    fd = open_regular(shown, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        total = 0
        # Read one byte past the limit: a file that grows while read is still caught.
        while total <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:
        raise FileRefused(shown, f"{what} is larger than {limit} bytes", errno.EFBIG)
    return b"".join(chunks)


def read_under(path: str, roots: Sequence[str], limit: int, what: str = "file") -> bytes:
    """``read_bounded`` for a path that untrusted input names (a trace's stack file), and only
    if it lies under one of ``roots``, the directories the user named; ``FileRefused`` otherwise.

    Both sides are resolved first (``realpath``), so neither ``..`` nor a symbolic link under a
    root that points outside it can reach another file.
    """
    return read_bounded(_under(path, roots), limit, what)


def _under(path: str, roots: Sequence[str]) -> str:
    """``path`` resolved, if it lies under one of ``roots``; ``FileRefused`` otherwise."""
    real = os.path.realpath(path)
    for root in roots:
        top = os.path.realpath(root)
        if os.path.commonpath([top, real]) == top:
            return real
    if not roots:
        raise FileRefused(path, "not read: a trace names it (pass the directory it is in to "
                          "read it)", errno.EACCES)
    raise FileRefused(path, f"not read: outside {', '.join(roots)}", errno.EACCES)


def read_tail_under(path: str, roots: Sequence[str], limit: int) -> bytes:
    """The last ``limit`` bytes (at most) of the regular file ``path``, under one of ``roots``
    only, as :func:`read_under`; a log that grew large is cut, not refused."""
    fd = open_regular(_under(path, roots), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        chunks: list[bytes] = []
        total = 0
        # The file may grow while read: never more than limit bytes.
        while total < limit:
            chunk = os.read(fd, min(1 << 16, limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def printable(text: object, limit: int = 200) -> str:
    """``text`` safe to print on one terminal line: control and other non-printable characters
    escaped (an untrusted trace could hold terminal escape sequences), cut to ``limit``."""
    s = str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def printable_lines(text: object, limit: int = 2000) -> str:
    """``printable`` for each line of ``text``; the line breaks stay."""
    return "\n".join(printable(line, limit) for line in str(text).split("\n"))
