"""The `rbln-smi` of a simulated node: the four commands the stack runs (docs/node.md#rbln-smi), over the
node's private state.

`bin/rbln-smi` (written by `simulator.node`) calls `main` with the node's state dir.

Commands:
    -j                      inventory; `group_id` a string, `npu` an int
    -g -j                   same schema; `npu` and `group_id` alternate between int and string
                            from one device to the next, as real tools disagree on the types
    group -d G1,G2          members go back to group 0; /dev/rsdG removed
    group -c G -a N1,N2     G >= 1 and unused; every npu listed, not in another group and not
                            a PF hosting VFs (SR-IOV takes it out of the compute topology);
                            /dev/rsdG created
Errors exit 1 with a message on stderr; a command line it does not know exits 2.

Every call records the environment it was given (`environ`); every group change records whether its
caller held the flock on the RSD lock file (`lock_held`) and whether it overlapped another group
change (`overlap`).

Faults (set by `SimulatedNode.set_smi_fault`), for the commands they are set for:
    hang       sleeps a day (or until its caller dies): longer than any timeout; nothing changes
    slow       sleeps `delay` seconds, then works (a group change keeps its overlap
               detection armed meanwhile, which widens race windows)
    exit       exits 1 with a message on stderr; nothing changes
    garbage    the command works but prints text that is not JSON
    truncated  the command works but its output is cut in half
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

from simulator import smi_state
from simulator.smi_state import CREATE, DESTROY, GROUP_CHANGES, GROUPS, INVENTORY

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms per call)
if TYPE_CHECKING:
    from typing import Any

HANG_SECONDS = 24 * 3600.0
FAULTS = ("hang", "slow", "exit", "garbage", "truncated")


class _UsageError(Exception):
    pass


class _Failure(Exception):
    """The command was understood but cannot be carried out."""


def _parse(argv: list[str]) -> tuple[str, dict[str, str]]:
    if sorted(argv) == ["-j"]:
        return INVENTORY, {}
    if sorted(argv) == ["-g", "-j"]:
        return GROUPS, {}
    if argv[:1] == ["group"] and len(argv) % 2 == 1:
        options = dict(zip(argv[1::2], argv[2::2], strict=True))
        if len(options) * 2 == len(argv) - 1:
            if options.keys() == {"-d"}:
                return DESTROY, options
            if options.keys() == {"-c", "-a"}:
                return CREATE, options
    raise _UsageError(f"unsupported arguments {' '.join(argv)!r}; "
                      "usage: rbln-smi -j | -g -j | group -d G[,G...] | group -c G -a N[,N...]")


def _visible(state: dict[str, Any]) -> list[dict[str, Any]]:
    hidden = set(state["hidden"])
    return [d for d in state["devices"] if d["entry"]["device"] not in hidden]


def _listing(state: dict[str, Any], mixed_types: bool) -> str:
    group_of = {npu: gid for gid, npus in smi_state.group_members(state).items() for npu in npus}
    devices = []
    for position, device in enumerate(_visible(state)):
        entry = dict(device["entry"])
        gid = group_of[entry["npu"]]
        entry["group_id"] = str(gid)
        if mixed_types and position % 2 == 0:
            entry["group_id"] = gid
        elif mixed_types:
            entry["npu"] = str(entry["npu"])
        devices.append(entry)
    document = {"KMD_version": state["kmd_version"], "devices": devices, "contexts": []}
    return json.dumps(document, indent=2) + "\n"


def _ids(text: str, what: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise _Failure(f"invalid {what} list {text!r}") from None


def _rsd_node(state: dict[str, Any], gid: int) -> str:
    return os.path.join(state["dev_root"], f"rsd{gid}")


def _destroy(state: dict[str, Any], groups_text: str) -> str:
    gids = _ids(groups_text, "group id")
    for gid in gids:
        if gid == 0:
            raise _Failure("group 0 is the default group and cannot be destroyed")
        if str(gid) not in state["groups"]:
            raise _Failure(f"group {gid} does not exist")
    for gid in gids:
        state["groups"].pop(str(gid), None)
        try:
            os.unlink(_rsd_node(state, gid))
        except FileNotFoundError:
            pass
    return f"Destroyed group {','.join(map(str, gids))}\n"


def _create(state: dict[str, Any], gid_text: str, npus_text: str) -> str:
    [gid] = _ids(gid_text, "group id")
    if gid < 1:
        raise _Failure(f"group id {gid} is invalid: new groups are numbered from 1 (0 is the default group)")
    if str(gid) in state["groups"]:
        raise _Failure(f"group {gid} already exists")
    npus = _ids(npus_text, "npu")
    if len(set(npus)) != len(npus):
        raise _Failure(f"npu list {npus_text!r} names a device twice")
    listed = {d["entry"]["npu"]: d for d in _visible(state)}
    group_of = {npu: int(g) for g, members in state["groups"].items() for npu in members}
    for npu in npus:
        if npu not in listed:
            raise _Failure(f"npu {npu} does not exist")
        if listed[npu]["hosts_vfs"]:
            raise _Failure(f"npu {npu} hosts VFs and is not part of the compute topology")
        if npu in group_of:
            raise _Failure(f"npu {npu} is already in group {group_of[npu]}")
    state["groups"][str(gid)] = npus
    with open(_rsd_node(state, gid), "w"):
        pass
    return f"Created group {gid} with npu {','.join(map(str, npus))}\n"


def _execute(command: str, options: dict[str, str], state_dir: str) -> tuple[int, str, str]:
    if command in (INVENTORY, GROUPS):
        return 0, _listing(smi_state.load(state_dir), mixed_types=command == GROUPS), ""
    try:
        with smi_state.update(state_dir) as state:
            if command == DESTROY:
                return 0, _destroy(state, options["-d"]), ""
            return 0, _create(state, options["-c"], options["-a"]), ""
    except _Failure as exc:
        return 1, "", f"Error: {exc}\n"


def _caller_holds_lock(lock_file: str) -> bool:
    """True when someone holds the flock on the RSD lock file; the caller is expected to."""
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except OSError:
        return False  # no lock file: nobody can hold it
    try:
        # A fresh open file description conflicts with any holder's, the caller's included.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock if it was ours
    return False


def _enter_change(state_dir: str) -> tuple[int | None, bool]:
    """(fd holding the change lock, overlap); the lock lasts until the fd is closed."""
    fd = os.open(os.path.join(state_dir, smi_state.CHANGE_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, True
    return fd, False


def _hang() -> None:
    """Sleep far longer than any caller's timeout, but not past the caller: a caller that died
    without killing us (we are reparented) must not leave us behind for a day."""
    parent, deadline = os.getppid(), time.monotonic() + HANG_SECONDS
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.5)


def _finish(state_dir: str, record: dict[str, Any], code: int, out: str, err: str) -> int:
    record.update(end=time.time(), exit=code, error=err.strip() or None)
    smi_state.append_call(state_dir, record)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


def main(argv: list[str], state_dir: str) -> int:
    record: dict[str, Any] = {"argv": argv, "pid": os.getpid(), "start": time.time(), "command": None,
                              "environ": dict(os.environ)}
    try:
        command, options = _parse(argv)
    except _UsageError as exc:
        return _finish(state_dir, record, 2, "", f"rbln-smi: {exc}\n")
    record["command"] = command
    state = smi_state.load(state_dir)
    change_fd = None
    if command in GROUP_CHANGES:
        record["lock_held"] = _caller_holds_lock(state["lock_file"])
        change_fd, record["overlap"] = _enter_change(state_dir)
    try:
        fault = state["fault"] if state["fault"] and command in state["fault"]["commands"] else None
        kind = fault["kind"] if fault else None
        record["fault"] = kind
        if kind == "hang":
            record.update(end=None, exit=None, error=None)
            smi_state.append_call(state_dir, record)
            _hang()
            return 1
        if fault is not None and kind == "slow":
            time.sleep(fault["delay"])
        if kind == "exit":
            return _finish(state_dir, record, 1, "", "rbln-smi: simulated failure: NPU driver is not responding\n")
        code, out, err = _execute(command, options, state_dir)
        if kind == "garbage":
            out = "rbln-smi: \x1b[31mwarning\x1b[0m {device table unavailable} <<<\n"
        elif kind == "truncated":
            out = out[: len(out) // 2]
        return _finish(state_dir, record, code, out, err)
    finally:
        if change_fd is not None:
            os.close(change_fd)
