"""shared/fence/supervisord_wakeup.py on its own: the dispatcher it puts into a socket map, and its factory's
failure mode (supervisord itself runs it in tests/integration/test_supervisord_wakeup.py)."""

from __future__ import annotations

import os
import signal
import types

import pytest

from shared.fence import supervisord_wakeup


class Group:
    """A stand-in of supervisord's ProcessGroup: only what the hook asks of one."""

    def __init__(self, unstopped: list[str]) -> None:
        self.unstopped = unstopped

    def get_unstopped_processes(self) -> list[str]:
        return self.unstopped


@pytest.fixture
def supervisord():
    """A stand-in of supervisord's Supervisor: its socket map, and its groups still to stop (None until it stops)."""
    entries: dict = {}
    yield types.SimpleNamespace(options=types.SimpleNamespace(get_socket_map=lambda: entries), stop_groups=None)
    for dispatcher in entries.values():
        dispatcher.close()


def socket_map(supervisord) -> dict:
    return supervisord.options.get_socket_map()


def pending(dispatcher) -> bytes:
    try:
        return os.read(dispatcher.read_fd, 1 << 16)
    except BlockingIOError:
        return b""


def test_the_installed_pipe_is_ready_at_once_and_a_signal_makes_it_ready_again(supervisord):
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        dispatcher = supervisord_wakeup.install(supervisord)
        assert socket_map(supervisord) == {dispatcher.read_fd: dispatcher}
        assert dispatcher.readable() and not dispatcher.writable()
        assert os.read(dispatcher.read_fd, 16) == b"\0"  # the first poll returns at once
        os.kill(os.getpid(), signal.SIGUSR1)
        assert os.read(dispatcher.read_fd, 16) == bytes([signal.SIGUSR1])
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_read_event_empties_the_pipe_and_leaves_it_open(supervisord):
    dispatcher = supervisord_wakeup.install(supervisord)
    os.write(dispatcher.write_fd, b"\x11" * 5000)
    dispatcher.handle_read_event()
    with pytest.raises(BlockingIOError):
        os.read(dispatcher.read_fd, 1)
    assert dispatcher.readable()


def test_an_error_or_the_end_of_the_pipe_closes_it_so_the_loop_stops_polling_it(supervisord):
    failed = supervisord_wakeup.install(supervisord)
    failed.handle_error()
    assert not failed.readable()
    with pytest.raises(OSError):
        os.fstat(failed.read_fd)
    ended = supervisord_wakeup.install(supervisord)
    os.close(ended.write_fd)  # as supervisord's reload closes every descriptor from 5 up
    reused = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: the write end's
    try:
        ended.handle_read_event()
        assert not ended.readable()
        os.fstat(reused)  # still open: only the read end was closed
    finally:
        os.close(reused)
    assert signal.set_wakeup_fd(-1) == -1  # the interpreter no longer writes to a closed pipe


def test_a_second_http_server_finds_the_pipe_in_place_and_a_reload_replaces_it(supervisord):
    first = supervisord_wakeup.install(supervisord)
    assert supervisord_wakeup.install(supervisord) is first
    reloaded = types.SimpleNamespace(options=supervisord.options, stop_groups=None)  # a new Supervisor
    second = supervisord_wakeup.install(reloaded)
    assert list(socket_map(supervisord).values()) == [second]
    first.close()


def test_the_factory_never_raises_and_says_once_why_the_loop_stays_slow():
    warnings: list[str] = []
    options = types.SimpleNamespace(logger=types.SimpleNamespace(warn=warnings.append))  # no get_socket_map
    interface = supervisord_wakeup.make_wakeup_rpcinterface(types.SimpleNamespace(options=options))
    assert interface.installed() is False
    assert len(warnings) == 1 and "get_socket_map" in warnings[0]


def test_stopping_the_poll_returns_at_once_when_the_group_in_turn_has_nothing_left_to_stop(supervisord):
    dispatcher = supervisord_wakeup.install(supervisord)
    pending(dispatcher)
    assert dispatcher.readable() and pending(dispatcher) == b""  # not stopping: the poll waits
    supervisord.stop_groups = [Group([]), Group(["worker-npu"])]
    assert dispatcher.readable() and pending(dispatcher) == b""  # a program to wait for
    supervisord.stop_groups.pop()
    assert dispatcher.readable() and pending(dispatcher) == b"\0"  # nothing to wait for: on to the next
    supervisord.stop_groups.pop()
    assert dispatcher.readable() and pending(dispatcher) == b""  # none left


def test_a_supervisord_without_stop_groups_is_stopped_at_its_own_pace_and_never_broken(supervisord):
    del supervisord.stop_groups
    dispatcher = supervisord_wakeup.install(supervisord)
    pending(dispatcher)
    assert dispatcher.readable() and dispatcher.readable() and pending(dispatcher) == b""


def test_a_signal_noted_but_not_acted_on_yet_has_the_poll_return_at_once(supervisord):
    # supervisord acts on one noted signal a turn: a SIGTERM noted in the turn a SIGCHLD woke is acted on
    # only after the next poll, which nothing else wakes.
    noted: list[int] = []
    supervisord.options.signal_receiver = types.SimpleNamespace(_signals_recvd=noted)
    dispatcher = supervisord_wakeup.install(supervisord)
    pending(dispatcher)
    assert dispatcher.readable() and pending(dispatcher) == b""  # nothing noted: the poll waits
    noted.append(signal.SIGTERM)
    assert dispatcher.readable() and pending(dispatcher) == b"\0"
    noted.clear()
    del supervisord.options.signal_receiver  # another supervisord: never broken, only slower
    assert dispatcher.readable() and pending(dispatcher) == b""


def test_asked_right_after_its_read_event_it_wakes_nothing_the_turn_still_acts_on(supervisord):
    # supervisord asks `readable` after a read event, before it acts on the signal or the group in turn: a
    # wake then would only cost an empty turn; asked again before the poll, it wakes what is still pending.
    noted = [signal.SIGCHLD]
    supervisord.options.signal_receiver = types.SimpleNamespace(_signals_recvd=noted)
    supervisord.stop_groups = [Group([])]
    dispatcher = supervisord_wakeup.install(supervisord)
    dispatcher.handle_read_event()
    assert dispatcher.readable() and pending(dispatcher) == b""
    assert dispatcher.readable() and pending(dispatcher) == b"\0"


class Process:
    def __init__(self, state: int, autostart: bool = False, laststart: float = 0.0) -> None:
        self.state = state
        self.config = types.SimpleNamespace(autostart=autostart)
        self.laststart = laststart

    def get_state(self) -> int:
        return self.state


@pytest.fixture
def quiet_supervisord():
    """A running supervisord stand-in with two programs and a poller that records its timeouts."""
    from supervisor.states import ProcessStates, SupervisorStates

    timeouts: list[float] = []
    programs = {"scanner": Process(ProcessStates.RUNNING), "worker-npu-vf1": Process(ProcessStates.STOPPED)}
    channels = {7: types.SimpleNamespace(delay=0)}  # supervisord's HTTP channel: `delay` while an answer is deferred
    options = types.SimpleNamespace(mood=SupervisorStates.RUNNING, signal_receiver=types.SimpleNamespace(
        _signals_recvd=[]), poller=types.SimpleNamespace(poll=lambda timeout: timeouts.append(timeout) or ([], [])),
        get_socket_map=lambda: channels)
    supervisord = types.SimpleNamespace(options=options, process_groups={
        name: types.SimpleNamespace(processes={name: process}) for name, process in programs.items()})
    supervisord_wakeup.sleep_while_quiet(supervisord)
    return supervisord, programs, timeouts


def test_settled_programs_let_the_loop_sleep_and_anything_on_its_way_brings_the_second_back(quiet_supervisord):
    from supervisor.states import ProcessStates, SupervisorStates

    supervisord, programs, timeouts = quiet_supervisord
    poll = supervisord.options.poller.poll
    assert poll(1) == ([], []) and timeouts == [supervisord_wakeup.QUIET_POLL_SECONDS]
    for state in (ProcessStates.STARTING, ProcessStates.BACKOFF, ProcessStates.STOPPING, ProcessStates.EXITED):
        programs["scanner"].state = state
        poll(1)
    programs["scanner"].state = ProcessStates.FATAL
    poll(1)
    programs["worker-npu-vf1"].config.autostart = True  # never started yet: the next turn starts it
    poll(1)
    programs["worker-npu-vf1"].laststart = 1.0
    poll(1)
    supervisord.options.signal_receiver._signals_recvd.append(signal.SIGCHLD)
    poll(1)
    supervisord.options.signal_receiver._signals_recvd.clear()
    supervisord.options.get_socket_map()[7].delay = 0.05
    poll(1)
    supervisord.options.get_socket_map()[7].delay = 0
    supervisord.options.mood = SupervisorStates.SHUTDOWN
    poll(1)
    del supervisord.process_groups  # another supervisord: its own timeout, never an error
    supervisord.options.mood = SupervisorStates.RUNNING
    poll(1)
    assert timeouts[1:] == [1, 1, 1, 1, supervisord_wakeup.QUIET_POLL_SECONDS, 1, supervisord_wakeup.QUIET_POLL_SECONDS,
                            1, 1, 1, 1]


def test_a_reload_wraps_the_poller_once_for_the_new_supervisor(quiet_supervisord):
    supervisord, _, timeouts = quiet_supervisord
    reloaded = types.SimpleNamespace(options=supervisord.options, process_groups={})  # a new Supervisor
    supervisord_wakeup.sleep_while_quiet(reloaded)
    supervisord.options.poller.poll(1)
    assert timeouts == [supervisord_wakeup.QUIET_POLL_SECONDS]
    assert supervisord.options.poller.poll.unwrapped.__name__ == "<lambda>"
