"""The stack's exchange with supervisord: credentials from the run dir, every call bounded in time and size.

The servers here are stand-ins on a real unix socket that misbehave as a wedged or broken supervisord would."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import threading
import time
import xmlrpc.client
from collections.abc import Callable, Iterator

import pytest

from shared.supervision import transport
from shared.supervision.client import SupervisorError, connect
from shared.supervision.transport import SupervisorUnreachable, exchange

STATE_REPLY = xmlrpc.client.dumps(({"statecode": 1, "statename": "RUNNING"},), methodresponse=True).encode()


def http_reply(body: bytes, status: str = "200 OK") -> bytes:
    return b"HTTP/1.0 %s\r\nContent-Type: text/xml\r\nContent-Length: %d\r\n\r\n" % (status.encode(), len(body)) + body


@contextlib.contextmanager
def stand_in(run_dir, behave: Callable[[socket.socket, bytes], None]) -> Iterator[list[bytes]]:
    """A server on the run dir's supervisord socket: `behave(connection, request)` answers each request.
    Yields the requests received."""
    requests: list[bytes] = []
    stopped = threading.Event()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(transport.socket_path(run_dir)))
        listener.listen()
        listener.settimeout(0.1)

        def serve():
            while not stopped.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                with connection:
                    connection.settimeout(5)
                    request = connection.recv(65536)
                    requests.append(request)
                    with contextlib.suppress(OSError):
                        behave(connection, request)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            yield requests
        finally:
            stopped.set()
            server.join(10)


@pytest.fixture
def run_dir(short_tmp):
    short_tmp.chmod(0o700)
    transport.write_credentials(short_tmp)
    return short_tmp


def password(run_dir) -> str:
    return (run_dir / transport.CREDENTIALS_FILE).read_text().split("password=")[1].strip()


def test_a_request_carries_the_credentials_of_the_run_dir_and_the_peer_is_known(run_dir):
    with stand_in(run_dir, lambda connection, _: connection.sendall(http_reply(STATE_REPLY))) as requests:
        reply = exchange(run_dir, b"<methodCall/>")
    assert (reply.status, reply.body, reply.peer_pid) == (200, STATE_REPLY, os.getpid())
    token = base64.b64encode(f"{transport.USERNAME}:{password(run_dir)}".encode())
    assert b"Authorization: Basic " + token + b"\r\n" in requests[0]
    assert requests[0].endswith(b"\r\n\r\n<methodCall/>")


def test_every_start_writes_a_new_private_password(run_dir):
    first = password(run_dir)
    transport.write_credentials(run_dir)
    assert password(run_dir) != first and len(first) == 64
    assert (run_dir / transport.CREDENTIALS_FILE).stat().st_mode & 0o777 == 0o600


def test_a_supervisord_that_never_answers_costs_one_timeout(run_dir):
    with stand_in(run_dir, lambda connection, _: time.sleep(3)):
        with pytest.raises(SupervisorUnreachable, match=r"did not answer within 0\.3s"):
            exchange(run_dir, b"<methodCall/>", timeout=0.3)


def test_a_reply_that_trickles_in_is_cut_off_at_the_deadline_not_per_read(run_dir):
    def trickle(connection, _):
        connection.sendall(b"HTTP/1.0 200 OK\r\n")
        for _ in range(100):
            connection.sendall(b"X")
            time.sleep(0.05)

    with stand_in(run_dir, trickle):
        with pytest.raises(SupervisorUnreachable, match=r"did not answer within 0\.5s"):
            exchange(run_dir, b"<methodCall/>", timeout=0.5)


def test_a_reply_larger_than_the_cap_is_refused(run_dir):
    with stand_in(run_dir, lambda connection, _: connection.sendall(http_reply(b"x" * 300_000))):
        with pytest.raises(SupervisorUnreachable, match="reply exceeds 100000 bytes"):
            exchange(run_dir, b"<methodCall/>", max_reply=100_000)


@pytest.mark.parametrize("damage", ["missing", "readable by others", "a link"])
def test_credentials_that_are_not_the_stack_s_are_not_used(run_dir, damage):
    credentials = run_dir / transport.CREDENTIALS_FILE
    if damage == "missing":
        credentials.unlink()
    elif damage == "readable by others":
        credentials.chmod(0o644)
    else:
        credentials.rename(run_dir / "elsewhere")
        credentials.symlink_to(run_dir / "elsewhere")
    with stand_in(run_dir, lambda connection, _: connection.sendall(http_reply(STATE_REPLY))) as requests:
        with pytest.raises(SupervisorUnreachable, match="cannot read supervisord's credentials: "
                                                        "RBLN_DEVICE_PLUGIN_RUN_DIR "):
            exchange(run_dir, b"<methodCall/>")
    assert requests == []


@pytest.mark.parametrize("answer", [http_reply(b"", "401 Unauthorized"), http_reply(b"<not xml"),
                                    b"garbage without a status line", b""],
                         ids=["refused", "not xml", "no status", "closed"])
def test_the_watchdog_s_client_turns_every_bad_answer_into_a_supervisor_error(run_dir, answer):
    with stand_in(run_dir, lambda connection, _: connection.sendall(answer)):
        with pytest.raises(SupervisorError):
            connect(run_dir).programs()


def test_no_supervisord_at_all_is_a_supervisor_error(run_dir):
    with pytest.raises(SupervisorError, match="did not answer: "):
        connect(run_dir).programs()
