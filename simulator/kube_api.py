"""A loopback HTTP stand-in for the few API server endpoints worker-dra calls: the API server of
`rbln-device-plugin simulate --resource-api dra`, and of the tests of worker-dra's client and the benchmarks
(the real kube-apiserver runs in tests/dra). It keeps ResourceSlices, ResourceClaims and Nodes as JSON, records
every request, and can be told to fail the next requests with a status, or to carry them out and lose their
answers. ResourceSlices have resource versions (one counter for all, as etcd's), updates and deletes honour them
as preconditions (409), a create of a name there is already is refused (409 AlreadyExists), and a watch streams
the slices' changes after a version until its timeoutSeconds pass or `end_watches` ends them; a watch-list
(sendInitialEvents) first sends the slices there are and the bookmark that ends them, or 422 while
`watch_lists` is off, as from an API server without the WatchList feature. Given a key and a
certificate, it serves HTTPS with them, and its kubeconfig names the certificate as the cluster's CA, as a real
API server is reached: what the client loads and runs for TLS is then part of what is measured."""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import pathlib
import ssl
import threading
import time
import urllib.parse
from typing import Any

RESOURCE = "/apis/resource.k8s.io/v1"


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request to the stand-in: its `server.api` answers it."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        api: FakeKubeApi = self.server.api  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        with api._lock:
            api.requests.append((self.command, self.path))
            if api.fail:
                status = api.fail.pop(0)
                return self._answer(status, _status(status, "injected"))
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            if query.get("watch") == "true":
                return self._stream(query)
            status, answer = api._route(self.command, self.path, body)
            if api.lose_answers:
                api.lose_answers -= 1
                self.close_connection = True
                return None
        self._answer(status, answer)

    def _stream(self, query: dict[str, str]) -> None:
        """Called with the lock held: the events after the version asked for, as they come."""
        api: FakeKubeApi = self.server.api  # type: ignore[attr-defined]
        since, ends = int(query.get("resourceVersion") or 0), int(query.get("timeoutSeconds") or 3600)
        generation, deadline = api._watch_generation, time.monotonic() + ends
        wanted = _selector(query)
        initial = query.get("sendInitialEvents") == "true"
        if initial and not api.watch_lists:
            return self._answer(422, _status(422, "sendInitialEvents is forbidden for watch"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if initial:
            since = api._version
            lines = [{"type": "ADDED", "object": item} for item in api.slices.values()
                     if _selected(item, wanted)]
            lines.append({"type": "BOOKMARK", "object": {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {
                    "resourceVersion": str(since), "annotations": {"k8s.io/initial-events-end": "true"}}}})
            self.wfile.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        while api._watch_generation == generation and time.monotonic() < deadline:
            for version, kind, item in [e for e in api._events if e[0] > since]:
                since = version
                if _selected(item, wanted):
                    try:
                        self.wfile.write(json.dumps({"type": kind, "object": item}).encode() + b"\n")
                        self.wfile.flush()
                    except OSError:  # the client went away
                        return
            api._lock.wait(min(0.2, max(0.0, deadline - time.monotonic())))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class FakeKubeApi:
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
        self._names = itertools.count()
        self._version = 1
        self._events: list[tuple[int, str, dict[str, Any]]] = []  # (version, type, object) of slice changes
        self._watch_generation = 0  # bumped by end_watches
        self.watch_lists = True
        # Guards everything above against the server's threads; watches wait on it for changes.
        self._lock = threading.Condition()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.api = self  # type: ignore[attr-defined]
        self._ca: bytes | None = None
        if tls is not None:
            key, cert = tls
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self._ca = cert.read_bytes()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        scheme = "http" if self._ca is None else "https"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

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
