"""Hostile input: every RPC of a running worker fuzzed with property-based tests, junk on the IPC sockets,
and the stack's file and network footprint.

One stack serves the whole module. Every Python process of it runs with an audit hook (a
`sitecustomize` put on its PYTHONPATH) that logs each file it opens, lists, creates, removes or
renames and each program it runs; sentinel files sit where path traversal from DEV_ROOT or SYSFS_ROOT
would land, watched with inotify (which also sees what C code opens). After every fuzzing test the
worker must still be the same process, still serve, have touched no sentinel, and every process of
the stack must have kept its reads and writes to the places the contract gives it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import queue
import shutil
import signal
import stat
import sys
import tempfile

import grpc
import inotify_simple
import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loguru import logger

from resource_worker.streams import MAX_OPEN_STREAMS
from scanner.publisher import InventoryPublisher
from shared import ipc
from shared.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from shared.resources import Resource
from shared.subscriber import InventorySubscriber
from simulator.kubelet import KubeletSimulator
from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from simulator.stack import StackProcess
from tests.support.inventory import message, record
from tests.support.node_state import await_scans, process_pid
from tests.support.ports import free_port
from tests.support.waiting import wait_until

NPU = Resource.NPU.value
PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.data_too_large])
MAX_DETAILS_CHARS = 1024
GRPC_LIMIT = 4 * 1024 * 1024  # the default largest message a gRPC server accepts
SERVICE = "/v1beta1.DevicePlugin/"

AUDIT_HOOK = '''
import json, os, sys
_log = os.open(os.path.join(os.environ["RBLN_AUDIT_DIR"], f"{os.getpid()}.jsonl"),
               os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.replace", "os.mkdir",
                     "os.rmdir", "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate", "os.utime",
                     "shutil.rmtree", "os.exec", "os.posix_spawn", "subprocess.Popen", "os.mkfifo", "os.mknod"})

def _plain(value):
    if isinstance(value, bytes):
        return os.fsdecode(value)
    return value if isinstance(value, (str, int, type(None))) else repr(value)

def _hook(event, args):
    if event in _EVENTS:
        try:
            os.write(_log, (json.dumps([event, [_plain(a) for a in args]]) + "\\n").encode())
        except Exception:
            pass

sys.addaudithook(_hook)
'''

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITE_EVENTS = {"os.remove", "os.rename", "os.replace", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.symlink",
                 "os.link", "os.truncate", "os.utime", "shutil.rmtree", "os.mkfifo", "os.mknod"}
_EXEC_EVENTS = {"os.exec", "os.posix_spawn", "subprocess.Popen"}


@dataclasses.dataclass
class Served:
    node: SimulatedNode
    kubelet: KubeletSimulator
    stack: StackProcess
    audit_dir: pathlib.Path
    sentinel_dir: pathlib.Path
    inotify: inotify_simple.INotify
    health_port: int
    worker_pid: int

    @property
    def endpoint(self) -> pathlib.Path:
        return self.node.plugin_dir / self.kubelet.resources()[NPU].endpoint


@pytest.fixture(scope="module")
def served():
    # Short: a plugin socket path must stay under 108 bytes.
    root = pathlib.Path(tempfile.mkdtemp(prefix="rbln-h-", dir="/tmp"))
    node = build_node(root / "n", NodeSpec.parse("3,1:vf4"))
    node.set_status("rbln2", 4)
    audit_dir, hook_dir, sentinel_dir = root / "audit", root / "hook", node.root / "outside"
    for directory in (audit_dir, hook_dir, sentinel_dir):
        directory.mkdir()
    (hook_dir / "sitecustomize.py").write_text(AUDIT_HOOK)
    (sentinel_dir / "secret").write_text("nobody reads this\n")
    (sentinel_dir / "status").write_text("0\n")
    watch = inotify_simple.INotify()
    watch.add_watch(sentinel_dir, inotify_simple.masks.ALL_EVENTS)
    kubelet = KubeletSimulator(node.plugin_dir)
    kubelet.start()
    port = free_port()
    inherited = {name: value for name, value in os.environ.items() if name != "TMPDIR"}  # the stack's default
    environ = {**inherited, **node.env("200ms"), "HEALTHCHECK_PORT": str(port), "RBLN_AUDIT_DIR": str(audit_dir),
               "PYTHONPATH": os.pathsep.join([str(hook_dir), str(PROJECT_ROOT)])}
    stack = StackProcess(environ).start()
    try:
        kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy", "rbln2": "Unhealthy"}, timeout=30)
        yield Served(node, kubelet, stack, audit_dir, sentinel_dir, watch, port, process_pid(node, "worker-npu"))
    finally:
        stack.stop()
        kubelet.stop()
        watch.close()
        shutil.rmtree(root, ignore_errors=True)


# What the stack may touch

def _within(path: str, roots) -> bool:
    return any(path == str(root) or path.startswith(str(root).rstrip("/") + "/") for root in roots)


def _code_roots() -> list[pathlib.Path]:
    """Where the interpreter, the installed packages and this source tree live: imports read these."""
    roots = {pathlib.Path(sys.prefix), pathlib.Path(sys.base_prefix), PROJECT_ROOT}
    roots |= {pathlib.Path(entry) for entry in sys.path if entry and "site-packages" in entry}
    return sorted(roots | {root.resolve() for root in roots})


def footprint_violations(served: Served) -> list[str]:
    """Every audited file access outside what the contract allows, one line each."""
    node = served.node
    own = [node.run_dir, node.cdi_root, node.lock_file, node.plugin_dir, node.log_dir]
    std_streams = ["/dev/stdout", "/dev/stderr", "/dev/null"]
    # The other CDI spec dir is only read: the scanner checks whether a spec there resolves the annotation.
    # The kubelet's plugin registry is only listed: the mode check looks for a live DRA plugin's registration
    # socket there, by either naming scheme (fixed, or with a pod's UID).
    readable = [node.sysfs_root, node.dev_root, *own, node.static_cdi_dir, *_code_roots(),
                served.audit_dir.parent / "hook", "/proc", *std_streams, "/dev/urandom", node.root / "plugins_registry"]
    writable = [*own, *std_streams]
    ancestors = {str(p) for root in own for p in root.parents}  # mkdir(parents=True) walks these
    runnable = {str(node.rbln_smi), sys.executable, os.path.realpath(sys.executable), "/sbin/ldconfig"}
    violations = []
    for log in sorted(served.audit_dir.glob("*.jsonl")):
        events = [json.loads(line) for line in log.read_text().splitlines()]
        for event, args in events:
            if not args or not isinstance(args[0], str):
                continue  # a descriptor, not a path
            path = os.path.normpath(os.path.join(PROJECT_ROOT, args[0]))  # the stack runs from the source tree
            if event in _EXEC_EVENTS:
                if path not in runnable:
                    violations.append(f"{log.stem}: runs {path}")
            elif event in _WRITE_EVENTS or (event == "open" and isinstance(args[2], int) and args[2] & _WRITE_FLAGS):
                if event == "os.mkdir" and path in ancestors:
                    continue
                if not _within(path, writable):
                    violations.append(f"{log.stem}: {event} writes {path}")
            elif not _within(path, readable):
                violations.append(f"{log.stem}: {event} reads {path}")
    return violations


def assert_still_serving_and_contained(served: Served) -> None:
    assert process_pid(served.node, "worker-npu") == served.worker_pid, "the worker restarted"
    response = served.kubelet.allocate(NPU, [["rbln1"]])
    assert [d.host_path for d in response.container_responses[0].devices][1:] == ["/dev/rbln1"]
    assert served.inotify.read(timeout=0) == [], "a sentinel file outside SYSFS_ROOT and DEV_ROOT was touched"
    assert footprint_violations(served) == []


# Device IDs a hostile kubelet (or anything that can reach the socket) might send

def _traversals(root: pathlib.Path) -> list[str]:
    return ["../outside/secret", "../../outside/secret", "../../../outside/secret", "../../../../outside/status",
            f"{root}/outside/secret", "/etc/passwd", "rbln0/../../outside/secret", "rbln0\x00../outside/secret",
            "\x00", "..", ".", "", "rbln0/", " rbln0", "rbln0\n", "rbln0-0", "RBLN0"]


def device_ids(node: SimulatedNode):
    plain = st.sampled_from(["rbln0", "rbln1", "rbln2", *_traversals(node.root)])
    return st.one_of(
        plain, plain, plain,
        st.text(max_size=63),
        st.text(min_size=64, max_size=300),  # longer than a device ID may be
        st.builds(lambda char, count: char * count, st.characters(exclude_categories=("Cs",)),  # UTF-8 only
                  st.integers(100_000, 1_100_000)),
    )


def id_lists(node: SimulatedNode):
    ids = device_ids(node)
    return st.one_of(st.lists(ids, max_size=8),
                     st.builds(lambda one, count: [one] * count, ids.filter(lambda i: len(i) < 100),
                               st.integers(1_000, 200_000)))


def refusal_names_the_device(details: str, device_id: str) -> bool:
    quoted = repr(device_id)
    return quoted in details or quoted[:80] + "…" in details


# The fuzzing tests

@FUZZ
@given(data=st.data())
def test_allocate_answers_every_request_with_devices_or_a_clear_bounded_error(served, data):
    requests = data.draw(st.lists(id_lists(served.node), max_size=4))
    try:
        response = served.kubelet.allocate(NPU, requests, timeout=30)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:  # gRPC's own limit on a message, before the worker
            assert api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in requests]).ByteSize() > GRPC_LIMIT
            return
        assert len(details) <= MAX_DETAILS_CHARS
        flat = [i for ids in requests for i in ids]
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            assert not requests or not all(requests) or overlap_in_part(requests)
        elif code is grpc.StatusCode.NOT_FOUND:
            unknown = next(i for i in flat if i not in ("rbln0", "rbln1", "rbln2"))
            assert refusal_names_the_device(details, unknown) and "not a device of rebellions.ai/npu" in details
        else:
            assert code is grpc.StatusCode.FAILED_PRECONDITION, (code, details)
            assert "rbln2" in flat and details == "cannot allocate unhealthy devices: rbln2 is Unhealthy (FAULT)"
        return
    assert requests and all(set(ids) <= {"rbln0", "rbln1"} for ids in requests) and all(requests)
    assert not overlap_in_part(requests)
    groups: dict[frozenset[str], str] = {}
    for ids, container in zip(requests, response.container_responses, strict=True):
        paths = [(d.container_path, d.host_path) for d in container.devices]
        assert paths[0][0] == "/dev/rsd0" and paths[0][1].startswith("/dev/rsd")
        assert paths[1:] == [(f"/dev/{i}", f"/dev/{i}") for i in sorted(set(ids))]
        assert groups.setdefault(frozenset(ids), paths[0][1]) == paths[0][1], "the same devices share a group"
    assert len(set(groups.values())) == len(groups), "different devices have different groups"


def overlap_in_part(requests) -> bool:
    """Whether two containers name a common device with different device sets."""
    sets = [frozenset(ids) for ids in requests]
    return any(a != b and a & b for a, b in itertools.combinations(sets, 2))


@FUZZ
@given(data=st.data())
def test_preferred_allocation_answers_one_valid_or_empty_response_per_container(served, data):
    containers = data.draw(st.lists(st.tuples(id_lists(served.node), id_lists(served.node),
                                              st.integers(-2**31, 2**31 - 1) | st.integers(-2, 5)), max_size=4))
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, must_include_deviceIDs=must,
                                                    allocation_size=size) for available, must, size in containers])
    with grpc.insecure_channel(f"unix://{served.endpoint}") as channel:
        try:
            response = api_pb2_grpc.DevicePluginStub(channel).GetPreferredAllocation(request, timeout=30)
        except grpc.RpcError as exc:  # only a request over gRPC's size limit may fail, and never in the worker
            assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert request.ByteSize() > GRPC_LIMIT
            return
    assert len(response.container_responses) == len(containers)
    for (available, must, size), answer in zip(containers, response.container_responses, strict=True):
        chosen = list(answer.deviceIDs)
        if chosen:
            assert len(chosen) == size and len(set(chosen)) == size
            assert set(must) <= set(chosen) <= set(available)
            assert set(chosen) <= {"rbln0", "rbln1", "rbln2"}


@FUZZ
@given(payload=st.binary(max_size=2048) | st.builds(lambda chunk, count: chunk * count, st.binary(min_size=1,
                                                                                                  max_size=8),
                                                   st.integers(10_000, 700_000)),
       method=st.sampled_from(["Allocate", "GetPreferredAllocation", "GetDevicePluginOptions", "PreStartContainer",
                               "ListAndWatch", "NoSuchMethod"]))
def test_every_method_survives_arbitrary_bytes(served, payload, method):
    allowed = {grpc.StatusCode.INTERNAL}  # gRPC's answer to a request that does not parse
    if len(payload) > GRPC_LIMIT:
        allowed.add(grpc.StatusCode.RESOURCE_EXHAUSTED)
    with grpc.insecure_channel(f"unix://{served.endpoint}") as channel:
        if method == "ListAndWatch":
            stream = channel.unary_stream(SERVICE + method)(payload, timeout=10)
            try:
                first = api_pb2.ListAndWatchResponse.FromString(next(stream))
                assert {d.ID for d in first.devices} == {"rbln0", "rbln1", "rbln2"}
            except grpc.RpcError as exc:
                assert exc.code() in allowed, exc
            finally:
                stream.cancel()
            return
        try:
            channel.unary_unary(SERVICE + method)(payload, timeout=10)
        except grpc.RpcError as exc:
            # A parsed but unusable Allocate gets one of the Allocate errors; an unknown method UNIMPLEMENTED.
            allowed |= {grpc.StatusCode.UNIMPLEMENTED} if method == "NoSuchMethod" else set()
            allowed |= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.FAILED_PRECONDITION} if method == "Allocate" else set()
            assert exc.code() in allowed, exc


@FUZZ
@given(data=st.data())
def test_pre_start_container_accepts_anything_and_does_nothing(served, data):
    ids = data.draw(id_lists(served.node))
    with grpc.insecure_channel(f"unix://{served.endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            response = stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert api_pb2.PreStartContainerRequest(devices_ids=ids).ByteSize() > GRPC_LIMIT
            return
    assert response == api_pb2.PreStartContainerResponse()


def test_a_client_opening_streams_without_end_cannot_starve_allocate(served):
    """Past the bound, a device list stream is refused with RESOURCE_EXHAUSTED; the handler threads the
    open ones hold leave room for Allocate, and a closed stream frees its place."""
    with grpc.insecure_channel(f"unix://{served.endpoint}") as channel:
        open_streams, refused = [], []
        for _ in range(4 * MAX_OPEN_STREAMS):
            stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty(), timeout=60)
            try:
                next(stream)
                open_streams.append(stream)
            except grpc.RpcError as exc:
                refused.append(exc)
        try:
            # The kubelet's own stream is one of the bound.
            assert len(open_streams) == MAX_OPEN_STREAMS - 1
            assert {exc.code() for exc in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert f"{MAX_OPEN_STREAMS} device list streams are open already for {NPU}" in refused[0].details()
            assert_still_serving_and_contained(served)
        finally:
            for stream in open_streams:
                stream.cancel()
        wait_until(lambda: served.stack.find("Refused device list stream; too many open"), 10, "the refusal record")
        stream = wait_until(lambda: _first_answer(channel), 10, "a stream to be accepted again")
        stream.cancel()
    refusal = served.stack.find("Refused device list stream; too many open")[0]
    assert refusal["level"] == "warn" and refusal["limit"] == MAX_OPEN_STREAMS and refusal["resourceName"] == NPU


def _first_answer(channel):
    """A new stream that got its first device list, or None if it was refused."""
    stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty(), timeout=60)
    try:
        next(stream)
        return stream
    except grpc.RpcError:
        return None


def test_the_worker_still_serves_and_nothing_outside_its_places_was_touched(served):
    # Checks the stack's whole life so far: after the fuzzing tests above when the module runs in order.
    assert_still_serving_and_contained(served)
    assert footprint_violations(served) == []
    assert served.stack.records and len(served.stack.records) == len(served.stack.raw_lines)


# The IPC sockets

def test_junk_on_the_scanners_snapshot_socket_is_refused_and_nothing_else_changes(served):
    node, stack = served.node, served.stack
    scanner = process_pid(node, "scanner")
    warned = len(stack.find("Ignored malformed snapshot request"))
    _, snapshot_endpoint = ipc.endpoints(node.run_dir)
    context = zmq.Context()
    try:
        junk = [[b""], [b"junk"], [ipc.SNAPSHOT_REQUEST], [ipc.SNAPSHOT_REQUEST, b"nvidia.com/gpu;"],
                [ipc.SNAPSHOT_REQUEST, NPU.encode()], [ipc.SNAPSHOT_REQUEST, ipc.topic(Resource.NPU), b"extra"],
                [ipc.SNAPSHOT_REPLY, ipc.encode(message())], [b"\xff" * 200] * 3]
        rogue = context.socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(snapshot_endpoint)
        for frames in junk:
            rogue.send_multipart(frames)
        oversized = context.socket(zmq.DEALER)  # over the request size limit: ZeroMQ drops the peer
        oversized.setsockopt(zmq.LINGER, 0)
        oversized.connect(snapshot_endpoint)
        oversized.send_multipart([ipc.SNAPSHOT_REQUEST, b"x" * 1_000_000])
        stack.wait_for_record("Ignored malformed snapshot request", count=warned + len(junk))
        assert rogue.poll(500) == 0  # no answer to junk

        honest = context.socket(zmq.DEALER)
        honest.setsockopt(zmq.LINGER, 0)
        honest.connect(snapshot_endpoint)
        honest.send_multipart([ipc.SNAPSHOT_REQUEST, ipc.topic(Resource.NPU)])
        assert honest.poll(5000)
        reply, payload = honest.recv_multipart()
        assert reply == ipc.SNAPSHOT_REPLY
        assert sorted(d.device_id for d in ipc.decode(payload).devices) == ["rbln0", "rbln1", "rbln2"]
    finally:
        context.destroy(linger=0)
    node.set_status("rbln1", 4)
    served.kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Unhealthy", "rbln2": "Unhealthy"})
    node.set_status("rbln1", 0)
    served.kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy", "rbln2": "Unhealthy"})
    assert process_pid(node, "scanner") == scanner
    assert_still_serving_and_contained(served)


# Permissions and listeners

def _stack_pids(root: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = pathlib.Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(text[text.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                continue
    pids, changed = {root}, True
    while changed:
        grown = pids | {pid for pid, parent in parents.items() if parent in pids}
        changed, pids = grown != pids, grown
    return pids


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue  # the process ended meanwhile
    return inodes


def _inet_sockets(table: str) -> list[tuple[str, int, str]]:
    """(state, local port, inode) of every socket in /proc/net/<table>."""
    rows = []
    with open(f"/proc/net/{table}") as handle:
        next(handle)
        for line in handle:
            fields = line.split()
            rows.append((fields[3], int(fields[1].rsplit(":", 1)[1], 16), fields[9]))
    return rows


def test_private_files_are_private_and_the_only_tcp_listener_is_the_health_port(served):
    node = served.node
    assert stat.S_IMODE(node.run_dir.stat().st_mode) == 0o700
    for endpoint in ipc.endpoints(node.run_dir):
        assert stat.S_IMODE(os.stat(endpoint.removeprefix("ipc://")).st_mode) == 0o600
    run_dir_sockets = [p for p in node.run_dir.iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
    assert len(run_dir_sockets) >= 3  # two IPC sockets and supervisord's
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in run_dir_sockets} == {
        p.name: "0o600" for p in run_dir_sockets}
    plugin_sockets = list(node.plugin_dir.glob("rbln-device-plugin-*.sock"))
    assert plugin_sockets and all(p.stat().st_mode & 0o022 == 0 for p in plugin_sockets)

    inodes = _socket_inodes(_stack_pids(served.stack.pid))
    listening = {port for table in ("tcp", "tcp6") for state, port, inode in _inet_sockets(table)
                 if state == "0A" and inode in inodes}
    assert listening == {served.health_port}
    assert not [row for table in ("udp", "udp6") for row in _inet_sockets(table) if row[2] in inodes]


# The worker's side of the IPC protocol, in process

def _wire_devices():
    good = msgpack.unpackb(ipc.encode(message()))["devices"][0]
    return st.lists(st.fixed_dictionaries({key: st.one_of(st.just(value), st.none(), st.integers(-2**63, 2**63 - 1),
                                                         st.text(max_size=20), st.lists(st.text(max_size=20),
                                                                                        max_size=3))
                                           for key, value in good.items()}), max_size=3)


@settings(max_examples=200, deadline=None)
@given(raw=st.one_of(
    st.binary(max_size=512),
    st.builds(lambda devices, seq, version, resource: msgpack.packb({
        "v": version, "resource": resource, "epoch": "e", "seq": seq, "scanned_at": 1, "error": None,
        "devices": devices}), _wire_devices(), st.integers(-5, 2**63 - 1), st.sampled_from([1, 1, 2, "1", None]),
        st.sampled_from([NPU, "rebellions.ai/npu-vf4", "nvidia.com/gpu", 5])),
))
def test_decode_accepts_only_well_formed_messages_and_refuses_the_rest_with_a_protocol_error(raw):
    try:
        decoded = ipc.decode(raw)
    except ipc.ProtocolError:
        return
    assert ipc.decode(ipc.encode(decoded)) == decoded  # what is accepted survives a round trip unchanged


def test_a_subscriber_keeps_its_last_good_state_through_junk_updates(short_tmp):
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    context = zmq.Context()
    publisher = InventoryPublisher(context, short_tmp)
    publisher.start()
    received: queue.Queue = queue.Queue()
    subscriber = InventorySubscriber(context, short_tmp, Resource.NPU, received.put, heartbeat_timeout=1)
    try:
        publisher.publish(message(seq=1))
        subscriber.start()
        assert received.get(timeout=10).seq == 1
        topic = ipc.topic(Resource.NPU)
        junk = [[topic, b"\xc1"], [topic, msgpack.packb({"v": 2})],
                [topic, ipc.encode(message(seq=2, resource=Resource.NPU_VF4))],
                [topic, ipc.encode(message(seq=2, devices=(record(), record())))],
                [topic, ipc.encode(message(seq=2, devices=(record("../rbln0"),)))]]
        refused = "Ignored malformed inventory message; keeping the last good state"
        wait_until(lambda: send_all(publisher, junk) and refused in warnings, 10, "the junk to be refused")
        # Oversized junk last: ZeroMQ drops the connection on it, which would hide the junk above.
        send_all(publisher, [[topic, b"\x00" * (ipc.MAX_MESSAGE_BYTES + 1)]])
        assert received.empty()
        # The oversized junk made ZeroMQ end the connection for good (a protocol error is not retried):
        # the missed heartbeat makes the subscriber start a new session, which gets the next good state.
        good = wait_until(lambda: publish_and_take(publisher, received, message(seq=2, devices=())), 15,
                          "the next good update")
        assert (good.seq, good.devices) == (2, ())
    finally:
        subscriber.stop()
        publisher.stop()
        context.term()
        logger.remove(sink)


def publish_and_take(publisher, received: queue.Queue, sent):
    publisher.publish(sent)
    try:
        return received.get(timeout=0.1)
    except queue.Empty:
        return None


def send_all(publisher, frames_list) -> bool:
    for frames in frames_list:
        publisher._pipe.send_multipart(frames)
    return True


def test_a_scanner_restart_is_seen_by_the_audit_too(served):
    """A scanner killed and restarted mid-run re-reads its node and writes nothing new outside its dirs."""
    node = served.node
    scanner = process_pid(node, "scanner")
    os.kill(scanner, signal.SIGKILL)
    wait_until(lambda: process_pid(node, "scanner") not in (None, scanner), 20, "the scanner to restart")
    await_scans(node)
    assert_still_serving_and_contained(served)
