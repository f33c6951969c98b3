"""A one-node Kubernetes cluster in this process's private namespaces (tests/cluster/namespaces.sh made
them): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet from the cluster harness
(one Go binary, the release the conformance harness pins), containerd with CDI, runc and the bridge CNI.

Who is who: every component authenticates with a static token (the apiserver's --token-auth-file); the
kubelet's is `system:node:<node>` in `system:nodes`, so the Node authorizer and NodeRestriction treat it as
on a real node. Pods reach the API at the `kubernetes` Service's ClusterIP, where the apiserver listens
itself (there is no kube-proxy). Every file of the cluster is under one work dir; the mounts are the
namespace's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

from tests.support.waiting import wait_until

NODE = "npu-node"
NODE_IP = os.environ.get("NODE_IP", "10.99.0.1")
SERVICE_IP = os.environ.get("KUBERNETES_SERVICE_IP", "10.96.0.1")
SERVICE_CIDR = "10.96.0.0/24"
POD_CIDR = "10.88.0.0/16"
APISERVER = f"https://{SERVICE_IP}:443"
# The sandbox image containerd pins: a static pause built by run.sh, imported under this name.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
START_TIMEOUT = 120.0
STOP_TIMEOUT = 15.0
CGROUPS = pathlib.Path("/sys/fs/cgroup")


class Component:
    """One process of the cluster, its output in a log file of its own."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: pathlib.Path,
                 env: Mapping[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self._log: TextIO | None = None

    def start(self) -> Component:
        self._log = open(self.log_path, "a")  # noqa: SIM115 - open as long as the process runs
        self.process = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                        stdin=subprocess.DEVNULL)
        return self

    def alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.process and self.process.returncode}):\n{self.tail()}")
        return True

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
        self.process, self._log = None, None


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _kubeconfig(path: pathlib.Path, ca: pathlib.Path, token: str, server: str = APISERVER) -> pathlib.Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


class Cluster:
    """The cluster's processes and files under `work`; `harness` is the cluster harness binary, `containerd_bin`
    the dir of containerd, its runc shim and ctr."""

    def __init__(self, work: pathlib.Path, harness: pathlib.Path, containerd_bin: pathlib.Path,
                 runc: pathlib.Path, cni_bin: pathlib.Path, kubectl: pathlib.Path):
        self.work = work
        self.harness = harness
        self.containerd_bin = containerd_bin
        self.runc = runc
        self.cni_bin = cni_bin
        self.kubectl_binary = kubectl
        self.logs = work / "logs"
        self.pki = work / "pki"
        self.components: dict[str, Component] = {}
        self.admin_kubeconfig = work / "admin.kubeconfig"
        self.containerd_socket = work / "containerd" / "containerd.sock"
        # Apart from any other kubelet's on the machine.
        self.cgroup_root = f"rbln-cluster-{os.getpid()}"

    # --- bring-up --------------------------------------------------------------------------------------

    def start_runtime(self) -> None:
        """containerd first, so that images can be imported before the kubelet looks for them."""
        for path in (self.logs, self.pki, self.work / "containerd", self.work / "cni"):
            path.mkdir(parents=True, exist_ok=True)
        self._start_containerd()

    def start(self) -> None:
        """The control plane and the kubelet, until the node is Ready."""
        tokens = self._credentials()
        self._start("etcd", [str(self.harness), "etcd", "-data-dir", str(self.work / "etcd"),
                             "-listen-client-url", "http://127.0.0.1:2379",
                             "-listen-peer-url", "http://127.0.0.1:2380"])
        self._start("kube-apiserver", [str(self.harness), "kube-apiserver", *self._apiserver_flags()])
        wait_until(lambda: self.components["kube-apiserver"].alive() and self._healthy(), START_TIMEOUT,
                   "kube-apiserver /readyz")
        for name in ("kube-controller-manager", "kube-scheduler"):
            config = _kubeconfig(self.work / f"{name}.kubeconfig", self.pki / "ca.crt", tokens[name])
            self._start(name, [str(self.harness), name, *self._flags(name, config)])
        self._start_kubelet(tokens["kubelet"])
        wait_until(lambda: self.components["kubelet"].alive() and self.node_ready(), START_TIMEOUT,
                   f"node {NODE} Ready")

    def _start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Component:
        component = Component(name, argv, self.logs, env).start()
        self.components[name] = component
        return component

    def _credentials(self) -> dict[str, str]:
        """The CA, the apiserver's serving certificate, the service account signing key and one token per
        component (written to the apiserver's token file); the admin's kubeconfig."""
        pki = self.pki
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rbln-cluster-ca",
                 "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"))
        names = ",".join([f"IP:{SERVICE_IP}", f"IP:{NODE_IP}", "IP:127.0.0.1", "DNS:kubernetes",
                          "DNS:kubernetes.default", "DNS:kubernetes.default.svc", "DNS:localhost"])
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
                 "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"))
        extensions = pki / "apiserver.ext"
        extensions.write_text(f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n")
        _openssl("x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
                 "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(extensions),
                 "-out", str(pki / "apiserver.crt"))
        _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
        users = {"admin": ("admin", "system:masters"),
                 "kube-controller-manager": ("system:kube-controller-manager", ""),
                 "kube-scheduler": ("system:kube-scheduler", ""),
                 "kubelet": (f"system:node:{NODE}", "system:nodes")}
        tokens = {name: secrets.token_hex(16) for name in users}
        (pki / "tokens.csv").write_text("".join(
            f'{tokens[name]},{user},{name},"{groups}"\n' for name, (user, groups) in users.items()))
        _kubeconfig(self.admin_kubeconfig, pki / "ca.crt", tokens["admin"])
        return tokens

    def _apiserver_flags(self) -> list[str]:
        pki = self.pki
        return ["--etcd-servers=http://127.0.0.1:2379", "--bind-address=0.0.0.0", "--secure-port=443",
                f"--advertise-address={NODE_IP}", f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true", "--anonymous-auth=false", "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false", "--profiling=false",
                f"--cert-dir={pki / 'generated'}", "--v=1"]

    def _flags(self, name: str, kubeconfig: pathlib.Path) -> list[str]:
        common = [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--profiling=false", "--v=1",
                  "--bind-address=127.0.0.1"]
        if name == "kube-scheduler":
            return common
        return [*common, "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}"]

    def _start_containerd(self) -> None:
        base = self.work / "containerd"
        (self.work / "cni" / "10-bridge.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "rbln-cluster",
            "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                                  "routes": [{"dst": "0.0.0.0/0"}]}},
                        {"type": "loopback"}]}))
        config = base / "config.toml"
        config.write_text(f"""version = 3
root = "{base / 'root'}"
state = "/run/containerd"
[grpc]
  address = "{self.containerd_socket}"
[plugins.'io.containerd.internal.v1.opt']
  path = "{base / 'opt'}"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{self.runc}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{self.cni_bin}"]
    conf_dir = "{self.work / 'cni'}"
""")
        path = f"{self.containerd_bin}:{os.environ['PATH']}"
        containerd = self._start("containerd", [str(self.containerd_bin / "containerd"), "--config", str(config)],
                                 env={"PATH": path})
        wait_until(lambda: containerd.alive() and self.containerd_socket.exists(), START_TIMEOUT,
                   "containerd's socket")

    def import_image(self, archive: pathlib.Path) -> None:
        """A docker-archive (or OCI) tarball into containerd's k8s.io namespace, where the kubelet finds it."""
        subprocess.run([str(self.containerd_bin / "ctr"), "--address", str(self.containerd_socket),
                        "-n", "k8s.io", "images", "import", str(archive)],
                       check=True, capture_output=True, timeout=300)

    def tag_image(self, source: str, target: str) -> None:
        subprocess.run([str(self.containerd_bin / "ctr"), "--address", str(self.containerd_socket),
                        "-n", "k8s.io", "images", "tag", source, target], check=True, capture_output=True, timeout=60)

    def _make_cgroup_root(self) -> None:
        """The kubelet's cgroupRoot in every cgroup v1 hierarchy: the kubelet requires it to exist. cpuset's
        takes its parent's CPUs and memory nodes (an empty cpuset admits no task)."""
        for hierarchy in CGROUPS.iterdir():
            if hierarchy.is_dir() and not hierarchy.is_symlink():
                (hierarchy / self.cgroup_root).mkdir(exist_ok=True)
                for name in ("cpuset.cpus", "cpuset.mems"):
                    if (hierarchy / name).exists():
                        (hierarchy / self.cgroup_root / name).write_text((hierarchy / name).read_text())

    def _remove_cgroup_root(self) -> None:
        """The cgroups under the kubelet's root, deepest first, once every pod's process is gone."""
        for hierarchy in CGROUPS.iterdir():
            root = hierarchy / self.cgroup_root
            if hierarchy.is_symlink() or not root.is_dir():
                continue
            for directory in sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()

    def _start_kubelet(self, token: str) -> None:
        self._make_cgroup_root()
        kubeconfig = _kubeconfig(self.work / "kubelet.kubeconfig", self.pki / "ca.crt", token)
        config = self.work / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            # cgroup v1 here.
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "cgroupRoot": f"/{self.cgroup_root}",
            "failSwapOn": False, "resolvConf": "", "readOnlyPort": 0, "address": NODE_IP,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            # A machine shared with builds: no eviction for its disk or memory.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "registerNode": True, "enableControllerAttachDetach": True,
        }))
        self._start("kubelet", [str(self.harness), "kubelet", f"--kubeconfig={kubeconfig}", f"--config={config}",
                                f"--hostname-override={NODE}", f"--node-ip={NODE_IP}",
                                "--node-labels=rebellions.ai/npu.present=true", "--v=1"],
                    env={"PATH": f"{self.containerd_bin}:{os.environ['PATH']}"})

    def restart_kubelet(self) -> None:
        kubelet = self.components["kubelet"]
        kubelet.stop()
        kubelet.start()

    def stop(self) -> None:
        """Everything this cluster started: the kubelet first, then the pods' processes and containerd's shims
        (which outlive containerd), then the rest in reverse order of start."""
        if "kubelet" in self.components:
            self.components.pop("kubelet").stop()
        self._kill_pods_and_shims()
        for name in reversed(list(self.components)):
            self.components[name].stop()
        self._remove_cgroup_root()

    def _kill_pods_and_shims(self) -> None:
        pids = set()
        for hierarchy in (CGROUPS / "pids", CGROUPS / "memory"):
            root = hierarchy / self.cgroup_root
            if root.is_dir():
                pids |= {int(pid) for procs in root.rglob("cgroup.procs") for pid in procs.read_text().split()}
        address = str(self.containerd_socket).encode()
        for entry in pathlib.Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if argv[0].endswith(b"containerd-shim-runc-v2") and address in argv:
                        pids.add(int(entry.name))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # --- the API ---------------------------------------------------------------------------------------

    def _healthy(self) -> bool:
        result = subprocess.run([str(self.kubectl_binary), f"--kubeconfig={self.admin_kubeconfig}",
                                 "--server=https://127.0.0.1:443", "get", "--raw", "/readyz"],
                                capture_output=True, text=True, timeout=30)
        return result.returncode == 0 and result.stdout.strip() == "ok"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run([str(self.kubectl_binary), f"--kubeconfig={self.admin_kubeconfig}", *args],
                                input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, *objects: Mapping[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": list(objects)}))

    def node(self) -> dict[str, Any]:
        return self.get("node", NODE)

    def node_ready(self) -> bool:
        result = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def allocatable(self) -> dict[str, str]:
        return self.node()["status"].get("allocatable", {})

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        return self.get("pods", "-n", namespace, *(["-l", selector] if selector else []))["items"]

    def events(self, namespace: str, name: str) -> Iterator[dict[str, Any]]:
        for event in self.get("events", "-n", namespace)["items"]:
            if event["involvedObject"].get("name") == name:
                yield event


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


class Stopwatch:
    """Timings of the run, printed at its end: name -> seconds (a name measured twice keeps both)."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def record(self, name: str, seconds: float) -> None:
        self.seconds.setdefault(name, []).append(seconds)

    def since(self, name: str, start: float) -> float:
        seconds = time.monotonic() - start
        self.record(name, seconds)
        return seconds

    def lines(self) -> list[str]:
        return [f"{name}: {', '.join(f'{s:.1f} s' for s in values)}" for name, values in self.seconds.items()]
