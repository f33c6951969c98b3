"""Calls to the `rbln-smi` tool and parsing of its JSON (docs/node.md#rbln-smi).

Every call is bounded in time and in output size: a hung or babbling tool
turns into an `RblnSmiError`, never into a stuck or bloated process. The tool
runs with a minimal environment of its own (tool_environment).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import pathlib
import re
import selectors
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

SEARCH_PATHS = (
    "/usr/bin/rbln-smi",
    "/run/rbln/driver/usr/bin/rbln-smi",
    "/host/usr/bin/rbln-smi",
    "/host/driver/usr/bin/rbln-smi",
)
LIST_TIMEOUT = 5.0
GROUP_CHANGE_TIMEOUT = 10.0
MAX_OUTPUT_BYTES = 8 * 1024 * 1024
_ERROR_EXCERPT = 2048
# An npu index goes into `group -c G -a N1,N2`: a comma or a blank in it would name other devices.
_NPU_TOKEN = re.compile(r"[A-Za-z0-9_.-]{1,32}")
_MAX_NAME_IN_ERROR = 80
_MAX_VERSION_CHARS = 256
# The Kubernetes API's bound on a string attribute of a ResourceSlice device.
_MAX_ATTRIBUTE_CHARS = 64
# All of the stack's environment the tool gets: what any command-line tool expects, nothing more (its
# documentation names no variable of its own). Settings, supervisord's socket URL or an OTLP header
# token are no business of the tool's.
TOOL_ENVIRONMENT = ("PATH", "LANG", "TMPDIR")
_DEFAULTS = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class RblnSmiError(RuntimeError):
    """rbln-smi could not be run or gave an answer that cannot be used."""


class SmiCommand(enum.Enum):
    """The four uses of the tool, as metrics name them."""

    LIST = "list"
    GROUP_LIST = "group-list"
    GROUP_DESTROY = "group-destroy"
    GROUP_CREATE = "group-create"


# The commands of an RSD group change, which the workers make (the scanner only lists).
GROUP_COMMANDS = (SmiCommand.GROUP_LIST, SmiCommand.GROUP_DESTROY, SmiCommand.GROUP_CREATE)

# Told of every call: which command, its time (spawn to exit) and whether it ran and exited 0.
SmiObserver = Callable[[str, float, bool], None]


def _unobserved(_command: str, _seconds: float, _ok: bool) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class SmiDevice:
    """One entry of `rbln-smi -j` / `-g -j`, reduced to what the plugin uses."""

    device: str
    npu: int | str
    name: str
    sid: str
    bus_id: str
    numa_node: str
    group_id: int | None
    uuid: str = ""
    firmware_version: str = ""
    pci_device_id: str = ""
    """`pci.dev` as the tool prints it."""
    memory_bytes: int | None = None
    """`memory.total`; None when absent, malformed or not positive."""


@dataclasses.dataclass(frozen=True)
class SmiListing:
    devices: tuple[SmiDevice, ...]
    rejected: tuple[str, ...]
    """Why entries were left out (missing or mistyped fields), one line each."""
    kmd_version: str = ""
    """The driver's version as the tool prints it (`KMD_version`); empty when absent or not text."""


@dataclasses.dataclass(frozen=True)
class CallResult:
    returncode: int
    output: bytes
    duration: float


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], timeout: float, pass_fds: Sequence[int] = ()) -> CallResult: ...


@dataclasses.dataclass
class SmiUsage:
    """rbln-smi invocations made for one piece of work and the wall time they took (spawn to exit),
    failed and timed-out ones included: what an Allocate spent in the tool rather than in the plugin."""

    calls: int = 0
    seconds: float = 0.0

    def timing(self, runner: Runner) -> Runner:
        """`runner`, adding each call it makes to this usage."""

        def timed(argv: Sequence[str], timeout: float, pass_fds: Sequence[int] = ()) -> CallResult:
            started = time.monotonic()
            try:
                return runner(argv, timeout, pass_fds)
            finally:
                self.calls += 1
                self.seconds += time.monotonic() - started

        return timed


def _excerpt(output: bytes) -> str:
    text = output.decode("utf-8", "replace").strip()
    if len(text) <= _ERROR_EXCERPT:
        return text
    half = _ERROR_EXCERPT // 2
    return f"{text[:half]} … {text[-half:]}"


def tool_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment rbln-smi runs with: TOOL_ENVIRONMENT's variables from `environ`, PATH and LANG
    defaulted when missing."""
    return {**_DEFAULTS, **{name: environ[name] for name in TOOL_ENVIRONMENT if name in environ}}


def run_bounded(argv: Sequence[str], timeout: float, pass_fds: Sequence[int] = (),
                environ: Mapping[str, str] | None = None) -> CallResult:
    """Run `argv` with stdout and stderr combined; kill it past `timeout` or MAX_OUTPUT_BYTES.

    `pass_fds` are inherited by the tool (every other descriptor is closed in it); its environment is
    tool_environment(`environ`, by default this process's)."""
    started = time.monotonic()
    env = tool_environment(os.environ if environ is None else environ)
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, close_fds=True, pass_fds=tuple(pass_fds),
                                start_new_session=True, env=env)
    except OSError as exc:
        raise RblnSmiError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    output = proc.stdout
    assert output is not None, "stdout is a pipe"
    chunks: list[bytes] = []
    size = 0
    deadline = started + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(output, selectors.EVENT_READ)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RblnSmiError(f"{' '.join(argv)} timed out after {timeout:g}s")
                if not selector.select(remaining):
                    continue
                chunk = os.read(output.fileno(), 65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_OUTPUT_BYTES:
                    raise RblnSmiError(f"{' '.join(argv)} printed more than {MAX_OUTPUT_BYTES} bytes")
                chunks.append(chunk)
            returncode = proc.wait(max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            raise RblnSmiError(f"{' '.join(argv)} timed out after {timeout:g}s") from None
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            output.close()
    return CallResult(returncode, b"".join(chunks), time.monotonic() - started)


def _kill_group(proc: subprocess.Popen) -> None:
    # start_new_session made the tool a group leader: its own children die with it.
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()


def locate(configured: pathlib.Path | None, search_path: str | None = None) -> pathlib.Path:
    """The rbln-smi binary: the configured one, else the driver locations, else PATH."""
    if configured is not None:
        if not (configured.is_file() and os.access(configured, os.X_OK)):
            raise RblnSmiError(f"rbln-smi at {configured} is not an executable file")
        return configured
    for candidate in SEARCH_PATHS:
        path = pathlib.Path(candidate)
        if path.is_file() and os.access(path, os.X_OK):
            return path
    found = shutil.which("rbln-smi", path=search_path if search_path is not None else os.environ.get("PATH"))
    if found:
        return pathlib.Path(found)
    raise RblnSmiError(f"rbln-smi not found in {', '.join(SEARCH_PATHS)} or PATH")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _parse_device(entry: Any) -> SmiDevice:
    if not isinstance(entry, dict):
        raise ValueError("entry is not an object")
    device = entry.get("device")
    if not isinstance(device, str) or not device:
        raise ValueError("missing 'device' name")
    named = device[:_MAX_NAME_IN_ERROR]  # a reason is logged: a hostile name must not make it huge
    npu = entry.get("npu")
    if isinstance(npu, bool) or not ((isinstance(npu, int) and npu >= 0)
                                     or (isinstance(npu, str) and _NPU_TOKEN.fullmatch(npu))):
        raise ValueError(f"{named}: 'npu' must be a non-negative integer or a plain token")
    pci = entry.get("pci") or {}
    if not isinstance(pci, dict):
        raise ValueError(f"{named}: 'pci' is not an object")
    bus_id = pci.get("bus_id")
    if not isinstance(bus_id, str):
        raise ValueError(f"{named}: missing 'pci.bus_id'")
    group_raw = entry.get("group_id")
    group_id: int | None = None
    if group_raw is not None and group_raw != "":
        try:
            group_id = int(group_raw)
        except (TypeError, ValueError):
            shown = str(group_raw)[:_MAX_NAME_IN_ERROR]
            raise ValueError(f"{named}: 'group_id' {shown!r} is not an integer") from None
    return SmiDevice(device=device, npu=npu, name=_text(entry.get("name")), sid=_text(entry.get("sid")),
                     bus_id=bus_id, numa_node=_text(pci.get("numa_node")), group_id=group_id,
                     uuid=_short_text(entry.get("uuid")), firmware_version=_short_text(entry.get("fw_ver")),
                     pci_device_id=_short_text(pci.get("dev")), memory_bytes=_memory_bytes(entry.get("memory")))


def _short_text(value: Any) -> str:
    """An identity string published as a DRA attribute (at most 64 characters there): anything longer or not
    text is no value."""
    return value.strip() if isinstance(value, str) and len(value.strip()) <= _MAX_ATTRIBUTE_CHARS else ""


def _memory_bytes(memory: Any) -> int | None:
    total = memory.get("total") if isinstance(memory, dict) else None
    try:
        value = int(str(total).strip())
    except ValueError:
        return None
    return value if 0 < value < 2**62 else None


def parse_listing(output: bytes) -> SmiListing:
    """Parse `rbln-smi -j` / `-g -j` output; entries that cannot be used are listed in `rejected`."""
    try:
        document = json.loads(output)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise RblnSmiError(f"rbln-smi printed invalid JSON: {exc}: {_excerpt(output)}") from None
    if not isinstance(document, dict) or not isinstance(document.get("devices", []), list):
        raise RblnSmiError("rbln-smi JSON has no 'devices' list")
    devices, rejected = [], []
    for entry in document.get("devices") or []:
        try:
            devices.append(_parse_device(entry))
        except ValueError as exc:
            rejected.append(str(exc))
    kmd_version = document.get("KMD_version")
    # Cut short, a version would read as another one: one too long for a label is no version.
    if not isinstance(kmd_version, str) or len(kmd_version) > _MAX_VERSION_CHARS:
        kmd_version = ""
    return SmiListing(tuple(devices), tuple(rejected), kmd_version.strip())


class RblnSmi:
    """The four rbln-smi commands the plugin uses. The binary is located on every call,
    so a tool that appears (or disappears) after start-up is picked up."""

    def __init__(self, configured: pathlib.Path | None, runner: Runner = run_bounded,
                 list_timeout: float = LIST_TIMEOUT, change_timeout: float = GROUP_CHANGE_TIMEOUT,
                 observe: SmiObserver = _unobserved):
        self._configured = configured
        self._runner = runner
        self._list_timeout = list_timeout
        self._change_timeout = change_timeout
        self._observe = observe

    def counted(self, usage: SmiUsage) -> RblnSmi:
        """The same tool, its calls added to `usage` (one per piece of work: usage is not locked)."""
        return RblnSmi(self._configured, usage.timing(self._runner), self._list_timeout, self._change_timeout,
                       self._observe)

    def _call(self, command: SmiCommand, args: Sequence[str], timeout: float, pass_fds: Sequence[int] = ()) -> bytes:
        started = time.monotonic()
        ok = False
        try:
            binary = locate(self._configured)
            result = self._runner([str(binary), *args], timeout, pass_fds)
            ok = result.returncode == 0
        finally:
            self._observe(command.value, time.monotonic() - started, ok)
        if not ok:
            raise RblnSmiError(f"rbln-smi {' '.join(args)} exited with status {result.returncode}: "
                               f"{_excerpt(result.output)}")
        return result.output

    def inventory(self) -> SmiListing:
        return parse_listing(self._call(SmiCommand.LIST, ["-j"], self._list_timeout))

    def groups(self) -> SmiListing:
        return parse_listing(self._call(SmiCommand.GROUP_LIST, ["-g", "-j"], self._list_timeout))

    # A group change inherits `lock_fd`, the caller's descriptor of the RSD flock: if the
    # caller dies mid-change (the tool runs in a session of its own and outlives it), the
    # lock stays held until the change itself has ended, so no other process can start a
    # change that overlaps the orphaned one.

    def destroy_groups(self, group_ids: Sequence[int], lock_fd: int | None = None) -> None:
        self._change(SmiCommand.GROUP_DESTROY, ["group", "-d", ",".join(str(g) for g in group_ids)], lock_fd)

    def create_group(self, group_id: int, npus: Sequence[int | str], lock_fd: int | None = None) -> None:
        self._change(SmiCommand.GROUP_CREATE, ["group", "-c", str(group_id), "-a", ",".join(str(n) for n in npus)],
                     lock_fd)

    def _change(self, command: SmiCommand, args: Sequence[str], lock_fd: int | None) -> None:
        self._call(command, args, self._change_timeout, () if lock_fd is None else (lock_fd,))
