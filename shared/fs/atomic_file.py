"""Files replaced whole: the one way this project writes a file that others read or that must survive a crash.

A reader (or a restart after a crash or a full disk) sees the old content or the new, never a part. The new
content goes to a temporary file beside the target, which is then renamed over it; a failed write (a full
disk, a read-only directory) leaves the old file as it was and no temporary file behind.

The temporary file's name is fixed per target and starts with a dot: directories read by others (a CDI spec
dir, the kubelet's plugin dirs, NFD's feature dir) skip such names, and a temporary file a killed writer left
is replaced by the next write instead of piling up. Writers of one file therefore take turns: each file has
one owner (or its writers hold a lock around the write).
"""

from __future__ import annotations

import contextlib
import os
import pathlib


def temp_path(path: pathlib.Path) -> pathlib.Path:
    """Where the next content of `path` is written first: a dot name in the same directory (one filesystem)."""
    return path.with_name(f".{path.name}.tmp")


def _fsync_directory(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: pathlib.Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `data` in one step, with permissions `mode` whatever the umask.

    `durable`: the data flushed to disk before the rename and the directory after it (a few milliseconds on a
    disk; what a file on tmpfs does not need), as the kubelet writes its own checkpoints: after a power loss
    the file is the old content or the new, and the new one once this returned. OSError on failure, with the
    old file untouched and no temporary file left behind.
    """
    temp = temp_path(path)
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    if durable:
        _fsync_directory(path.parent)
