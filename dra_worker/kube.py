"""The API server, as worker-dra uses it: a few calls on plain dicts, through lightkube.

lightkube is imported by this module alone (worker-dra's only): no other process pays for it. ResourceSlices and
ResourceClaims go through lightkube's generic resources, which are the JSON objects themselves: the typed models
of lightkube-models' resource_v1 would cost the worker 0.3 MiB of classes, a conversion each way per call, and
any field they do not know (a newer API server's) on the way through. Credentials are
the pod's service account, or the kubeconfig file KUBECONFIG names. A call that fails for a reason that may
pass (the server unreachable, overloaded, a 5xx, 429) is retried with backoff up to a deadline; what the
server refuses for good (403, 404, 409, 422) is raised at once as ApiFailure.

One connection to the API server per worker, as client-go keeps: HTTP/2 (offered in TLS's ALPN; a server that
does not take it is spoken HTTP/1.1 to, a connection for the watch and one for the calls) multiplexes the watch and
every call, so a write after a quiet while costs the API server no new TLS handshake
(docs/dra.md#publishing-and-its-api-cost). The watcher and the publisher are two threads on that one
connection: its reads are taken in turn (shared/fence/httpcore_fair_reads.py), else a reply the watcher read for
the publisher stays unseen while the watch is quiet.

ResourceSlices are watched with lightkube's own watch (its sync client, the one worker-dra uses already: no
second HTTP stack, no asyncio loop for one stream): it resumes a watch the server ends at its timeout from the
last version it saw, and raises what ends it otherwise. Its requests are built from lightkube's generic client as
its own calls build theirs, behind the fence (shared/fence/lightkube_requests.py, checked against the lightkube
release pinned in pyproject.toml): the watch-list (the slices as they are and then their changes, in one watch
request with bookmarks, as client-go's informers ask since Kubernetes 1.32: no list request), a plain watch with
bookmarks (an API server without watch-lists), and deletes with preconditions (UID and resourceVersion). The
bookmarks (about one a minute) let a watch that reads nothing for WATCH_READ_IDLE seconds be taken for dead: a
connection lost without a word (a peer gone, a NAT entry dropped) is replaced, not waited on for ever; client-go
pings an idle HTTP/2 connection instead, which lightkube's transport cannot.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from shared.config import DRA_DRIVER
from shared.fence.httpcore_fair_reads import fair_reads
from shared.fence.lightkube_requests import delete_with_preconditions, read_idle, uncompressed, watch, watch_list

T = TypeVar("T")
Json = dict[str, Any]
FIELD_MANAGER = DRA_DRIVER
_RETRIABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 5.0
# A watch that reads nothing for this long is taken for dead (its connection lost without a word): the API server
# sends a bookmark on it about once a minute (and its events, and over HTTP/2 the calls' answers, come between).
WATCH_READ_IDLE = 90.0


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


def _failure(exc: Exception, what: str) -> ApiFailure:
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        return ApiFailure(f"{what}: {exc.status.code} {exc.status.reason}: {exc.status.message}",
                          exc.status.code)
    response: Any = getattr(exc, "response", None)  # httpx's status error: a watch's refusal, its body unread
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return ApiFailure(f"{what}: {status} {getattr(response, 'reason_phrase', '')}", status)
    return ApiFailure(f"{what}: {type(exc).__name__}: {exc}")


def _kubeconfig(path: pathlib.Path) -> Any:
    """The kubeconfig file, as lightkube's `KubeConfig.from_file` reads it but with libyaml's parser where PyYAML
    has it: the pure-Python one took 1.6 ms of a worker's start, of about 12 ms of CPU until its slices are
    published (0.13 ms with libyaml)."""
    import yaml
    from lightkube import ConfigError, KubeConfig

    path = path.expanduser()
    if not path.is_file():
        raise ConfigError(f"Configuration file {path} not found")
    return KubeConfig.from_dict(yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)),
                                fname=path)


class KubeApi:
    def __init__(self, kubeconfig: pathlib.Path | None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, request_timeout: float = 10.0):
        import httpx2
        from lightkube import Client, KubeConfig
        from lightkube.config.kubeconfig import SingleConfig
        from lightkube.generic_resource import create_global_resource, create_namespaced_resource

        config: KubeConfig | SingleConfig = (_kubeconfig(kubeconfig) if kubeconfig is not None
                                             else KubeConfig.from_service_account())
        fair_reads()
        self._client = Client(config, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(request_timeout),
                              trust_env=False, http2=True)
        uncompressed(self._client)
        read_idle(self._client, WATCH_READ_IDLE)
        self._sleep = sleep
        self._clock = clock
        self._slices = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")
        self._claims = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")

    def _call(self, what: str, work: Callable[[], T], deadline: float) -> T:
        """`work()`, retried with backoff while it fails for a passing reason and time remains."""
        backoff = Backoff()
        while True:
            try:
                return work()
            except Exception as exc:  # lightkube raises ApiError, httpx's errors, and more for a broken answer
                failure = _failure(exc, what)
                if failure.status is not None and failure.status not in _RETRIABLE_STATUS:
                    raise failure from None
                pause = backoff.pause()
                if self._clock() + pause > deadline:
                    raise failure from None
                self._sleep(pause)

    def get_claim(self, namespace: str, name: str, timeout: float) -> Json:
        deadline = self._clock() + timeout
        return self._call(f"get ResourceClaim {namespace}/{name}",
                          lambda: dict(self._client.get(self._claims, name, namespace=namespace)), deadline)

    def apply_claim_status(self, namespace: str, name: str, uid: str, devices: list[Json], timeout: float) -> None:
        """Server-side apply of the claim's status.devices (this driver's entries; the UID must still match)."""
        from lightkube.types import PatchType

        deadline = self._clock() + timeout
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": {"devices": devices}}
        self._call(f"apply the status of ResourceClaim {namespace}/{name}",
                   lambda: self._client.patch(self._claims.Status, name, body, namespace=namespace,
                                              patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True),
                   deadline)

    def node_uid(self, node_name: str, timeout: float) -> str:
        from lightkube.resources.core_v1 import Node

        deadline = self._clock() + timeout
        node = self._call(f"get Node {node_name}", lambda: self._client.get(Node, node_name), deadline)
        return str(node.metadata.uid) if node.metadata is not None else ""

    def _slice_fields(self, node_name: str) -> dict[str, Any]:
        return {"spec.driver": DRA_DRIVER, "spec.nodeName": node_name}

    def _selector(self, node_name: str) -> str:
        return ",".join(f"{key}={value}" for key, value in sorted(self._slice_fields(node_name).items()))

    def list_slices(self, node_name: str, timeout: float) -> SliceList:
        """This driver's slices of the node, and the list's version to watch from."""
        def work() -> SliceList:
            listing = self._client.list(self._slices, fields=self._slice_fields(node_name))
            items = [dict(s) for s in listing]
            return SliceList(items, listing.resourceVersion)

        return self._call("list ResourceSlices", work, self._clock() + timeout)

    def watch_list_slices(self, node_name: str, server_timeout: int) -> Iterator[tuple[str, Json]]:
        """This driver's slices of the node as ADDED events, then SYNCED, then their changes (ADDED, MODIFIED,
        DELETED), for as long as the watch lasts (see `watch_slices`); ApiFailure for what ends it, 422 from a
        server that does not serve watch-lists."""
        try:
            yield from watch_list(self._client, self._slices, self._selector(node_name), server_timeout)
        except Exception as exc:  # as watch_slices
            raise _failure(exc, "watch-list ResourceSlices") from None

    def watch_slices(self, node_name: str, resource_version: str, server_timeout: int) -> Iterator[tuple[str, Json]]:
        """The events (ADDED, MODIFIED, DELETED; the object) on this driver's slices of the node after
        `resource_version`, for as long as the watch lasts: lightkube resumes one the server ends after
        `server_timeout` seconds from the last version it saw; ApiFailure for whatever ends it (410 Gone, the
        server gone, a broken connection, WATCH_READ_IDLE seconds without a byte)."""
        try:
            yield from watch(self._client, self._slices, self._selector(node_name), server_timeout, resource_version)
        except Exception as exc:  # lightkube raises ApiError, httpx's errors, and more for a broken stream
            raise _failure(exc, "watch ResourceSlices") from None

    def create_slice(self, body: Json, timeout: float) -> Json:
        """Create a slice of the name in `body`. A retry of a create whose answer was lost finds the slice the
        first try made (409 AlreadyExists) and returns it; the same name at the first try is another's: 409."""
        from lightkube import ApiError

        name = body["metadata"]["name"]
        tries = 0

        def work() -> Json:
            nonlocal tries
            tries += 1
            try:
                return dict(self._client.create(self._slices.from_dict(body)))
            except ApiError as exc:
                if tries == 1 or exc.status.code != 409:
                    raise
            return dict(self._client.get(self._slices, name))

        return self._call(f"create ResourceSlice {name}", work, self._clock() + timeout)

    def replace_slice(self, body: Json, timeout: float) -> Json:
        """Update a slice; its metadata.resourceVersion is the precondition (409 Conflict if it changed)."""
        deadline = self._clock() + timeout
        return self._call(f"update ResourceSlice {body['metadata']['name']}",
                          lambda: dict(self._client.replace(self._slices.from_dict(body))), deadline)

    def delete_slice(self, existing: Json, timeout: float) -> None:
        """Delete a slice as it was seen (its UID and resourceVersion); one gone already is what was wanted."""
        metadata = existing["metadata"]
        name = metadata["name"]
        deadline = self._clock() + timeout
        try:
            self._call(f"delete ResourceSlice {name}", lambda: delete_with_preconditions(
                self._client, self._slices, name, metadata["uid"], metadata["resourceVersion"]), deadline)
        except ApiFailure as failure:
            if failure.status != 404:
                raise
