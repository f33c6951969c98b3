"""A kubelet stand-in speaking the real device plugin API (v1beta1) over unix sockets.

It copies the kubelet device manager where a plugin can tell the difference:
- Register refuses an unsupported version or a resource name that is not an extended
  resource name, with the kubelet's messages; it dials the plugin back (10 s, blocking),
  calls GetDevicePluginOptions (a failure fails Register), and only then returns.
- ListAndWatch is opened from a background thread; every message replaces the
  resource's whole device set. When the stream ends the resource is marked
  disconnected and the stream is never reopened: only a new Register recovers it.
- A new Register for a resource replaces its client and cancels the old stream; the
  old stream's end does not disconnect the new client (clients are told apart by
  identity, as the kubelet does by socket path since k/k #135437).
- restart() is a kubelet restart: the server goes, every socket in the plugin dir is
  removed (the checkpoint is kept), resources come back empty and disconnected (as
  restored from the checkpoint), and kubelet.sock is created anew.
- The PodResources API (v1: List, GetAllocatableResources, Get) is served on its own
  socket, `pod-resources/kubelet.sock` beside the plugin dir as on a real node. It
  reports the devices each successful allocate() gave a pod's containers, kept across
  restarts (as the checkpoint keeps them). A device allocated again belongs to its new
  container only: the kubelet never hands out a device in use, so the earlier pod ended.

Tests observe it through `resources()`, `registrations` and `wait_for`, which waits on a
condition signalled on every change.
"""

from __future__ import annotations

import dataclasses
import pathlib
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc

from shared.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from shared.kubelet.podresources.v1 import api_pb2 as podresources_pb2
from shared.kubelet.podresources.v1 import api_pb2_grpc as podresources_pb2_grpc
from simulator.kubelet_views import DeviceView, RegistrationRecord, ResourceView
from simulator.plugin_connection import PluginConnection
from simulator.pod_resources import Assignment, PodResourcesService, allocatable, pod_resources, reassign
from simulator.registration_rules import refusal_of

KUBELET_SOCKET = "kubelet.sock"
POD_RESOURCES_DIR = "pod-resources"
DEFAULT_NAMESPACE = "default"
CHECKPOINT = "kubelet_internal_checkpoint"
DIAL_TIMEOUT = 10.0
RPC_TIMEOUT = 10.0
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL

class _Refused(Exception):
    """Register fails with this message."""


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletSimulator):
        self._kubelet = kubelet

    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        return self._kubelet._register(request, context)


class KubeletSimulator:
    def __init__(self, plugin_dir: pathlib.Path, dial_timeout: float = DIAL_TIMEOUT,
                 pod_resources_socket: pathlib.Path | None = None):
        """`pod_resources_socket` defaults to `pod-resources/kubelet.sock` beside `plugin_dir`."""
        self.plugin_dir = pathlib.Path(plugin_dir)
        self.socket_path = self.plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = pathlib.Path(pod_resources_socket or
                                                 self.plugin_dir.parent / POD_RESOURCES_DIR / KUBELET_SOCKET)
        for path in (self.socket_path, self.pod_resources_socket):
            if len(str(path)) > _MAX_SOCKET_PATH:
                raise ValueError(f"{path} is too long for a unix socket path; use a shorter dir")
        self._dial_timeout = dial_timeout
        # Reentrant so that wait_for predicates may call resources() while the condition is held.
        self._cond = threading.Condition(threading.RLock())
        self._server: grpc.Server | None = None
        self._pod_resources_server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._generation = 0  # bumped by start and stop; a Register spanning one is refused
        self._clients: dict[str, PluginConnection] = {}
        self._views: dict[str, ResourceView] = {}
        self._registrations: list[RegistrationRecord] = []
        self._assignments: list[Assignment] = []
        self._pods_made = 0

    # Lifecycle

    def start(self) -> None:
        with self._cond:
            if self._server is not None:
                raise RuntimeError("the kubelet simulator is already running")
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            # Register blocks while dialing back (up to the dial timeout): leave room for several plugins.
            self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kubelet-sim")
            server = grpc.server(self._executor)
            api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
            server.add_insecure_port(f"unix://{self.socket_path}")
            server.start()
            self._server = server
            self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
            pod_resources = grpc.server(ThreadPoolExecutor(max_workers=2, thread_name_prefix="kubelet-sim-podres"))
            podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(
                PodResourcesService(self._pod_resources, self._allocatable), pod_resources)
            pod_resources.add_insecure_port(f"unix://{self.pod_resources_socket}")
            pod_resources.start()
            self._pod_resources_server = pod_resources
            self._generation += 1
            self._cond.notify_all()

    def stop(self) -> None:
        """Stop serving and drop every plugin connection; resources stay, disconnected."""
        with self._cond:
            server, self._server = self._server, None
            pod_resources, self._pod_resources_server = self._pod_resources_server, None
            executor, self._executor = self._executor, None
            self._generation += 1
            clients = list(self._clients.values())
            self._clients.clear()
            for name, view in self._views.items():
                self._views[name] = dataclasses.replace(view, connected=False)
            self._cond.notify_all()
        if server is not None:
            server.stop(grace=None).wait()
        if executor is not None:
            executor.shutdown(wait=False)
        if pod_resources is not None:
            pod_resources.stop(grace=None).wait()
            self.pod_resources_socket.unlink(missing_ok=True)
        for client in clients:
            client.close()
        for client in clients:
            if client.thread is not None:
                client.thread.join(timeout=RPC_TIMEOUT)

    def restart(self) -> None:
        self.stop()
        for entry in self.plugin_dir.iterdir():
            try:
                if entry.name != CHECKPOINT and stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
            except FileNotFoundError:
                pass  # a plugin removed its own socket meanwhile
        with self._cond:
            for name, view in self._views.items():
                self._views[name] = dataclasses.replace(view, devices={}, updates=0)
        self.start()

    def __enter__(self) -> KubeletSimulator:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # Observation

    @property
    def registrations(self) -> list[RegistrationRecord]:
        with self._cond:
            return list(self._registrations)

    def resources(self) -> dict[str, ResourceView]:
        with self._cond:
            return dict(self._views)

    def assignments(self) -> list[Assignment]:
        """What the PodResources API reports: the devices each container holds."""
        with self._cond:
            return list(self._assignments)

    def describe(self) -> str:
        with self._cond:
            lines = [f"serving={self._server is not None} registrations={len(self._registrations)}"]
            lines += [f"  refused {r.request.resource_name!r}: {r.error}" for r in self._registrations if r.error]
            for view in self._views.values():
                devices = ", ".join(f"{d}={v.health}{list(v.numa_nodes)}" for d, v in sorted(view.devices.items()))
                lines.append(f"  {view.name} endpoint={view.endpoint} connected={view.connected} "
                             f"updates={view.updates} devices=[{devices}]")
            return "\n".join(lines)

    def wait_for(self, predicate: Callable[[KubeletSimulator], bool], timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}; kubelet state:\n"
                                   f"{self.describe()}")

    def wait_for_devices(self, resource: str, expected: Mapping[str, str] | Callable[[ResourceView], bool],
                         timeout: float = 10.0) -> ResourceView:
        """Wait until the current ListAndWatch stream of `resource` has delivered exactly the `expected`
        id -> health map and is still open, or until `expected(view)` holds (whatever the view's
        state). Returns the view."""
        if callable(expected):
            def satisfied(view: ResourceView) -> bool:
                return expected(view)
        else:
            def satisfied(view: ResourceView) -> bool:
                return view.connected and view.updates > 0 and view.health == dict(expected)
        self.wait_for(lambda kubelet: resource in kubelet._views and satisfied(kubelet._views[resource]),
                      timeout, f"{resource} devices {expected}")
        return self.resources()[resource]

    # Calls to plugins

    def allocate(self, resource: str, container_device_lists: Iterable[Iterable[str]],
                 timeout: float = RPC_TIMEOUT, pod: str | None = None,
                 namespace: str = DEFAULT_NAMESPACE) -> api_pb2.AllocateResponse:
        """One Allocate call with one container request per list (the kubelet sends one). Raises grpc.RpcError.

        On success the devices belong to the containers `ctr-0`, `ctr-1`, ... of `pod` (default: a new
        `sim-pod-<n>`) in `namespace`, as the PodResources API then reports."""
        lists = [list(ids) for ids in container_device_lists]
        request = api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in lists])
        response = self._stub(resource).Allocate(request, timeout=timeout)
        with self._cond:
            self._pods_made += 1
            pod = pod or f"sim-pod-{self._pods_made}"
            held = [Assignment(namespace, pod, f"ctr-{index}", resource, tuple(dict.fromkeys(ids)))
                    for index, ids in enumerate(lists)]
            self._assignments = reassign(self._assignments, resource, held)
            self._cond.notify_all()
        return response

    def release(self, pod: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        """The pod ended: its devices are nobody's any more."""
        with self._cond:
            self._assignments = [a for a in self._assignments if (a.namespace, a.pod) != (namespace, pod)]
            self._cond.notify_all()

    def preferred_allocation(self, resource: str, available: Iterable[str], must_include: Iterable[str] = (),
                             size: int = 1, timeout: float = RPC_TIMEOUT) -> api_pb2.PreferredAllocationResponse:
        request = api_pb2.PreferredAllocationRequest(container_requests=[api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=list(available), must_include_deviceIDs=list(must_include), allocation_size=size)])
        return self._stub(resource).GetPreferredAllocation(request, timeout=timeout)

    def options(self, resource: str, timeout: float = RPC_TIMEOUT) -> api_pb2.DevicePluginOptions:
        return self._stub(resource).GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout)

    def end_stream(self, resource: str, timeout: float = RPC_TIMEOUT) -> None:
        """Cancel the resource's ListAndWatch like a kubelet dropping it; returns once it is disconnected."""
        with self._cond:
            client = self._client(resource)
        client.cancel_stream()
        self.wait_for(lambda kubelet: not kubelet._views[resource].connected, timeout,
                      f"ListAndWatch of {resource} to end")

    # Internals

    def _numa_nodes(self, resource: str, device: str) -> tuple[int, ...]:
        """The NUMA nodes the plugin advertised for `device`; the caller holds the lock."""
        view = self._views.get(resource)
        return view.devices[device].numa_nodes if view and device in view.devices else ()

    def _pod_resources(self) -> list[podresources_pb2.PodResources]:
        with self._cond:
            return pod_resources(self._assignments, self._numa_nodes)

    def _allocatable(self) -> list[podresources_pb2.ContainerDevices]:
        with self._cond:
            return allocatable([(name, device) for name, view in sorted(self._views.items())
                                for device in sorted(view.devices) if view.devices[device].health == "Healthy"],
                               self._numa_nodes)

    def _client(self, resource: str) -> PluginConnection:
        with self._cond:
            try:
                return self._clients[resource]
            except KeyError:
                raise LookupError(f"no device plugin is registered for {resource}") from None

    def _stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        return self._client(resource).stub

    def _register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        received = time.time()
        try:
            self._connect(request)
            error = None
        except _Refused as exc:
            error = str(exc)
        with self._cond:
            self._registrations.append(RegistrationRecord(request, received, error))
            self._cond.notify_all()
        if error is not None:
            # The kubelet returns a plain Go error, which gRPC sends as UNKNOWN.
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return api_pb2.Empty()

    def _connect(self, request: api_pb2.RegisterRequest) -> None:
        with self._cond:
            generation = self._generation
        name = request.resource_name
        refusal = refusal_of(request)
        if refusal is not None:
            raise _Refused(refusal)
        # The kubelet joins the endpoint to its socket dir: a file name in the same directory.
        client = PluginConnection(name, self.plugin_dir / request.endpoint)
        try:
            grpc.channel_ready_future(client.channel).result(timeout=self._dial_timeout)
            options = client.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=self._dial_timeout)
        except grpc.FutureTimeoutError:
            client.close()
            raise _Refused("failed to dial device plugin: context deadline exceeded") from None
        except grpc.RpcError as exc:
            client.close()
            raise _Refused(f"failed to get device plugin options: {exc.details()}") from None
        with self._cond:
            if generation != self._generation:
                client.close()
                raise _Refused("kubelet stopped while registering")
            old = self._clients.get(name)
            self._clients[name] = client
            previous = self._views.get(name)
            self._views[name] = ResourceView(
                name=name, endpoint=request.endpoint, options=options,
                devices=previous.devices if previous else {}, connected=True, updates=0,
                registrations=previous.registrations + 1 if previous else 1)
            client.thread = threading.Thread(target=self._watch, args=(client,), daemon=True,
                                             name=f"kubelet-sim-listandwatch-{name}")
            client.thread.start()  # under the lock: whoever replaces this client can join the thread
        if old is not None:
            old.close()
            # Register returns once the replaced stream is gone: nothing of it arrives later.
            if old.thread is not None:
                old.thread.join(timeout=RPC_TIMEOUT)

    def _watch(self, client: PluginConnection) -> None:
        try:
            for response in client.open_stream():
                devices = {d.ID: DeviceView(d.health, tuple(n.ID for n in d.topology.nodes))
                           for d in response.devices}
                with self._cond:
                    if self._clients.get(client.resource) is not client:
                        return
                    view = self._views[client.resource]
                    self._views[client.resource] = dataclasses.replace(view, devices=devices,
                                                                       updates=view.updates + 1)
                    self._cond.notify_all()
        except grpc.RpcError:
            pass  # cancelled by the kubelet, or the plugin went away: both end the stream
        finally:
            with self._cond:
                if self._clients.get(client.resource) is client:
                    view = self._views[client.resource]
                    self._views[client.resource] = dataclasses.replace(view, connected=False)
                    self._cond.notify_all()
