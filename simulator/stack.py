"""Runs the real stack (`rbln-device-plugin run`, supervisord and all) as a child process and reads its log stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Record = dict[str, Any]
ENTRYPOINT = "from rbln_device_plugin.cli import main; main()"
RUN_COMMAND = (sys.executable, "-c", ENTRYPOINT, "run")


class StackProcess:
    """`rbln-device-plugin run` in a child process. Every stdout line is kept (parsed when it is JSON)."""

    def __init__(self, environ: Mapping[str, str], extra_args: tuple[str, ...] = (),
                 command: Sequence[str] | None = None):
        """`command` replaces RUN_COMMAND (e.g. `docker run` of the image, or RUN_COMMAND behind nsenter)."""
        self._environ = dict(environ)
        self._command = list(command if command is not None else RUN_COMMAND)
        self._args = extra_args
        self._proc: subprocess.Popen | None = None
        # Guards `records`, `raw_lines` and `stderr_lines`; notified on every new line.
        self._changed = threading.Condition()
        self.records: list[Record] = []
        self.raw_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._readers: list[threading.Thread] = []

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def start(self) -> StackProcess:
        self._proc = subprocess.Popen([*self._command, *self._args],
                                      env=self._environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, bufsize=1,
                                      # Its own process group: a leftover stack can be killed whole.
                                      start_new_session=True)
        for stream, sink in ((self._proc.stdout, self._on_stdout), (self._proc.stderr, self._on_stderr)):
            reader = threading.Thread(target=self._read, args=(stream, sink), daemon=True)
            reader.start()
            self._readers.append(reader)
        return self

    def _read(self, stream, sink: Callable[[str], None]) -> None:
        for line in stream:
            sink(line.rstrip("\n"))

    def _on_stdout(self, line: str) -> None:
        with self._changed:
            self.raw_lines.append(line)
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                self.records.append(record)
            self._changed.notify_all()

    def _on_stderr(self, line: str) -> None:
        with self._changed:
            self.stderr_lines.append(line)

    def find(self, msg: str | None = None, **fields: Any) -> list[Record]:
        with self._changed:
            return [r for r in self.records if (msg is None or r.get("msg") == msg)
                    and all(r.get(k) == v for k, v in fields.items())]

    def wait_for_record(self, msg: str, timeout: float = 20.0, count: int = 1, **fields: Any) -> list[Record]:
        """Wait until at least `count` records with `msg` and `fields` were logged."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [r for r in self.records if r.get("msg") == msg
                         and all(r.get(k) == v for k, v in fields.items())]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._proc is not None and self._proc.poll() is not None):
                    tail = "\n".join(self.raw_lines[-20:] + self.stderr_lines[-20:])
                    raise TimeoutError(f"no {count}x {msg!r} {fields} within {timeout}s; last output:\n{tail}")
                self._changed.wait(min(remaining, 0.5))

    def send_signal(self, signum: int = signal.SIGTERM) -> None:
        assert self._proc is not None
        self._proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal supervisord and wait for the whole stack to exit; returns its exit code."""
        assert self._proc is not None
        if self._proc.poll() is None:
            self._proc.send_signal(signum)
        return self.wait(timeout)

    def wait(self, timeout: float = 20.0) -> int:
        """Wait for the stack to exit by itself (it is killed after `timeout`); returns its exit code."""
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_tree()
            code = self._proc.wait()
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    def _kill_tree(self) -> None:
        assert self._proc is not None
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> StackProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
