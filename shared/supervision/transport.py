"""The stack's one way to talk to supervisord: XML-RPC over the run dir's unix socket, with the stack's
credentials, each call bounded in time and in the size of its reply.

Every call goes through `exchange`: the XML-RPC `Supervisor` of the watchdog and `rbln-device-plugin status`
(client.py) and the question a program asks at shutdown, whether the whole stack stops
(`stopping_supervisord`). A supervisord that hangs or babbles becomes a SupervisorUnreachable (an OSError)
within CALL_TIMEOUT, never a stuck or bloated client. Only the standard library's light modules are
imported: every process of the stack loads this one.

Credentials: supervisord's [unix_http_server] asks for a user name and password. `rbln-device-plugin run`
makes a new password at every start and writes it to CREDENTIALS_FILE in the private run dir, which
supervisor.conf includes; a client reads it from there, so a process started by `kubectl exec` finds it
too, and the secret is in no environment, command line or log.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pathlib
import socket
import struct
import time

from shared.config import RUN_DIR_ENV, SUPERVISOR_SOCKET
from shared.fs import safe_open

CREDENTIALS_FILE = "supervisord-auth.conf"
USERNAME = "rbln-device-plugin"
# A local call takes about a millisecond; one that takes this long is from a supervisord that is stuck.
CALL_TIMEOUT = 5.0
# The largest reply the stack asks for (every program's state) is a few kilobytes.
MAX_REPLY_BYTES = 1024 * 1024
_MAX_CREDENTIALS_BYTES = 4096
_SECTION = "unix_http_server"
# supervisor.xmlrpc.Faults: SHUTDOWN_STATE is supervisord's answer to any request while it stops every program;
# ALREADY_STARTED and NOT_RUNNING answer an order that finds its program already as it was asked to be.
SHUTDOWN_STATE_FAULT = 6
ALREADY_STARTED_FAULT = 60
NOT_RUNNING_FAULT = 70
# Written out rather than built by xmlrpc.client, whose imports would cost every process some 20 ms.
_GET_STATE = b"<?xml version='1.0'?><methodCall><methodName>supervisor.getState</methodName></methodCall>"


class SupervisorUnreachable(OSError):
    """supervisord could not be asked, or its answer came too late, too large or malformed."""


def socket_path(run_dir: pathlib.Path) -> pathlib.Path:
    return run_dir / SUPERVISOR_SOCKET


def write_credentials(run_dir: pathlib.Path) -> None:
    """Give supervisord a new password (run dir created and checked already); UnsafePathError if the
    file in its place is not the stack's."""
    path = run_dir / CREDENTIALS_FILE
    # Hex digits only: nothing for the INI parser's %-interpolation to expand.
    text = (f"; Written by `rbln-device-plugin run` at each start: supervisord's socket credentials.\n"
            f"[{_SECTION}]\nusername={USERNAME}\npassword={os.urandom(32).hex()}\n")
    fd = safe_open.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, RUN_DIR_ENV,
                             forbidden=safe_open.OTHERS_ANY)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _authorization(run_dir: pathlib.Path) -> bytes:
    """The Authorization header for supervisord's socket in `run_dir`."""
    path = run_dir / CREDENTIALS_FILE
    try:
        fd = safe_open.open_file(path, os.O_RDONLY, RUN_DIR_ENV, forbidden=safe_open.OTHERS_ANY)
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(_MAX_CREDENTIALS_BYTES + 1)
    except OSError as exc:
        raise SupervisorUnreachable(f"cannot read supervisord's credentials: {exc}") from None
    import configparser  # here: only clients of supervisord pay for it (about 0.2 MB), not every process

    parser = configparser.ConfigParser(interpolation=None)
    try:
        if len(raw) > _MAX_CREDENTIALS_BYTES:
            raise ValueError("file too large")
        parser.read_string(raw.decode())
        username, password = parser.get(_SECTION, "username"), parser.get(_SECTION, "password")
    except (ValueError, configparser.Error) as exc:
        raise SupervisorUnreachable(f"unreadable supervisord credentials in {path}: {exc}") from None
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return f"Authorization: Basic {token}\r\n".encode()


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
            raise TimeoutError
        return left

    request = (b"POST /RPC2 HTTP/1.0\r\nHost: localhost\r\nContent-Type: text/xml\r\n"
               b"Content-Length: %d\r\n" % len(request_body)) + _authorization(run_dir) + b"\r\n" + request_body
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
    except TimeoutError:
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


def fault_code(response: bytes) -> int | None:
    """The faultCode of an XML-RPC fault response; None for any other answer."""
    from xml.etree import ElementTree  # here: read only at shutdown; every process would pay about 0.5 MB

    try:
        code = ElementTree.fromstring(response).findtext("fault/value/struct/member[name='faultCode']/value/*")
        return None if code is None else int(code)
    except (ElementTree.ParseError, ValueError):
        return None


def program_order(method: str, program: str) -> bytes:
    """The XML-RPC request `supervisor.<method>(program, wait=False)` (startProcess, stopProcess): written out,
    as _GET_STATE is, for the scanner, which orders its workers started and stopped. Program names are the
    stack's own (shared.programs), which need no escaping."""
    if not program.replace("-", "").isalnum() or not method.isalpha():
        raise ValueError(f"not a program order: {method}({program!r})")
    return (b"<?xml version='1.0'?><methodCall><methodName>supervisor.%s</methodName><params>"
            b"<param><value><string>%s</string></value></param><param><value><boolean>0</boolean></value></param>"
            b"</params></methodCall>" % (method.encode(), program.encode()))


def stopping_supervisord(run_dir: pathlib.Path, timeout: float) -> int | None:
    """The pid of the supervisord answering in `run_dir` while it stops every program (to exit or to reload:
    it then refuses every request, and answers a partial stop normally); None when it is not stopping
    everything or gives no answer within `timeout`."""
    try:
        answer = exchange(run_dir, _GET_STATE, timeout=timeout)
    except OSError:
        return None
    return answer.peer_pid if fault_code(answer.body) == SHUTDOWN_STATE_FAULT else None
