"""Files replaced whole: a reader (or a restart after a crash or a full disk) sees the old content or the new,
never a part."""

from __future__ import annotations

import os
import pathlib
import tempfile


def write_atomically(path: pathlib.Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Write `data` to a temporary file beside `path` and rename it over `path`; `durable`: the data flushed to
    disk before the rename and the directory after it (a few milliseconds on a disk; what a file on tmpfs does
    not need), as the kubelet writes its own checkpoints. After a power loss the file is then the old content
    or the new, never a torn one, and once this returns, the new.

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
        if durable:
            directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
