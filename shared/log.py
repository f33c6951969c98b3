"""The one structured log stream of the stack (CONTRACT §5).

Each process writes one record per line to stdout: JSON by default (`ts`,
`level`, `msg`, `process`, then the event's keys) or a text rendering for
people. supervisord passes every program's stdout through to its own, so a
record must reach the pipe in a single write: records are kept below the pipe's
atomic-write size and flushed one by one. Standard-library logging (gRPC's and
OpenTelemetry's own records) is routed into the same stream.

Callers log with loguru and pass the event's keys as keyword arguments:
`logger.info("Device exposed", resourceName=..., device=...)`.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from loguru import logger

LEVEL_ENV = "RBLN_DEVICE_PLUGIN_LOG_LEVEL"
FORMAT_ENV = "RBLN_DEVICE_PLUGIN_LOG_FORMAT"
DIR_ENV = "RBLN_DEVICE_PLUGIN_LOG_DIR"
DEFAULT_LEVEL = "info"
DEFAULT_FORMAT = "json"
DEFAULT_DIR = "/var/log/rbln-device-plugin"

_LEVELS = {"error": "ERROR", "warning": "WARNING", "warn": "WARNING", "info": "INFO", "debug": "DEBUG"}
_FORMATS = ("json", "text")
# loguru level name -> the lowercase names the stream uses.
_LEVEL_KEYS = {"CRITICAL": "error", "ERROR": "error", "WARNING": "warn", "SUCCESS": "info",
               "INFO": "info", "DEBUG": "debug", "TRACE": "debug"}
# PIPE_BUF: a write of at most this many bytes to a pipe is never interleaved.
MAX_RECORD_BYTES = 4096
_FIRST_KEYS = ("ts", "level", "msg", "process")
_ROTATE_BYTES = 10 * 1024 * 1024
_KEEP_FILES = 5


def timestamp(moment: datetime.datetime) -> str:
    """RFC3339Nano in UTC: fractional seconds without trailing zeros, `Z` suffix."""
    utc = moment.astimezone(datetime.timezone.utc)
    fraction = f"{utc.microsecond:06d}".rstrip("0")
    return utc.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


def _caller(record: Mapping[str, Any]) -> str:
    path = pathlib.Path(record["file"].path)
    return f"{path.parent.name}/{path.name}:{record['line']}"


def _fields(record: Mapping[str, Any], with_caller: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": timestamp(record["time"]),
        "level": _LEVEL_KEYS.get(record["level"].name, record["level"].name.lower()),
        "msg": record["message"],
        "process": record["extra"].get("process", ""),
    }
    for key, value in record["extra"].items():
        if key not in fields and not key.startswith("_"):
            fields[key] = value
    if record["exception"] is not None and "err" not in fields:
        fields["err"] = f"{record['exception'].type.__name__}: {record['exception'].value}"
    if with_caller:
        fields["caller"] = _caller(record)
    return fields


def _shrink(fields: dict[str, Any], encode) -> str:
    """Encode `fields`, halving the longest event value until the record fits one atomic write."""
    line = encode(fields)
    while len(line.encode()) >= MAX_RECORD_BYTES:
        candidates = [k for k in fields if k not in _FIRST_KEYS]
        if not candidates:
            fields["msg"] = fields["msg"][: len(fields["msg"]) // 2]
        else:
            key = max(candidates, key=lambda k: len(json.dumps(fields[k], default=str)))
            text = fields[key] if isinstance(fields[key], str) else json.dumps(fields[key], default=str)
            fields[key] = text[: len(text) // 2] + "…(truncated)"
        line = encode(fields)
    return line


def _json_line(fields: dict[str, Any]) -> str:
    return json.dumps(fields, default=str, separators=(",", ":"))


def _text_line(fields: dict[str, Any]) -> str:
    rest = " ".join(f"{k}={json.dumps(v, default=str, ensure_ascii=False)}"
                    for k, v in fields.items() if k not in _FIRST_KEYS)
    return f"{fields['ts']} {fields['level'].upper():5} [{fields['process']}] {fields['msg']}" + (
        f"  {rest}" if rest else "")


class _StdlibBridge(logging.Handler):
    """Routes standard-library records into loguru, tagged with the library they come from.

    gRPC's informational chatter is per-request flow (debug); OpenTelemetry's
    errors are about best-effort tracing and never rise above warn.
    """

    def emit(self, record: logging.LogRecord) -> None:
        level = record.levelname if record.levelname in _LEVEL_KEYS else "INFO"
        extra: dict[str, Any] = {}
        if record.name.startswith("grpc"):
            extra["component"] = "grpc"
            if level == "INFO":
                level = "DEBUG"
        elif record.name.startswith("opentelemetry"):
            extra["component"] = "otel"
            if level in ("ERROR", "CRITICAL"):
                level = "WARNING"
        message = record.getMessage()
        if record.name.startswith("opentelemetry") and level == "WARNING":
            extra["err"] = message
            message = "OpenTelemetry SDK error"
        if record.exc_info and record.exc_info[1] is not None:
            extra.setdefault("err", f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}")
        logger.bind(**extra).opt(depth=0).log(level, message)


def setup(process: str, environ: Mapping[str, str] | None = None, stream=None) -> list[str]:
    """Install the stream for `process`; returns warnings about fallen-back settings (already logged)."""
    environ = os.environ if environ is None else environ
    stream = sys.stdout if stream is None else stream
    warnings: list[tuple[str, dict[str, str]]] = []

    level_text = environ.get(LEVEL_ENV, DEFAULT_LEVEL).strip().lower() or DEFAULT_LEVEL
    if level_text not in _LEVELS:
        warnings.append(("Invalid log level; using the default",
                         {"env": LEVEL_ENV, "value": level_text, "fallback": DEFAULT_LEVEL}))
        level_text = DEFAULT_LEVEL
    format_text = environ.get(FORMAT_ENV, DEFAULT_FORMAT).strip().lower() or DEFAULT_FORMAT
    if format_text not in _FORMATS:
        warnings.append(("Invalid log format; using the default",
                         {"env": FORMAT_ENV, "value": format_text, "fallback": DEFAULT_FORMAT}))
        format_text = DEFAULT_FORMAT

    level = _LEVELS[level_text]
    with_caller = level == "DEBUG"
    render = _json_line if format_text == "json" else _text_line

    def patch(record: dict[str, Any]) -> None:
        record["extra"]["_line"] = _shrink(_fields(record, with_caller), render)

    logger.remove()
    logger.configure(extra={"process": process}, patcher=patch)
    # A format function returns a template; the rendered line is inserted verbatim.
    template = lambda _record: "{extra[_line]}\n"  # noqa: E731
    logger.add(stream, level=level, format=template, colorize=False, backtrace=False, diagnose=False)

    log_dir = environ.get(DIR_ENV, DEFAULT_DIR)
    if log_dir:
        try:
            pathlib.Path(log_dir).mkdir(parents=True, exist_ok=True)
            logger.add(pathlib.Path(log_dir) / f"{process}.log", level=level, format=template,
                       rotation=_ROTATE_BYTES, retention=_KEEP_FILES, colorize=False,
                       backtrace=False, diagnose=False)
        except OSError as exc:
            warnings.append(("Log directory unavailable; logging to stdout only",
                             {"env": DIR_ENV, "value": log_dir, "err": str(exc)}))

    logging.basicConfig(handlers=[_StdlibBridge()], level=logging.DEBUG if with_caller else logging.INFO,
                        force=True)
    for message, fields in warnings:
        logger.warning(message, **fields)
    return [message for message, _ in warnings]
