"""A loopback HTTP stand-in for the few API server endpoints worker-dra calls: the API server of
`rbln-device-plugin simulate --resource-api dra`, and of the tests of worker-dra's client and the benchmarks
(the real kube-apiserver runs in tests/dra). It keeps ResourceSlices, ResourceClaims and Nodes as JSON, records
every request, and can be told to fail the next requests with a status. Given a key and a certificate, it serves
HTTPS with them, and its kubeconfig names the certificate as the cluster's CA, as a real API server is reached:
what the client loads and runs for TLS is then part of what is measured."""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import pathlib
import ssl
import threading
import urllib.parse
from typing import Any

RESOURCE = "/apis/resource.k8s.io/v1"


class FakeKubeApi:
    def __init__(self, tls: tuple[pathlib.Path, pathlib.Path] | None = None) -> None:
        """`tls`: (key, certificate) PEM files to serve HTTPS with; plain HTTP without."""
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail: list[int] = []
        self._names = itertools.count()
        self._lock = threading.Lock()  # guards everything above against the server's threads
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
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
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with api._lock:
                    api.requests.append((self.command, self.path))
                    if api.fail:
                        status = api.fail.pop(0)
                        return self._answer(status, _status(status, "injected"))
                    status, answer = api._route(self.command, self.path, body)
                self._answer(status, answer)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
                selector = dict(urllib.parse.parse_qsl(url.query)).get("fieldSelector", "")
                wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
                items = [s for s in self.slices.values()
                         if all(_field(s, key) == value for key, value in wanted.items())]
                return 200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
                             "items": items}
            if method == "POST":
                name = body["metadata"].get("name") or body["metadata"]["generateName"] + str(next(self._names))
                body["metadata"] = {**body["metadata"], "name": name, "uid": f"uid-{name}", "resourceVersion": "1"}
                self.slices[name] = body
                return 201, body
        if url.path.startswith(RESOURCE + "/resourceslices/"):
            name = parts[-1]
            if name not in self.slices:
                return 404, _status(404, "slice not found")
            if method == "PUT":
                self.slices[name] = body
                return 200, body
            if method == "DELETE":
                del self.slices[name]
                return 200, _status(200, "deleted")
        return 404, _status(404, f"no route {method} {url.path}")


def _device_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return entry.get("driver"), entry.get("pool"), entry.get("device")


def _field(obj: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return obj


def _status(code: int, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure" if code >= 400 else "Success",
            "code": code, "reason": {404: "NotFound", 503: "ServiceUnavailable", 403: "Forbidden"}.get(code, ""),
            "message": message}
