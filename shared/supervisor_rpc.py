"""The stack's one way to talk to supervisord: XML-RPC over the run dir's unix socket, each call bounded in
time and in the size of its reply.

Both of the stack's clients go through `exchange`: the watchdog and `rbln-device-plugin status` (an
XML-RPC proxy on it, kubelet_watchdog/supervisor_control.py) and a program that learns the stack stops
(shared/process.py). A supervisord that hangs or babbles becomes a SupervisorUnreachable (an OSError)
within CALL_TIMEOUT, never a stuck or bloated client. Only the standard library's light modules are
imported: every process of the stack loads this one.
"""

from __future__ import annotations

import dataclasses
import pathlib
import socket
import struct
import time

from shared.config import SUPERVISOR_SOCKET

# A local call takes about a millisecond; one that takes this long is from a supervisord that is stuck.
CALL_TIMEOUT = 5.0
# The largest reply the stack asks for (every program's state) is a few kilobytes.
MAX_REPLY_BYTES = 1024 * 1024


class SupervisorUnreachable(OSError):
    """supervisord could not be asked, or its answer came too late, too large or malformed."""


def socket_path(run_dir: pathlib.Path) -> pathlib.Path:
    return run_dir / SUPERVISOR_SOCKET


@dataclasses.dataclass(frozen=True)
class Reply:
    peer_pid: int
    """Who answered on the socket (SO_PEERCRED): supervisord's pid."""
    status: int
    body: bytes


def exchange(run_dir: pathlib.Path, request_body: bytes, timeout: float = CALL_TIMEOUT,
             max_reply: int = MAX_REPLY_BYTES) -> Reply:
    """POST one XML-RPC request to supervisord in `run_dir` and read the whole reply, all within
    `timeout` seconds and `max_reply` bytes; SupervisorUnreachable otherwise."""
    deadline = time.monotonic() + timeout

    def time_left() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout
        return left

    request = (b"POST /RPC2 HTTP/1.0\r\nHost: localhost\r\nContent-Type: text/xml\r\n"
               b"Content-Length: %d\r\n\r\n" % len(request_body)) + request_body
    chunks: list[bytes] = []
    size = 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(time_left())
            connection.connect(str(socket_path(run_dir)))
            credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            connection.settimeout(time_left())
            connection.sendall(request)
            # HTTP/1.0: the reply ends where supervisord closes the connection.
            while True:
                connection.settimeout(time_left())
                chunk = connection.recv(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_reply:
                    raise SupervisorUnreachable(f"supervisord's reply exceeds {max_reply} bytes")
                chunks.append(chunk)
    except SupervisorUnreachable:
        raise
    except socket.timeout:
        raise SupervisorUnreachable(f"supervisord at {socket_path(run_dir)} did not answer within "
                                    f"{timeout:g}s") from None
    except OSError as exc:
        raise SupervisorUnreachable(f"supervisord at {socket_path(run_dir)} did not answer: "
                                    f"{exc.strerror or exc}") from None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise SupervisorUnreachable(f"supervisord answered no HTTP status: {head[:80]!r}") from None
    pid, _uid, _gid = struct.unpack("3i", credentials)
    return Reply(pid, status, body)
