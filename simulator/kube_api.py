"""A loopback HTTP stand-in for the few API server endpoints worker-dra calls: the API server of
`rbln-device-plugin simulate --resource-api dra`, and of the tests of worker-dra's client and the benchmarks
(the real kube-apiserver runs in tests/dra). It keeps ResourceSlices, ResourceClaims and Nodes as JSON (slices
sent in the API server's protobuf encoding are decoded, unless `protobuf` is off: then 415; answers are JSON
whatever is asked, as a server may answer), records
every request, and can be told to fail the next requests with a status, or to carry them out and lose their
answers. ResourceSlices have resource versions (one counter for all, as etcd's), updates and deletes honour them
as preconditions (409), a create of a name there is already is refused (409 AlreadyExists), and a watch streams
the slices' changes after a version until its timeoutSeconds pass or `end_watches` ends them; a watch-list
(sendInitialEvents) first sends the slices there are and the bookmark that ends them, or 422 while
`watch_lists` is off, as from an API server without the WatchList feature. Given a key and a
certificate, it serves HTTPS with them, and its kubeconfig names the certificate as the cluster's CA, as a real
API server is reached: what the client loads and runs for TLS is then part of what is measured. It speaks
HTTP/1.1 and HTTP/2 on the one port (simulator/http2_server.py carries HTTP/2), and can play the ways an HTTP/2
connection ends: a GOAWAY, or a server that goes silent."""

from __future__ import annotations

import base64
import functools
import http.server
import itertools
import json
import pathlib
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

from shared.kubeapi import protobuf
from simulator.http2_server import Http2Server, Request, Stream

RESOURCE = "/apis/resource.k8s.io/v1"
_JSON_CONTENT = [("content-type", "application/json")]


class _Watch:
    """A watch's events, whichever protocol carries them. Iterating yields each event's line (JSON and a newline):
    a watch-list's slices and the bookmark that ends them first, then the slices' changes after the version asked
    for as they come, and b"" whenever 0.2 s pass without one, so that a transport can look whether its client is
    still there. It ends when its timeoutSeconds pass or `end_watches` ends it."""

    def __init__(self, api: FakeKubeApi, query: dict[str, str]) -> None:
        """Called with the api's lock held: the watch starts from the state of the moment it was asked for."""
        self._api = api
        self._since = int(query.get("resourceVersion") or 0)
        self._deadline = time.monotonic() + int(query.get("timeoutSeconds") or 3600)
        self._generation = api._watch_generation
        self._wanted = _selector(query)
        self._initial: list[bytes] = []
        if query.get("sendInitialEvents") == "true":
            self._since = api._version
            events = [{"type": "ADDED", "object": item} for item in api.slices.values()
                      if _selected(item, self._wanted)]
            events.append({"type": "BOOKMARK", "object": {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {
                    "resourceVersion": str(self._since), "annotations": {"k8s.io/initial-events-end": "true"}}}})
            self._initial = [_line(event) for event in events]

    def __iter__(self) -> Iterator[bytes]:
        yield from self._initial
        while True:
            # Never yields with the lock held: the transport's writes may wait for the client.
            with self._api._lock:
                if self._api._watch_generation != self._generation or time.monotonic() >= self._deadline:
                    return
                changes = self._changes()
                if not changes:
                    self._api._lock.wait(min(0.2, max(0.0, self._deadline - time.monotonic())))
            yield from changes or [b""]

    def _changes(self) -> list[bytes]:
        """With the lock held: the lines of the changes since the last looked at that the watch selects."""
        lines = []
        for version, kind, item in [e for e in self._api._events if e[0] > self._since]:
            self._since = version
            if _selected(item, self._wanted):
                lines.append(_line({"type": kind, "object": item}))
        return lines


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request to the stand-in over HTTP/1.1: its `server.api` answers it."""

    def log_message(self, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        api: FakeKubeApi = self.server.api  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        answer = api._answer(self.command, self.path, self.rfile.read(length) if length else b"",
                             self.headers.get("Content-Type") or "")
        if answer is None:
            self.close_connection = True  # the answer lost: the connection closes without it
        elif isinstance(answer, _Watch):
            self._stream(answer)
        else:
            self._reply(*answer)

    def _reply(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, watch: _Watch) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        for line in watch:
            if line:
                try:
                    self.wfile.write(line)
                    self.wfile.flush()
                except OSError:  # the client went away
                    return

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


def _serve_http2(api: FakeKubeApi, request: Request, stream: Stream) -> None:
    """One request to the stand-in over HTTP/2, on its stream's own thread."""
    answer = api._answer(request.method, request.path, request.body, request.headers.get("content-type", ""))
    if answer is None:
        stream.drop_connection()  # the answer lost, as a real API server's "Server disconnected"
    elif isinstance(answer, _Watch):
        if stream.start(200, _JSON_CONTENT) and all(stream.send(line) for line in answer):
            stream.end()  # else the client reset the stream, or the connection closed: the watch stops
    else:
        status, data = answer
        stream.respond(status, data, _JSON_CONTENT)


class FakeKubeApi:
    """The stand-in: its dicts hold the objects, `requests` the (method, path with query) of each request.

    It serves HTTP/1.1 and HTTP/2 on one port (simulator/http2_server.py): over TLS as ALPN chose, h2 offered
    first; over plain HTTP, HTTP/2 with prior knowledge when a connection opens with its preface. Both answer
    alike, and these work for both:

    `fail`: statuses to answer the next requests with, one each, before anything is carried out.
    `lose_answers`: the next this many requests are carried out and their connections closed unanswered (over
    HTTP/2 the whole TCP connection, every stream on it lost, as a real API server's "Server disconnected").
    `taints_off`, `watch_lists`: an API server without DRADeviceTaints, or without the WatchList feature.
    `end_watches()`: ends every open watch, as an API server's restart does.

    For tests of an HTTP/2 client:
    `goaway()`: a GOAWAY (NO_ERROR, last stream = the highest the client opened) on every open HTTP/2
    connection; its streams in flight are answered (a watch runs to its end), then the connection is closed, and
    streams opened after the GOAWAY are refused (REFUSED_STREAM).
    `unresponsive` (bool, False): while True, HTTP/2 connections read and answer nothing at all, not even PINGs
    or SETTINGS: a server gone without a word. A connection that was in use meanwhile stays silent for good,
    even after it is set back to False (its client's bytes went unread); new connections answer again.
    `connections` (int): the TCP connections accepted so far, of either protocol, to check that a client
    keeps to one."""

    def __init__(self, tls: tuple[pathlib.Path, pathlib.Path] | None = None) -> None:
        """`tls`: (key, certificate) PEM files to serve HTTPS with; plain HTTP without."""
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail: list[int] = []
        self.lose_answers = 0
        """The next this many requests are carried out and their connections closed without an answer."""
        self.taints_off = False
        """Store slices without their devices' taints, as an API server with DRADeviceTaints off does."""
        self.protobuf = True
        """Take bodies in the API server's protobuf encoding (else 415, as a server that has no protobuf for the
        kind); answers are JSON whatever is asked, as a server may answer."""
        self._names = itertools.count()
        self._version = 1
        self._events: list[tuple[int, str, dict[str, Any]]] = []  # (version, type, object) of slice changes
        self._watch_generation = 0  # bumped by end_watches
        self.watch_lists = True
        # Guards everything above against the server's threads; watches wait on it for changes.
        self._lock = threading.Condition()
        self._ca: bytes | None = None
        context = None
        if tls is not None:
            key, cert = tls
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self._ca = cert.read_bytes()
        self._server = Http2Server(("127.0.0.1", 0), _Handler, functools.partial(_serve_http2, self), tls=context)
        self._server.api = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        scheme = "http" if self._ca is None else "https"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    @property
    def connections(self) -> int:
        return self._server.connections

    @property
    def unresponsive(self) -> bool:
        return self._server.unresponsive

    @unresponsive.setter
    def unresponsive(self, value: bool) -> None:
        self._server.unresponsive = value

    def goaway(self) -> None:
        self._server.goaway()

    def start(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self.close()

    def __enter__(self) -> FakeKubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def close(self) -> None:
        self.end_watches()
        self._server.server_close()

    def add_claim(self, body: dict[str, Any]) -> None:
        """A ResourceClaim as the scheduler leaves it (allocated), for worker-dra to read."""
        with self._lock:
            self.claims[(body["metadata"]["namespace"], body["metadata"]["name"])] = body

    def claim_status(self, namespace: str, name: str) -> dict[str, Any]:
        """A claim's status as stored now."""
        with self._lock:
            return json.loads(json.dumps((self.claims.get((namespace, name)) or {}).get("status") or {}))

    def current_slices(self) -> list[dict[str, Any]]:
        """The ResourceSlices as stored now, by name (safe while the server's threads change them)."""
        with self._lock:
            return [json.loads(json.dumps(self.slices[name])) for name in sorted(self.slices)]

    def end_watches(self) -> None:
        """End every open watch, as an API server's restart does."""
        with self._lock:
            self._watch_generation += 1
            self._lock.notify_all()

    def put_slice(self, item: dict[str, Any]) -> dict[str, Any]:
        """Store a slice as a write by someone else would (a new version, an event)."""
        with self._lock:
            return self._store_slice(item, "MODIFIED" if item["metadata"]["name"] in self.slices else "ADDED")

    def remove_slice(self, name: str) -> None:
        with self._lock:
            self._drop_slice(name)

    def _store_slice(self, item: dict[str, Any], kind: str) -> dict[str, Any]:
        self._version += 1
        if self.taints_off:
            devices = [{k: v for k, v in d.items() if k != "taints"} for d in item["spec"].get("devices") or []]
            item = {**item, "spec": {**item["spec"], "devices": devices}}
        item = {**item, "metadata": {**item["metadata"], "resourceVersion": str(self._version)}}
        self.slices[item["metadata"]["name"]] = item
        self._events.append((self._version, kind, item))
        self._lock.notify_all()
        return item

    def _drop_slice(self, name: str) -> None:
        self._version += 1
        item = self.slices.pop(name)
        self._events.append((self._version, "DELETED", item))
        self._lock.notify_all()

    def kubeconfig(self, path: pathlib.Path) -> pathlib.Path:
        cluster: dict[str, str] = {"server": self.url}
        if self._ca is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self._ca).decode()
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
        return path

    def _answer(self, method: str, path: str, body: bytes, content_type: str = "") -> tuple[int, bytes] | _Watch | None:
        """What to answer a request, whichever protocol brought it: a status and its JSON, a watch to stream, or
        None for an answer to lose (the request carried out, its connection to be closed unanswered)."""
        in_protobuf = content_type.startswith(protobuf.MEDIA_TYPE)
        with self._lock:
            self.requests.append((method, path))
            if in_protobuf and not self.protobuf:
                return 415, _json(_status(415, f"the content type {content_type} is not taken"))
            document = (protobuf.decode(body) if in_protobuf else json.loads(body)) if body else None
            if self.fail:
                status = self.fail.pop(0)
                return status, _json(_status(status, "injected"))
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))
            if query.get("watch") == "true":
                if query.get("sendInitialEvents") == "true" and not self.watch_lists:
                    return 422, _json(_status(422, "sendInitialEvents is forbidden for watch"))
                return _Watch(self, query)
            status, answer = self._route(method, path, document)
            if self.lose_answers:
                self.lose_answers -= 1
                return None
            return status, _json(answer)  # made under the lock: a claim's status is changed in place

    def _apply_claim_status(self, namespace: str, name: str, body: Any) -> tuple[int, Any]:
        """Server-side apply of status.devices as the API server merges it: entries by driver, pool and device."""
        claim = self.claims.get((namespace, name))
        if claim is None:
            return 404, _status(404, "claim not found")
        if body["metadata"].get("uid") not in (None, claim["metadata"].get("uid")):
            return 409, _status(409, "the UID in the precondition does not match")
        status = claim.setdefault("status", {})
        merged = {_device_key(d): d for d in status.get("devices") or []}
        merged.update({_device_key(d): d for d in body.get("status", {}).get("devices") or []})
        status["devices"] = list(merged.values())
        return 200, claim

    def _route(self, method: str, raw_path: str, body: Any) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(raw_path)
        parts = url.path.strip("/").split("/")
        if url.path.startswith("/api/v1/nodes/") and method == "GET":
            node = self.nodes.get(parts[-1])
            return (200, node) if node else (404, _status(404, "node not found"))
        if url.path.startswith(RESOURCE + "/namespaces/") and parts[-3] == "resourceclaims" \
                and parts[-1] == "status" and method == "PATCH":
            return self._apply_claim_status(parts[-4], parts[-2], body)
        if url.path.startswith(RESOURCE + "/namespaces/") and parts[-2] == "resourceclaims" and method == "GET":
            claim = self.claims.get((parts[-3], parts[-1]))
            return (200, claim) if claim else (404, _status(404, "claim not found"))
        if url.path == RESOURCE + "/resourceslices":
            if method == "GET":
                wanted = _selector(dict(urllib.parse.parse_qsl(url.query)))
                items = [s for s in self.slices.values() if _selected(s, wanted)]
                return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                             "metadata": {"resourceVersion": str(self._version)}, "items": items}
            if method == "POST":
                name = body["metadata"].get("name") or body["metadata"]["generateName"] + str(next(self._names))
                if name in self.slices:
                    return 409, _status(409, f"resourceslices {name!r} already exists", reason="AlreadyExists")
                body["metadata"] = {**body["metadata"], "name": name, "uid": f"uid-{name}"}
                return 201, self._store_slice(body, "ADDED")
        if url.path.startswith(RESOURCE + "/resourceslices/"):
            name = parts[-1]
            if name not in self.slices:
                return 404, _status(404, "slice not found")
            stored = self.slices[name]["metadata"]
            if method == "GET":
                return 200, self.slices[name]
            if method == "PUT":
                if body["metadata"].get("resourceVersion") not in (None, stored["resourceVersion"]):
                    return 409, _status(409, "the object has been modified")
                return 200, self._store_slice({**body, "metadata": {**body["metadata"], "uid": stored["uid"]}},
                                              "MODIFIED")
            if method == "DELETE":
                preconditions = (body or {}).get("preconditions") or {}
                if any(stored.get(key) != value for key, value in preconditions.items()):
                    return 409, _status(409, "Precondition failed")
                self._drop_slice(name)
                return 200, _status(200, "deleted")
        return 404, _status(404, f"no route {method} {url.path}")


def _json(body: Any) -> bytes:
    return json.dumps(body).encode()


def _line(event: dict[str, Any]) -> bytes:
    return _json(event) + b"\n"


def _device_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return entry.get("driver"), entry.get("pool"), entry.get("device")


def _selector(query: dict[str, str]) -> dict[str, str]:
    return dict(term.split("=", 1) for term in query.get("fieldSelector", "").split(",") if term)


def _selected(item: dict[str, Any], wanted: dict[str, str]) -> bool:
    return all(_field(item, key) == value for key, value in wanted.items())


def _field(obj: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return obj


def _status(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure" if code >= 400 else "Success",
            "code": code, "reason": reason or {404: "NotFound", 409: "Conflict", 422: "Invalid",
                                               503: "ServiceUnavailable", 403: "Forbidden"}.get(code, ""),
            "message": message}
