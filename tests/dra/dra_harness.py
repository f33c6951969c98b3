"""The Go DRA harness (harness/) as test fixtures: a real kube-apiserver with etcd, and the kubelet's own DRA
manager with the scheduler's allocator, driven with JSON lines like the conformance harness."""

from __future__ import annotations

import base64
import json
import pathlib
import queue
import ssl
import subprocess
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from tests.conformance.kubelet_harness import HarnessError, KubeletHarness

DRIVER = "npu.rebellions.ai"
RESOURCE_V1 = "resource.k8s.io/v1"
_READY_TIMEOUT = 120.0


class ApiServer:
    """`dra-harness apiserver`: etcd and kube-apiserver on loopback until close() ends its stdin."""

    def __init__(self, binary: pathlib.Path, state_dir: pathlib.Path, service_account: str, profiling: bool = False):
        self.state_dir = state_dir
        self._command = [str(binary), "apiserver", f"-dir={state_dir}", f"-service-account={service_account}",
                         f"-profiling={str(profiling).lower()}"]
        self._proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self.starts = 0

    @property
    def log_path(self) -> pathlib.Path:
        return self.state_dir / "apiserver.log"

    def start(self) -> ApiServer:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # A restart keeps the port, the etcd data and the credentials: clients reach the same server again.
        command = [*self._command, f"-port={urllib.parse.urlsplit(self.url).port}"] if self.info else self._command
        with open(self.log_path, "a") as log:
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          text=True)
        lines: queue.Queue[str] = queue.Queue()
        assert self._proc.stdout is not None
        threading.Thread(target=lambda: lines.put(self._proc.stdout.readline()), daemon=True).start()  # type: ignore
        try:
            line = lines.get(timeout=_READY_TIMEOUT)
        except queue.Empty:
            raise TimeoutError(f"kube-apiserver not ready within {_READY_TIMEOUT}s; see {self.log_path}") from None
        if not line:
            raise HarnessError(f"dra-harness apiserver exited ({self._proc.wait()}): {self._log_tail()}")
        self.info = json.loads(line)
        self.starts += 1
        return self

    def restart(self) -> None:
        """Stop (SIGTERM: kube-apiserver's own shutdown) and start again on the same port and data."""
        self.close()
        self.start()

    @property
    def url(self) -> str:
        return self.info.get("server", "")

    def get(self, path: str, token: str | None = None) -> Any:
        """GET `path` as the administrator (or with `token`); the answer's text."""
        return self.request("GET", path, token=token).text

    def request(self, method: str, path: str, token: str | None = None, body: Any = None) -> Any:
        """An HTTP request to the API server as the administrator, or with another bearer token."""
        with self.client(token) as client:
            return client.request(method, path, json=body)

    def client(self, token: str | None = None) -> Any:
        """An HTTP client (httpx2) of the API server, as the administrator or with another bearer token."""
        import httpx2

        config = yaml.safe_load(pathlib.Path(self.admin_kubeconfig).read_text())
        bearer = token or config["users"][0]["user"]["token"]
        return httpx2.Client(base_url=self.url, verify=self.tls_context(), timeout=60,
                             headers={"Authorization": f"Bearer {bearer}"})

    def tls_context(self) -> ssl.SSLContext:
        """A TLS context that trusts the API server's CA."""
        config = yaml.safe_load(pathlib.Path(self.admin_kubeconfig).read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
        return ssl.create_default_context(cadata=ca.decode())

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def request_counts(self, resource: str) -> dict[str, float]:
        """apiserver_request_total for `resource`, summed by verb (the API server's own count of requests)."""
        counts: dict[str, float] = {}
        for line in self.get("/metrics").splitlines():
            if line.startswith("apiserver_request_total{") and f'resource="{resource}"' in line:
                verb = line.split('verb="', 1)[1].split('"', 1)[0]
                counts[verb] = counts.get(verb, 0.0) + float(line.rsplit(" ", 1)[1])
        return counts

    def _log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def admin_kubeconfig(self) -> str:
        return self.info["kubeconfig"]

    @property
    def worker_kubeconfig(self) -> str:
        return self.info["workerKubeconfig"]

    def close(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class DraKubelet(KubeletHarness):
    """`dra-harness kubelet`: the DRA manager and plugin manager of one node, its API calls and allocator."""

    def __init__(self, binary: pathlib.Path, log_path: pathlib.Path, kubeconfig: str, node_name: str,
                 registry: pathlib.Path, state: pathlib.Path, verbosity: int = 5):
        super().__init__(binary, log_path, verbosity)
        self.binary = binary
        registry.mkdir(parents=True, exist_ok=True)
        state.mkdir(parents=True, exist_ok=True)
        self._command = [str(binary), "kubelet", f"-v={verbosity}", f"-kubeconfig={kubeconfig}",
                         f"-node={node_name}", f"-registry={registry}", f"-state={state}"]
        self.node_name = node_name

    def start_client(self) -> DraKubelet:
        """The process for its API calls and allocator only: no DRA manager runs."""
        with open(self.log_path, "w") as log:
            self._proc = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          text=True, bufsize=1)
        threading.Thread(target=self._read_answers, daemon=True).start()
        return self

    def start(self, numa_nodes: int = 1, policy: str = "") -> DraKubelet:
        """The kubelet's start: its DRA manager (loading its checkpoint) and its plugin manager."""
        self.start_client().request("start")
        return self

    def log_lines(self, message: str) -> list[str]:
        """The harness log's klog lines with this quoted message."""
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if f'"{message}"' in line]

    # -- the API server -------------------------------------------------------------------------------

    def apply(self, *objects: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self.request("apply", objects=list(objects))["objects"]

    def list(self, kind: str, api_version: str = RESOURCE_V1, namespace: str = "",
             field_selector: str = "") -> list[dict[str, Any]]:
        return self.request("list", apiVersion=api_version, kind=kind, namespace=namespace,
                            fieldSelector=field_selector)["items"]

    def delete(self, kind: str, name: str, api_version: str = RESOURCE_V1, namespace: str = "") -> None:
        self.request("delete", apiVersion=api_version, kind=kind, name=name, namespace=namespace)

    def slices(self) -> list[dict[str, Any]]:
        """This node's ResourceSlices of the driver."""
        return self.list("ResourceSlice", field_selector=f"spec.nodeName={self.node_name},spec.driver={DRIVER}")

    def published_devices(self) -> dict[str, dict[str, Any]]:
        """Device name -> device, over this node's slices of the driver."""
        return {device["name"]: device for item in self.slices() for device in item["spec"].get("devices") or ()}

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        for item in self.list("ResourceClaim", namespace=namespace, field_selector=f"metadata.name={name}"):
            return item
        raise KeyError(f"no ResourceClaim {namespace}/{name}")

    # -- the kubelet and the scheduler ----------------------------------------------------------------

    def registered(self, driver: str = DRIVER) -> bool:
        return self.request("plugin", driver=driver)["registered"]

    def allocate(self, pod: Mapping[str, Any], claims: Iterable[str] = (), ignore_allocated: bool = False
                 ) -> dict[str, Any]:
        """{"allocated": bool, "results": {claim: [{"request", "driver", "pool", "device"}]}}."""
        return self.request("allocate", pod=dict(pod), claims=list(claims), ignoreAllocated=ignore_allocated)

    def allocate_extended(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("allocateExtended", pod=dict(pod))

    def prepare(self, pod: Mapping[str, Any]) -> dict[str, list[str]]:
        """PrepareResources for the pod; container -> the CDI device IDs the runtime gets."""
        return self.request("prepare", timeout=60, pod=dict(pod))["cdiDevices"]

    def unprepare(self, pod_uid: str) -> None:
        self.request("unprepare", timeout=60, podUID=pod_uid)

    def pod_health(self, pod: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """Container -> its status.allocatedResourcesStatus, as the kubelet's next status sync would write it."""
        return self.request("podHealth", pod=dict(pod))["containers"]


def pod(name: str, namespace: str, claims: Mapping[str, str] | None = None,
        containers: Mapping[str, Iterable[str]] | None = None,
        requests: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Any]:
    """A pod as the kubelet sees it: pod claim name -> ResourceClaim name; container -> the pod claims it
    uses (default: one container "main" using every claim); container -> extended resource requests."""
    claims = dict(claims or {})
    containers = dict(containers or {"main": list(claims)})
    for name_ in requests or {}:
        containers.setdefault(name_, [])
    spec_containers = []
    for container, used in containers.items():
        entry: dict[str, Any] = {"name": container, "image": "none",
                                 "resources": {"claims": [{"name": c} for c in used]}}
        wanted = (requests or {}).get(container)
        if wanted:
            entry["resources"]["requests"] = {k: str(v) for k, v in wanted.items()}
            entry["resources"]["limits"] = dict(entry["resources"]["requests"])
        spec_containers.append(entry)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
            "spec": {"resourceClaims": [{"name": c, "resourceClaimName": n} for c, n in claims.items()],
                     "containers": spec_containers}}


def claim(name: str, namespace: str, requests: Iterable[Mapping[str, Any]],
          constraints: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    return {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": devices}}


def exactly(name: str, device_class: str, count: int = 1, selectors: Iterable[str] = (),
            tolerations: Iterable[Mapping[str, str]] = (), admin_access: bool = False) -> dict[str, Any]:
    """One request of a claim: `count` devices of a class, with CEL selectors and device taint tolerations, for
    use or (admin access) for monitoring."""
    request: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if admin_access:
        request["adminAccess"] = True
    if selectors:
        request["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if tolerations:
        request["tolerations"] = [dict(t) for t in tolerations]
    return {"name": name, "exactly": request}
