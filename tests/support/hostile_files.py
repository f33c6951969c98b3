"""Node files made hostile (symlink loops, junk status files) and reads done without root's rights."""

from __future__ import annotations

import os
import pathlib
import pickle
import shutil

from simulator.node import SimulatedNode

NOBODY = 65534


def bus_link(node: SimulatedNode, device_id: str) -> pathlib.Path:
    return node.sysfs_root / "bus" / "pci" / "devices" / node.device(device_id).bus_id


def replace_with_loop(path: pathlib.Path) -> None:
    """`path` becomes a symlink to itself: every lookup through it fails with ELOOP."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(path.name)


HUGE_ZEROS = b"0" * (1 << 20)  # would read as READY if it were read whole


STATUS_JUNK = {
    "malformed": lambda path: path.write_bytes(b"ready\n"),
    "empty": lambda path: path.write_bytes(b""),
    "binary": lambda path: path.write_bytes(bytes(range(256))),
    "huge": lambda path: path.write_bytes(HUGE_ZEROS),
    "a directory": lambda path: path.mkdir(),
    "a symlink loop": lambda path: path.symlink_to(path.name),
    "a fifo": lambda path: os.mkfifo(path),
    "a dangling symlink": lambda path: path.symlink_to("/nonexistent/status"),
}


def as_unprivileged(function, *args):
    """Run `function(*args)` in a forked child without root's right to read anything (as nobody when we are
    root), and return its result. Only the calling thread is copied by fork: the child runs nothing but this."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            os.write(write_end, pickle.dumps(function(*args)))
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        payload = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged child failed"
    return pickle.loads(payload)


def open_to_all(root: pathlib.Path) -> None:
    """Let an unprivileged process traverse `root` and everything above it that the test created."""
    for path in [root, *root.parents]:
        if str(path).startswith("/tmp/rbln-"):
            path.chmod(0o755)
    for directory, dirs, _files in os.walk(root):
        for name in dirs:
            (pathlib.Path(directory) / name).chmod(0o755)
