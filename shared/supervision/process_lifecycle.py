"""What every process of the stack does at start and at shutdown."""

from __future__ import annotations

import atexit
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import NoReturn

from loguru import logger

from shared.config import ConfigError, Settings
from shared.observability import log
from shared.supervision import transport
from shared.version import VERSION

# Termination requests a process honours. SIGHUP too: nothing in the stack reloads
# by signal, so a hang-up can only mean stop.
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
# A local XML-RPC question and a few kill() calls; never hold up an exit for longer.
_TELL_STACK_SECONDS = 2.0


def start_process(process: str, environ: Mapping[str, str] | None = None, **startup_fields) -> Settings:
    """Install logging, read the configuration and log the startup record; exit 2 on bad config.

    Logging settings that fell back to their defaults are reported right after the
    first record, which names the process and its configuration, the level and
    format in use among it.
    """
    logging = log.setup(process, environ)
    try:
        settings = Settings.from_environ(environ)
    except ConfigError as exc:
        logger.error("Invalid configuration", err=str(exc))
        for fallback in logging.fallbacks:
            fallback.log()
        print(f"rbln-device-plugin {process}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logger.info("Starting rbln-device-plugin", version=VERSION, logLevel=logging.level, logFormat=logging.format,
                **startup_fields, **settings.log_fields())
    for fallback in logging.fallbacks:
        fallback.log()
    return settings


def _wake_only(_signum: int, _frame) -> None:
    """The Python-level handler: the signal is acted on by the thread reading the wakeup fd."""


class ShutdownSignal:
    """Set once a termination signal arrives; remembers which one, and logs it.

    A signal handler runs between two bytecodes of the main thread, possibly while
    that thread holds a lock the handler would need (an Event's, the logger's).
    So the handler does nothing: the interpreter writes the signal number to a
    wakeup pipe, and a thread of ours reads it, logs it and runs the listeners
    with no lock held by anyone. That thread is woken even while the main thread
    waits inside a C call. `on_signal` hands that thread other signals too (the
    interpreter has one wakeup fd).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._event = threading.Event()
        # Guards `_listeners` and the once-only transition in request().
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        # Other signals' listeners, each set before its handler is installed; read by the signal thread.
        self._orders: dict[int, Callable[[], None]] = {}
        # Readable once shutdown is requested, for loops that wait in select().
        self._ready_read, self._ready_write = os.pipe()
        # Clear while the thread tells supervisord that the stack is stopping.
        self._stack_told = threading.Event()
        self._stack_told.set()
        self.signal_name: str | None = None

    def install(self) -> ShutdownSignal:
        """Handle SHUTDOWN_SIGNALS from now on (call from the main thread)."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        for signum in SHUTDOWN_SIGNALS:
            signal.signal(signum, _wake_only)
        atexit.register(self.settle)
        threading.Thread(target=self._receive, args=(wake_read,), name="shutdown-signal", daemon=True).start()
        return self

    def _receive(self, wake_read: int) -> None:
        while True:
            for signum in os.read(wake_read, 64):
                if signum in SHUTDOWN_SIGNALS and not self._event.is_set():
                    self.signal_name = signal.Signals(signum).name
                    logger.info("Shutdown signal received", signal=self.signal_name)
                    self._stack_told.clear()
                    self.request()
                    try:
                        stop_with_the_stack(self._environ)
                    finally:
                        self._stack_told.set()
                elif signum in self._orders and not self._event.is_set():
                    self._orders[signum]()

    def on_signal(self, signum: signal.Signals, listener: Callable[[], None]) -> None:
        """Call `listener` from the signal thread whenever `signum` arrives, until shutdown is requested
        (call from the main thread, after install)."""
        self._orders[signum] = listener
        signal.signal(signum, _wake_only)

    def settle(self) -> None:
        """Get ready to exit: runs at exit, or from exit_now."""
        # supervisord must hear from us before we are gone (see stop_with_the_stack).
        self._stack_told.wait(_TELL_STACK_SECONDS)
        # The interpreter now puts Python-level handlers back to the default action, which
        # would let a late duplicate (supervisord's, or one from the shell) kill the process
        # with a signal status instead of its own exit code. An ignored signal stays ignored.
        for signum in SHUTDOWN_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def on_request(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from another thread) when shutdown is requested; at once if it already was."""
        with self._lock:
            if not self._event.is_set():
                self._listeners.append(listener)
                return
        listener()

    def request(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener()
        os.write(self._ready_write, b"x")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def fileno(self) -> int:
        """A descriptor that turns readable when shutdown is requested (for select)."""
        return self._ready_read


def exit_now(shutdown: ShutdownSignal, code: int = 0) -> NoReturn:
    """End a process that has stopped and closed everything it owns, skipping the interpreter's teardown.

    Freeing every module and object of a gRPC process costs some 60 ms of CPU, and
    supervisord stops the stack one program at a time, each once the one before has
    exited: every process's teardown lies on the path to the stack's exit. Log sinks
    are closed here (which flushes the log file).
    """
    shutdown.settle()
    logger.remove()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def stop_with_the_stack(environ: Mapping[str, str]) -> None:
    """When supervisord is stopping every program, make the stop final.

    supervisord stops all its programs both to exit (SIGTERM, SIGINT, SIGQUIT)
    and to reload (SIGHUP), and after a reload it starts them all again. For this
    stack each of those signals means the pod is going away, so the first program
    that learns of it sends supervisord SIGTERM: that turns a reload into a
    shutdown and changes nothing in a shutdown.

    The siblings are left to supervisord, which stops them one after the other in
    supervisor.conf's order, each as soon as the one before has exited
    (shared/fence/supervisord_wakeup.py).
    """
    if "SUPERVISOR_SERVER_URL" not in environ:
        return  # not a program of supervisord
    run_dir = pathlib.Path(environ["SUPERVISOR_SERVER_URL"].removeprefix("unix://")).parent
    supervisord = os.getppid()
    # Only our own parent, proven by the socket it answers on, never whatever adopted an orphan.
    if transport.stopping_supervisord(run_dir, _TELL_STACK_SECONDS) == supervisord:
        os.kill(supervisord, signal.SIGTERM)
