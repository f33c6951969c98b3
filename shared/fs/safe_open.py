"""Opening the files and directories a setting names without being led elsewhere.

The stack runs as root, and an operator may point a setting at a shared directory. So a path is
only used when it is what it should be: never through a symbolic link in its last component,
of the right kind, owned by the user the stack runs as (root in the pod; the invoking user when it
runs unprivileged, as in the tests), and not writable by anyone else. Each check happens on the
opened descriptor (fstat), so the path cannot be swapped between the check and the use. A failed
check raises UnsafePathError, whose message is one line naming the setting, the path and the reason.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import stat

# Mode bits a file must not have: write for anyone but the owner, or, for a secret, any access.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
OTHERS_ANY = stat.S_IRWXG | stat.S_IRWXO
PRIVATE_DIR_MODE = 0o700


class UnsafePathError(OSError):
    """A path a setting names is not what the stack may use; the message says which and why."""


def expected_owner() -> int:
    """Who must own the stack's files: the user it runs as."""
    return os.geteuid()


def _refuse(setting: str, path: os.PathLike | str, reason: str) -> UnsafePathError:
    return UnsafePathError(f"{setting} {os.fspath(path)}: {reason}")


def check_descriptor(fd: int, path: os.PathLike | str, setting: str, kind: int, owner: int | None,
                     forbidden: int = OTHERS_WRITE) -> None:
    """fstat `fd` and raise UnsafePathError unless it is of `kind` (stat.S_IFREG, S_IFDIR), owned by
    `owner` (None: expected_owner()) and has none of the `forbidden` mode bits."""
    info = os.fstat(fd)
    owner = expected_owner() if owner is None else owner
    if stat.S_IFMT(info.st_mode) != kind:
        wanted = "a directory" if kind == stat.S_IFDIR else "a regular file"
        raise _refuse(setting, path, f"is not {wanted}")
    if info.st_uid != owner:
        raise _refuse(setting, path, f"is owned by uid {info.st_uid}, not {owner}")
    if info.st_mode & forbidden:
        what = "accessible" if forbidden & ~OTHERS_WRITE else "writable"
        raise _refuse(setting, path, f"is {what} by group or others (mode {stat.S_IMODE(info.st_mode):04o})")


def _open_nofollow(path: os.PathLike | str, flags: int, mode: int, setting: str) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, mode)
    except OSError as exc:
        # ELOOP, or ENOTDIR when a directory was asked for; the message only says what the path is.
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(path)):
            raise _refuse(setting, path, "is a symbolic link") from None
        if exc.errno == errno.ENOTDIR:
            raise _refuse(setting, path, "is not a directory") from None
        raise _refuse(setting, path, exc.strerror or str(exc)) from None


def open_file(path: os.PathLike | str, flags: int, setting: str, mode: int = 0o600, owner: int | None = None,
              forbidden: int = OTHERS_WRITE) -> int:
    """os.open(path, flags, mode) of a regular file that passes check_descriptor; returns the descriptor.

    Opened non-blocking, so a FIFO in the file's place cannot hold up the caller; the flag is
    cleared once the descriptor is known to be a regular file."""
    fd = _open_nofollow(path, flags | os.O_NONBLOCK, mode, setting)
    try:
        check_descriptor(fd, path, setting, stat.S_IFREG, owner, forbidden)
        if not flags & os.O_NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def opener(setting: str, mode: int = 0o600, owner: int | None = None):
    """An `opener` for open() (and loguru's file sink) that opens through open_file."""

    def open_checked(path: str, flags: int) -> int:
        return open_file(path, flags, setting, mode, owner)

    return open_checked


def ensure_private_dir(path: pathlib.Path, setting: str, owner: int | None = None) -> None:
    """Create `path` (and missing parents) or take the one there, and make it PRIVATE_DIR_MODE.

    It holds the stack's control sockets and secrets: a symbolic link, or a directory somebody else
    owns, is refused (UnsafePathError) rather than used."""
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # something that is no directory: the check below says what
    except OSError as exc:
        raise _refuse(setting, path, f"cannot be created: {exc.strerror or exc}") from None
    fd = _open_nofollow(path, os.O_RDONLY | os.O_DIRECTORY, 0, setting)
    try:
        # Any mode is taken (an emptyDir, for one, is created 0777), as long as the owner is right.
        check_descriptor(fd, path, setting, stat.S_IFDIR, owner, forbidden=0)
        # Only when it differs: a process started on a read-only run dir (which has it right) must not fail.
        if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_DIR_MODE:
            os.fchmod(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)
