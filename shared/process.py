"""What every process of the stack does at start and at shutdown."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Mapping

from loguru import logger

from shared import log
from shared.config import ConfigError, Settings
from shared.version import VERSION

# Termination requests a process honours. SIGHUP too: in a container nobody
# reloads a worker by signal, and supervisord sends it to stop a group.
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def start_process(process: str, environ: Mapping[str, str] | None = None, **startup_fields) -> Settings:
    """Install logging, read the configuration and log the startup record; exit 2 on bad config."""
    log.setup(process, environ)
    try:
        settings = Settings.from_environ(environ)
    except ConfigError as exc:
        logger.error("Invalid configuration", err=str(exc))
        print(f"rbln-device-plugin {process}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logger.info("Starting rbln-device-plugin", version=VERSION, **startup_fields, **settings.log_fields())
    return settings


class ShutdownSignal:
    """Set once a termination signal arrives; remembers which one, and logs it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self.signal_name: str | None = None

    def install(self) -> "ShutdownSignal":
        for signum in SHUTDOWN_SIGNALS:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, _frame) -> None:
        if self._event.is_set():
            return
        self.signal_name = signal.Signals(signum).name
        logger.info("Shutdown signal received", signal=self.signal_name)
        self.request()

    def on_request(self, listener: Callable[[], None]) -> None:
        """Call `listener` when shutdown is requested (from the signal handler: it must not block)."""
        self._listeners.append(listener)

    def request(self) -> None:
        self._event.set()
        for listener in self._listeners:
            listener()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)
