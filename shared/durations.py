"""Go-style durations (`500ms`, `5s`, `1m30s`), as the original's flags accept them."""

from __future__ import annotations

import re

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_TERM = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError naming what is wrong otherwise."""
    body = text.strip()
    sign = 1.0
    if body[:1] in "+-" and body:
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        raise ValueError("empty duration")
    total = 0.0
    position = 0
    while position < len(body):
        match = _TERM.match(body, position)
        if not match or match.group(1) in ("", "."):
            if match is None and body[position:].replace(".", "").isdigit():
                raise ValueError(f"missing unit in duration {text!r} (use ns, us, ms, s, m or h)")
            raise ValueError(f"invalid duration {text!r}")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """A compact Go-like rendering for logs: `5s`, `500ms`, `1m30s`."""
    if seconds >= 60 and seconds == int(seconds):
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if seconds >= 1:
        return f"{seconds:g}s"
    return f"{seconds * 1000:g}ms"
