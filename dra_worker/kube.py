"""The API server, as worker-dra uses it: a few calls on plain dicts, over one HTTP/2 connection.

ResourceSlices, ResourceClaims and the Node are handled as their JSON objects: no typed models. Claims and the
Node travel as JSON, so a field a newer API server adds to a claim passes through whole; slices travel in the API
server's protobuf encoding (shared/kubeapi/protobuf.py converts), as client-go sends built-in kinds, which costs
the API server less per write and per watch event. Credentials are the pod's service account, or the kubeconfig
file KUBECONFIG names (dra_worker/api_credentials.py). A call that fails for a reason
that may pass (the server unreachable, overloaded, a 5xx, 429, an answer lost with its connection) is retried with
backoff up to a deadline; what the server refuses for good (403, 404, 409, 422) is raised at once as ApiFailure.

One connection to the API server per worker, as client-go keeps (dra_worker/http2_client.py): the watch and every
call are streams of it, so a write after a quiet while costs the API server no new TLS handshake
(docs/dra.md#publishing-and-its-api-cost). The client is this project's own: the general-purpose stack it
replaced (lightkube, httpx, httpcore) cost a publisher 3.6 ms of CPU per change and two fences in their
internals; this costs about a quarter less (bench/README.md).

ResourceSlices are watched as client-go's informers watch since Kubernetes 1.32: a watch-list (the slices as they
are, then the bookmark that ends them, then their changes: no list request), with bookmarks; a plain list and
watch for an API server without watch-lists. A watch the server ends at its timeout is resumed from the last
version seen (the bookmarks keep it recent); whatever else ends it is raised. Answers are asked uncompressed
(no accept-encoding): kube-apiserver 1.37 held a gzip-compressed watch-list's later events back for seconds
(measured in tests/dra). Deletes name the UID and resourceVersion the worker saw as preconditions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from shared.config import DRA_DRIVER
from shared.version import VERSION

if TYPE_CHECKING:
    from dra_worker.http2_client import Http2Connection, Response

T = TypeVar("T")
Json = dict[str, Any]
FIELD_MANAGER = DRA_DRIVER
_RETRIABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 5.0
SYNCED = "SYNCED"
"""The event after a watch-list's initial ADDED events: from here on the view is the server's."""
_RESOURCE = "/apis/resource.k8s.io/v1"
_SLICES = f"{_RESOURCE}/resourceslices"
_USER_AGENT = f"rbln-dra-worker/{VERSION}".encode()
# The annotation of the bookmark that ends a watch-list's initial events.
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_INITIAL_ONLY = ("sendInitialEvents", "resourceVersionMatch")
# An object's metadata alone, or the whole object from a server that cannot strip it.
_METADATA_ONLY = b"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
# ResourceSlices travel in the API server's protobuf encoding (shared/kubeapi/protobuf.py), as client-go's typed
# clients send built-in kinds: JSON cost kube-apiserver about a millisecond more per write of a slice
# (bench/README.md). Answers in JSON are taken too, and a server that refuses protobuf (415) is written JSON.
_PROTOBUF = b"application/vnd.kubernetes.protobuf"
_SLICE_ANSWERS = _PROTOBUF + b",application/json"


class ApiFailure(RuntimeError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status
        """The HTTP status the server answered, None when it was not reached."""


@dataclasses.dataclass
class Backoff:
    """Doubling pauses from `first` to `most`; `reset` after a success."""

    first: float = _BACKOFF_FIRST
    most: float = _BACKOFF_MAX
    _next: float = 0.0

    def pause(self) -> float:
        self._next = self.first if self._next == 0.0 else min(self._next * 2, self.most)
        return self._next

    def reset(self) -> None:
        self._next = 0.0


@dataclasses.dataclass(frozen=True)
class SliceList:
    items: list[Json]
    resource_version: str
    """The list's version: a watch from it misses nothing."""


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _protobuf(headers: Mapping[bytes, bytes]) -> bool:
    """Whether an answer is in the protobuf encoding (its content type says so; else it is JSON)."""
    return headers.get(b"content-type", b"").startswith(_PROTOBUF)


def _object(response: Response) -> Json:
    """The answer's object, in whichever encoding it came; ValueError for one that is broken."""
    if _protobuf(response.headers):
        from shared.kubeapi import protobuf

        return protobuf.decode(response.body)
    answer = json.loads(response.body)
    if not isinstance(answer, dict):
        raise ValueError(f"a JSON {type(answer).__name__}, not an object")
    return answer


def _failure(what: str, response: Response) -> ApiFailure:
    """What the server refused, from its Status object where it sent one."""
    try:
        status: Json | None = _object(response)
    except ValueError:
        status = None
    if status is None or status.get("kind") != "Status":
        return ApiFailure(f"{what}: {response.status} {response.body[:200]!r}", response.status)
    return ApiFailure(f"{what}: {response.status} {status.get('reason') or ''}: {status.get('message') or ''}",
                      response.status)


def _decoded(what: str, response: Response) -> Json:
    if response.status >= 300:
        raise _failure(what, response)
    try:
        return _object(response)
    except ValueError as exc:
        raise ApiFailure(f"{what}: the answer is broken ({exc})") from None


class KubeApi:
    def __init__(self, kubeconfig: pathlib.Path | None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, request_timeout: float = 10.0,
                 environ: Mapping[str, str] = os.environ, service_account: pathlib.Path | None = None):
        """`clock` and `sleep` pace the retries; a request's own `request_timeout` is in real time. The HTTP/2
        client is imported here, not with this module (its ApiFailure is the worker's): h2 costs 26 ms and
        3.7 MiB, paid when the first API call is made."""
        from dra_worker.api_credentials import SERVICE_ACCOUNT, from_kubeconfig, from_service_account

        self._endpoint = (from_kubeconfig(kubeconfig.expanduser()) if kubeconfig is not None
                          else from_service_account(environ, service_account or SERVICE_ACCOUNT))
        self._sleep = sleep
        self._clock = clock
        self._request_timeout = request_timeout
        self._connecting = threading.Lock()  # guards _connection: the watcher and the publisher both call
        self._connection: Http2Connection | None = None
        self._slices_in_json = False
        """True once the server refused a slice in protobuf (only the publisher thread writes slices)."""

    def _live_connection(self) -> Http2Connection:
        """The connection, a new one if it failed or the server sent it away (one sent away keeps serving the
        streams it has, and closes when they end)."""
        from dra_worker.http2_client import connect

        with self._connecting:
            if self._connection is None or not self._connection.usable:
                self._connection = connect(self._endpoint, self._request_timeout)
            return self._connection

    def _open(self, method: str, path: str, body: Json | None = None, content_type: bytes = b"application/json",
              accept: bytes = b"application/json") -> tuple[Http2Connection, Any]:
        from dra_worker.http2_client import NotSent

        # No accept-encoding: the answers come uncompressed (module docstring)
        headers = [(b"accept", accept), (b"user-agent", _USER_AGENT)]
        if self._endpoint.token is not None:
            headers.append((b"authorization", b"Bearer " + self._endpoint.token().encode()))
        data = b""
        if body is not None:
            if content_type == _PROTOBUF:
                from shared.kubeapi import protobuf

                data = protobuf.encode(body)
            else:
                data = json.dumps(body, separators=(",", ":")).encode()
            headers.append((b"content-type", content_type))
        connection = self._live_connection()
        try:
            return connection, connection.open(method, path, headers, data)
        except NotSent:  # the connection was sent away since it was taken: once more, on a new one
            connection = self._live_connection()
            return connection, connection.open(method, path, headers, data)

    def _request(self, what: str, method: str, path: str, left: float, body: Json | None = None,
                 content_type: bytes = b"application/json", accept: bytes = b"application/json") -> Json:
        """One request, its answer awaited for `left` seconds at most (the call's time left), and never more than
        the client's request timeout."""
        from dra_worker.http2_client import ConnectionLost

        wait = max(0.0, min(self._request_timeout, left))
        try:
            connection, stream = self._open(method, path, body, content_type, accept)
            response = connection.response(stream, time.monotonic() + wait)
        except TimeoutError:
            raise ApiFailure(f"{what}: no answer in {wait:.3g} s") from None
        except ConnectionLost as exc:
            raise ApiFailure(f"{what}: {exc}") from None
        return _decoded(what, response)

    def _call(self, what: str, work: Callable[[float], T], deadline: float) -> T:
        """`work(time left)`, retried with backoff while it fails for a passing reason and time remains."""
        backoff = Backoff()
        while True:
            try:
                return work(deadline - self._clock())
            except ApiFailure as failure:
                if failure.status is not None and failure.status not in _RETRIABLE_STATUS:
                    raise
                pause = backoff.pause()
                if self._clock() + pause > deadline:
                    raise
                self._sleep(pause)

    def get_claim(self, namespace: str, name: str, timeout: float) -> Json:
        what = f"get ResourceClaim {namespace}/{name}"
        path = f"{_RESOURCE}/namespaces/{_quoted(namespace)}/resourceclaims/{_quoted(name)}"
        return self._call(what, lambda left: self._request(what, "GET", path, left), self._clock() + timeout)

    def apply_claim_status(self, namespace: str, name: str, uid: str, devices: list[Json], timeout: float) -> None:
        """Server-side apply of the claim's status.devices (this driver's entries; the UID must still match)."""
        what = f"apply the status of ResourceClaim {namespace}/{name}"
        path = (f"{_RESOURCE}/namespaces/{_quoted(namespace)}/resourceclaims/{_quoted(name)}/status?"
                + urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"}))
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": {"devices": devices}}
        self._call(what, lambda left: self._request(what, "PATCH", path, left, body, b"application/apply-patch+yaml"),
                   self._clock() + timeout)

    def node_uid(self, node_name: str, timeout: float) -> str:
        """The Node's UID, from its metadata alone (a Node's status lists its images and runs to tens of KiB) as
        the API server's cache holds it (resourceVersion 0: no read of etcd; a UID a moment old is corrected by the
        next repair, which asks again)."""
        what = f"get Node {node_name}"
        path = f"/api/v1/nodes/{_quoted(node_name)}?resourceVersion=0"
        node = self._call(what, lambda left: self._request(what, "GET", path, left, accept=_METADATA_ONLY),
                          self._clock() + timeout)
        return str((node.get("metadata") or {}).get("uid") or "")

    def _selector(self, node_name: str) -> str:
        return f"spec.driver={DRA_DRIVER},spec.nodeName={node_name}"

    def list_slices(self, node_name: str, timeout: float) -> SliceList:
        """This driver's slices of the node, and the list's version to watch from."""
        what = "list ResourceSlices"
        path = f"{_SLICES}?" + urllib.parse.urlencode({"fieldSelector": self._selector(node_name)})

        def work(left: float) -> SliceList:
            listing = self._request(what, "GET", path, left, accept=_SLICE_ANSWERS)
            items = listing.get("items")
            version = (listing.get("metadata") or {}).get("resourceVersion")
            if not isinstance(items, list) or not isinstance(version, str):
                raise ApiFailure(f"{what}: the answer is no list of slices with a resourceVersion")
            return SliceList(items, version)

        return self._call(what, work, self._clock() + timeout)

    def watch_list_slices(self, node_name: str, server_timeout: int) -> Iterator[tuple[str, Json]]:
        """This driver's slices of the node as ADDED events, then SYNCED (with the bookmark that ends them: its
        resourceVersion is the one the initial events show), then their changes (ADDED, MODIFIED, DELETED), for as
        long as the watch lasts (see `watch_slices`); ApiFailure for what ends it, 422 from a server that does not
        serve watch-lists."""
        yield from self._watch("watch-list ResourceSlices", {
            "fieldSelector": self._selector(node_name), "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan"}, server_timeout)

    def watch_slices(self, node_name: str, resource_version: str, server_timeout: int) -> Iterator[tuple[str, Json]]:
        """The events (ADDED, MODIFIED, DELETED; the object) on this driver's slices of the node after
        `resource_version`, for as long as the watch lasts: one the server ends after `server_timeout` seconds is
        resumed from the last version seen; ApiFailure for whatever ends it otherwise (410 Gone, the server gone,
        a broken connection, a connection whose PING went unanswered)."""
        yield from self._watch("watch ResourceSlices", {
            "fieldSelector": self._selector(node_name), "resourceVersion": resource_version}, server_timeout)

    def _watch(self, what: str, params: dict[str, str], server_timeout: int) -> Iterator[tuple[str, Json]]:
        """The watch's events, one watch request after the other: as client-go's reflector does, a request that
        the server ends (its timeout) or whose connection breaks (a GOAWAY, a reset) is followed by another from
        the last version seen, if it made progress: it showed an event or a bookmark, or (an orderly end) lasted
        a second. Else, or while a watch-list's initial events are still coming, what ended it is raised."""
        from dra_worker.http2_client import ConnectionLost

        params = {**params, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(server_timeout)}
        while True:
            began, progressed = time.monotonic(), False
            try:
                for kind, item in self._watch_once(what, f"{_SLICES}?{urllib.parse.urlencode(params)}"):
                    progressed = True
                    version = (item.get("metadata") or {}).get("resourceVersion")
                    if isinstance(version, str) and version:
                        params["resourceVersion"] = version
                    if kind != "BOOKMARK":
                        yield kind, item
                    elif ((item.get("metadata") or {}).get("annotations") or {}).get(_INITIAL_EVENTS_END) == "true":
                        for initial_only in _INITIAL_ONLY:
                            params.pop(initial_only, None)
                        yield SYNCED, item
            except ConnectionLost as lost:
                if not progressed or "sendInitialEvents" in params:
                    raise ApiFailure(f"{what}: {lost}") from None
                continue
            if "sendInitialEvents" in params:  # resumed, it would send the initial events again
                raise ApiFailure(f"{what}: the server ended the watch-list before its initial events did")
            if not progressed and time.monotonic() - began < 1.0:
                raise ApiFailure(f"{what}: the server ended the watch at once, without an event")

    def _watch_once(self, what: str, path: str) -> Iterator[tuple[str, Json]]:
        """One watch request's events, until the server ends it; ConnectionLost if its connection breaks."""
        from dra_worker.http2_client import ConnectionLost

        try:
            connection, stream = self._open("GET", path, accept=_SLICE_ANSWERS)
        except ConnectionLost as exc:
            raise ApiFailure(f"{what}: {exc}") from None
        try:
            status, headers = connection.head(stream, time.monotonic() + self._request_timeout)
            if status != 200:
                raise _failure(what, connection.response(stream, time.monotonic() + self._request_timeout))
            events = _protobuf_events if _protobuf(headers) else _json_events
            for kind, item in events(what, connection.chunks(stream)):
                if kind == "ERROR":
                    code = item.get("code")
                    raise ApiFailure(f"{what}: {code} {item.get('reason') or ''}: {item.get('message') or ''}",
                                     code if isinstance(code, int) else None)
                yield kind, item
        except TimeoutError:
            raise ApiFailure(f"{what}: no answer in {self._request_timeout:g} s") from None
        finally:
            connection.cancel(stream)

    def create_slice(self, body: Json, timeout: float) -> Json:
        """Create a slice of the name in `body`. A retry of a create whose answer was lost finds the slice the
        first try made (409 AlreadyExists) and returns it; the same name at the first try is another's: 409."""
        name = body["metadata"]["name"]
        what = f"create ResourceSlice {name}"
        path = f"{_SLICES}?" + urllib.parse.urlencode({"fieldManager": FIELD_MANAGER})
        tries = 0

        def work(left: float) -> Json:
            nonlocal tries
            tries += 1
            try:
                return self._write_slice(what, "POST", path, left, body)
            except ApiFailure as failure:
                if tries == 1 or failure.status != 409:
                    raise
            return self._request(what, "GET", f"{_SLICES}/{_quoted(name)}", left, accept=_SLICE_ANSWERS)

        return self._call(what, work, self._clock() + timeout)

    def replace_slice(self, body: Json, timeout: float) -> Json:
        """Update a slice; its metadata.resourceVersion is the precondition (409 Conflict if it changed)."""
        name = body["metadata"]["name"]
        what = f"update ResourceSlice {name}"
        path = f"{_SLICES}/{_quoted(name)}?" + urllib.parse.urlencode({"fieldManager": FIELD_MANAGER})
        return self._call(what, lambda left: self._write_slice(what, "PUT", path, left, body),
                          self._clock() + timeout)

    def _write_slice(self, what: str, method: str, path: str, left: float, body: Json) -> Json:
        """A slice sent in the protobuf encoding, or in JSON to a server that refused it once (415)."""
        if self._slices_in_json:
            return self._request(what, method, path, left, body, accept=_SLICE_ANSWERS)
        try:
            return self._request(what, method, path, left, body, _PROTOBUF, _SLICE_ANSWERS)
        except ApiFailure as failure:
            if failure.status != 415:
                raise
        self._slices_in_json = True
        return self._request(what, method, path, left, body, accept=_SLICE_ANSWERS)

    def delete_slice(self, existing: Json, timeout: float) -> None:
        """Delete a slice as it was seen (its UID and resourceVersion); one gone already is what was wanted."""
        metadata = existing["metadata"]
        what = f"delete ResourceSlice {metadata['name']}"
        options = {"apiVersion": "v1", "kind": "DeleteOptions",
                   "preconditions": {"uid": metadata["uid"], "resourceVersion": metadata["resourceVersion"]}}
        path = f"{_SLICES}/{_quoted(metadata['name'])}"
        try:
            self._call(what, lambda left: self._request(what, "DELETE", path, left, options, accept=_SLICE_ANSWERS),
                       self._clock() + timeout)
        except ApiFailure as failure:
            if failure.status != 404:
                raise


def _json_events(what: str, chunks: Iterator[bytes]) -> Iterator[tuple[str, Json]]:
    """A JSON watch's events: one JSON object a line; ApiFailure for a broken one."""
    pending = b""
    for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
                kind, item = event["type"], event["object"]
            except (ValueError, TypeError, KeyError) as exc:
                raise ApiFailure(f"{what}: a broken event ({type(exc).__name__}: {line[:200]!r})") from None
            if not isinstance(kind, str) or not isinstance(item, dict):
                raise ApiFailure(f"{what}: a broken event ({line[:200]!r})")
            yield kind, item


def _protobuf_events(what: str, chunks: Iterator[bytes]) -> Iterator[tuple[str, Json]]:
    """A protobuf watch's events (shared/kubeapi/protobuf.py); ApiFailure for a broken one."""
    from shared.kubeapi import protobuf

    stream = protobuf.WatchStream()
    try:
        for chunk in chunks:
            yield from stream.feed(chunk)
    except protobuf.DecodeError as exc:
        raise ApiFailure(f"{what}: a broken event ({exc})") from None
