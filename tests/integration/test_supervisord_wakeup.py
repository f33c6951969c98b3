"""supervisord's loop, woken by shared/fence/supervisord_wakeup.py: real supervisord (recording each poll of its
loop, tests/support/supervisord_probe.py) with the hook configured as supervisor.conf configures it.

Without the hook, supervisord polls with a one-second timeout and acts only after a poll returns: it
starts its programs after its first poll times out, and it reaps a child whose exit made no descriptor
ready after the poll in progress times out; stopping, it spends a poll on every program group, even one
with nothing to stop. So each check is an order of events, not a duration: the
spawn or the reap comes with no poll that timed out before it."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from shared.supervision.client import server_proxy
from tests.support.supervisord_conf import base_conf, hook_section
from tests.support.waiting import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 30.0
NO_HOOK = "cannot wake supervisord's loop"

# A program that closes its standard streams (supervisord sees them end long before the program does),
# says so with a file, and waits for a signal to end it: its exit readies no descriptor of supervisord's.
# Stubborn, it ignores SIGTERM: supervisord kills it after stopwaitsecs.
SILENT_PROGRAM = """\
import os, pathlib, signal, sys
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for fd in (0, 1, 2):
    os.close(fd)
pathlib.Path(sys.argv[1]).touch()
while True:
    signal.pause()
"""
STOPWAITSECS = 2


class ProbedSupervisord:
    """supervisord running SILENT_PROGRAM, its loop's events read from the probe's records."""

    def __init__(self, run_dir: pathlib.Path, temper: str = "silent", **env: str) -> None:
        self.run_dir = run_dir
        self.records_path = run_dir / "records"
        self.closed = run_dir / "streams-closed"
        self.log = run_dir / "supervisord.log"
        (run_dir / "silent.py").write_text(SILENT_PROGRAM)
        conf = run_dir / "supervisord.conf"
        conf.write_text(base_conf(run_dir, self.log) + hook_section("wakeup") + textwrap.dedent(f"""
            [program:silent]
            command={sys.executable} {run_dir}/silent.py {self.closed} {temper}
            priority=1
            autorestart=false
            startsecs=0
            stopwaitsecs={STOPWAITSECS}

            ; Never started, and stopped first (highest priority): a group with nothing to stop.
            [program:idle]
            command={sys.executable} -c pass
            priority=2
            autostart=false
            """))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.supervisord_probe", "-n", "-c", str(conf)],
            cwd=ROOT, env={**os.environ, "PROBE_RECORDS": str(self.records_path), **env},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def records(self) -> list[str]:
        try:
            return self.records_path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def program_pid(self) -> int:
        """The program's pid, once it has closed its streams and supervisord has seen them end."""
        wait_until(self.closed.exists, TIMEOUT, "the program to close its streams")
        seen = len(self.records())
        # A poll that timed out after that, or the loop in a poll with the quiet timeout (every program
        # settled): the ends of the streams are no longer pending.
        wait_until(lambda: "timed out" in self.records()[seen:] or self.records()[-1:] == ["quiet"], TIMEOUT,
                   "supervisord's loop to settle")
        (spawned,) = [line for line in self.records() if line.startswith("spawned silent ")]
        return int(spawned.split()[-1])

    def polls_before_reaping(self, pid: int, since: int) -> list[str]:
        """The outcomes of the polls between record `since` and the reaping of `pid`."""
        reaped = f"reaped {pid}"
        records = wait_until(lambda: reaped in self.records() and self.records(), TIMEOUT, reaped)
        return [line for line in records[since:records.index(reaped)] if line in ("woken", "timed out")]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(TIMEOUT)


@pytest.fixture
def probed(short_tmp):
    started: list[ProbedSupervisord] = []

    def start(temper: str = "silent", **env: str) -> ProbedSupervisord:
        started.append(ProbedSupervisord(short_tmp, temper, **env))
        return started[-1]

    yield start
    for supervisord in started:
        if supervisord.process.poll() is None:
            supervisord.process.kill()
            supervisord.process.wait(TIMEOUT)


def test_supervisord_starts_its_programs_at_its_first_poll(probed):
    supervisord = probed()
    wait_until(lambda: any(line.startswith("spawned silent ") for line in supervisord.records()), TIMEOUT,
               "the program's spawn")
    records = supervisord.records()
    spawned = next(i for i, line in enumerate(records) if line.startswith("spawned silent "))
    assert records[:spawned] == ["woken"]  # the hook's first byte, not a timeout
    assert server_proxy(supervisord.run_dir).wakeup.installed() is True
    assert supervisord.stop() == 0
    assert NO_HOOK not in supervisord.log.read_text()


def test_a_programs_exit_is_reaped_at_the_wake_it_causes_not_after_a_timeout(probed):
    supervisord = probed()
    pid = supervisord.program_pid()
    since = len(supervisord.records())
    os.kill(pid, signal.SIGKILL)
    assert "timed out" not in supervisord.polls_before_reaping(pid, since)
    assert supervisord.stop() == 0


def test_stopping_supervisord_passes_a_group_with_nothing_to_stop_and_exits_at_the_last_exit(probed):
    supervisord = probed()
    pid = supervisord.program_pid()
    since = len(supervisord.records())
    # supervisord's SIGTERM wakes it; it passes the idle group, stops the program, whose exit wakes it.
    assert supervisord.stop() == 0
    records = supervisord.records()[since:]
    assert f"reaped {pid}" in records and "timed out" not in records


def test_stopping_a_program_that_ignores_sigterm_the_loop_waits_at_its_pace_without_spinning(probed):
    supervisord = probed("stubborn")
    pid = supervisord.program_pid()
    since = len(supervisord.records())
    assert supervisord.stop() == 0  # supervisord killed the program after stopwaitsecs
    polls = [line for line in supervisord.records()[since:] if line in ("woken", "timed out")]
    assert f"reaped {pid}" in supervisord.records()
    # While it waited, the loop polled at its own one-second pace: a few polls, not a spin.
    assert polls.count("timed out") >= STOPWAITSECS - 1 and len(polls) <= 4 * STOPWAITSECS + 4


def test_a_hook_that_cannot_install_leaves_supervisord_running_as_before_with_one_line(probed):
    supervisord = probed(PROBE_NO_WAKEUP_FD="1")
    pid = supervisord.program_pid()
    assert server_proxy(supervisord.run_dir).wakeup.installed() is False
    # As supervisord without the hook: the first spawn after a timed-out poll.
    records = supervisord.records()
    assert records[0] == "timed out"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: f"reaped {pid}" in supervisord.records(), TIMEOUT, "the program's reaping")
    assert supervisord.stop() == 0
    lines = [line for line in supervisord.log.read_text().splitlines() if NO_HOOK in line]
    assert len(lines) == 1 and "set_wakeup_fd only works in main thread" in lines[0]
