"""Requests lightkube's public calls cannot send, and a header and a timeout they cannot set, built from its generic
client as lightkube's own calls build theirs (worker-dra's only: `dra_worker/kube.py`).

- `watch_list`: the slices as they are and then their changes in one watch request with bookmarks, as client-go's
  informers ask since Kubernetes 1.32. What it buys: no list request at start or after a failed watch (at 1,000
  nodes, 1,000 LISTs saved after an API server restart; bench/dra_fleet.py).
- `watch`: a watch from a version with bookmarks (lightkube's own asks for none), for an API server without
  watch-lists: with them, a quiet watch still hears from the server about once a minute (see `read_idle`).
- `read_idle`: a watch's reads time out: lightkube waits for ever. A connection that died without a word (a
  peer gone, a NAT entry dropped) then ends the watch after that long without a byte, instead of never; over
  HTTP/2 it also frees the writes that share the connection, which wait for the watcher's read.
- `delete_with_preconditions`: a delete that names the UID and resourceVersion the worker saw, so an obsolete slice
  is never removed after another writer changed or replaced it.
- `uncompressed`: answers asked as they are: kube-apiserver 1.37 held a gzip-compressed watch-list's later events
  back for seconds (a deletion went unseen; measured in tests/dra).

They use `Client._client` (lightkube's GenericSyncClient), its `prepare_request`, `send`, `watch`,
`raise_for_status` and `_watch_timeout`, and its httpx client's `build_request` and headers: lightkube's
internals. Checked against
lightkube 1.0.1 (`CHECKED_AGAINST`, pinned exactly in pyproject.toml and the lock); on another release a
request built here may be malformed, which tests/unit/test_dra_kube.py and tests/dra show.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

CHECKED_AGAINST = ("lightkube", "1.0.1")
Json = dict[str, Any]
SYNCED = "SYNCED"
"""The event after a watch-list's initial ADDED events: from here on the view is the server's."""
# The annotation of the bookmark that ends a watch-list's initial events.
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def delete_with_preconditions(client: Any, resource: Any, name: str, uid: str, resource_version: str) -> None:
    """DELETE `name` only if it still has this UID and resourceVersion (else 409 Conflict), as lightkube's own
    delete builds the request, with DeleteOptions in the body."""
    generic = client._client
    basic = generic.prepare_request("delete", res=resource, name=name)
    options = {"apiVersion": "v1", "kind": "DeleteOptions",
               "preconditions": {"uid": uid, "resourceVersion": resource_version}}
    request = generic._client.build_request("DELETE", basic.url, params=basic.params, json=options)
    generic.raise_for_status(generic.send(request))


def uncompressed(client: Any) -> None:
    """Ask for answers as they are, not gzip-compressed. The API server compresses a watch-list's stream (its
    initial events make it large) and then holds later events back until more follow: a deletion went unseen for
    seconds on end (kube-apiserver 1.37, measured in tests/dra). worker-dra's answers are small (one node's
    slices, one claim). Sets the header on lightkube's HTTP client:
    lightkube sends no header of a caller's with a watch."""
    client._client._client.headers["Accept-Encoding"] = "identity"


def read_idle(client: Any, seconds: float) -> None:
    """A watch's reads (each read of its connection, over HTTP/2 whichever stream it serves) fail after `seconds`
    without a byte: the watch ends with a timeout."""
    client._client._watch_timeout.read = seconds


def watch(client: Any, resource: Any, field_selector: str, server_timeout: int,
          resource_version: str) -> Iterator[tuple[str, Json]]:
    """The changes after `resource_version`, with bookmarks (not yielded; they keep the version lightkube
    resumes from recent, and a quiet watch hears from the server)."""
    yield from _watch(client, resource, {"fieldSelector": field_selector, "resourceVersion": resource_version},
                      server_timeout)


def watch_list(client: Any, resource: Any, field_selector: str, server_timeout: int) -> Iterator[tuple[str, Json]]:
    """A watch-list as lightkube's own watch builds a watch, with sendInitialEvents and bookmarks: ADDED for each
    object there is, SYNCED (with that bookmark, whose resourceVersion is the one the initial events show) at the
    bookmark that ends them, then the changes; resumed (by lightkube, when the
    server ends the watch) as a plain watch from the last version seen, which the bookmarks keep recent."""
    yield from _watch(client, resource, {"fieldSelector": field_selector, "sendInitialEvents": "true",
                                         "resourceVersionMatch": "NotOlderThan"}, server_timeout)


def _watch(client: Any, resource: Any, params: dict[str, Any], server_timeout: int) -> Iterator[tuple[str, Json]]:
    generic = client._client
    request = generic.prepare_request("list", res=resource, watch=True, params={
        "timeoutSeconds": server_timeout, "allowWatchBookmarks": "true", **params})
    for kind, item in generic.watch(request):
        if kind != "BOOKMARK":
            yield kind, dict(item)
        elif ((dict(item).get("metadata") or {}).get("annotations") or {}).get(_INITIAL_EVENTS_END) == "true":
            for initial_only in ("sendInitialEvents", "resourceVersionMatch"):
                request.params.pop(initial_only, None)
            yield SYNCED, dict(item)
