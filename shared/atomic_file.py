"""Files replaced whole: a reader (or a restart after a crash or a full disk) sees the old content or the new,
never a part."""

from __future__ import annotations

import os
import pathlib
import tempfile


def write_atomically(path: pathlib.Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write `data` to a temporary file beside `path` and rename it over `path`; `durable`: flushed to disk
    first, and the rename after it (a few milliseconds on a disk; what a file on tmpfs does not need).

    The temporary file's name starts with a dot: directories read by others (a CDI spec dir, the kubelet's
    plugin dirs) skip such names. OSError on failure, with no temporary file left behind.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if not durable:
        return
    # The rename itself is durable only once the directory is.
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
