"""IDs from a request, as an error message or a log record carries them.

A request comes from the pod network's side of the kubelet: its IDs can be megabytes long and number in the
hundreds of thousands. Whatever names them in an error or a log stays short whatever the request, and every
place that names them bounds them here, in one way.
"""

from __future__ import annotations

from collections.abc import Sequence

QUOTED_CHARS = 80
"""An ID in an error message: its quoted form (escapes make it longer than the ID) cut to this."""
LISTED_IN_ERROR = 5
"""An error message names this many of a list, then how many more."""
LOGGED_IDS = 64
LOGGED_CHARS = 64
"""A log record's ID list: this many IDs, each cut to this many characters."""


def quoted(text: str) -> str:
    """`text` quoted for an error message, cut (marked by an ellipsis) when long."""
    shown = repr(text)
    return shown if len(shown) <= QUOTED_CHARS else shown[:QUOTED_CHARS] + "…"


def listed(items: Sequence[str], quote: bool = False) -> str:
    """The first few of `items` (each `quoted` if `quote`), joined, and how many are left out."""
    head = items[:LISTED_IN_ERROR]
    shown = ", ".join(quoted(i) for i in head) if quote else ", ".join(head)
    return shown + (f" and {len(items) - LISTED_IN_ERROR} more" if len(items) > LISTED_IN_ERROR else "")


def logged(ids: Sequence[str]) -> list[str]:
    """IDs as a log record carries them: bounded in count and length."""
    return [i[:LOGGED_CHARS] for i in ids[:LOGGED_IDS]]
