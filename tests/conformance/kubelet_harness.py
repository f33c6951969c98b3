"""The real kubelet's device handling as a test fixture: the Go harness (harness/main.go) in a mount
namespace of its own, where /var/lib/kubelet/device-plugins is a private tmpfs.

The harness process owns the namespace; a stack enters it with `enter_namespace()` as a command
prefix, so the plugins and the device manager share one plugin directory that no other process
on the machine sees.
"""

from __future__ import annotations

import json
import pathlib
import queue
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
NPU, VF1, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf1", "rebellions.ai/npu-vf4"
_PRIVATE_DIR_SCRIPT = pathlib.Path(__file__).resolve().parent / "private_plugin_dir.sh"
# Every answer but "wait" comes at once; an Allocate may run an RSD group change (seconds at most).
_ANSWER_TIMEOUT = 30.0


class HarnessError(RuntimeError):
    """The harness answered {"ok": false}: a command the kubelet itself refused or failed."""


def pod(uid: str, containers: Mapping[str, Mapping[str, int]],
        init_containers: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, Any]:
    """A pod spec for the harness: container name -> resource limits, for app and init containers."""
    def specs(named: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
        return [{"name": name, "limits": dict(limits)} for name, limits in named.items()]
    return {"uid": uid, "containers": specs(containers), "initContainers": specs(init_containers or {})}


class KubeletHarness:
    def __init__(self, binary: pathlib.Path, log_path: pathlib.Path, verbosity: int = 4):
        self._command = ["unshare", "--mount", "--propagation", "private", "--",
                         "sh", str(_PRIVATE_DIR_SCRIPT), str(binary), f"-v={verbosity}"]
        self.log_path = log_path
        self._proc: subprocess.Popen | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()

    # -- the process and its namespace ------------------------------------------------------------

    def start(self, numa_nodes: int = 1, policy: str = "best-effort") -> KubeletHarness:
        with open(self.log_path, "w") as log:
            self._proc = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          text=True, bufsize=1)
        threading.Thread(target=self._read_answers, daemon=True).start()
        self.request("start", numaNodes=numa_nodes, policy=policy)
        return self

    def _read_answers(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def enter_namespace(self) -> list[str]:
        """A command prefix that runs a program in the harness's mount namespace."""
        assert self._proc is not None
        return ["nsenter", f"--mount=/proc/{self._proc.pid}/ns/mnt", "--"]

    @property
    def plugin_dir(self) -> pathlib.Path:
        """The namespace's plugin directory, seen from outside it."""
        assert self._proc is not None
        return pathlib.Path(f"/proc/{self._proc.pid}/root{PLUGIN_DIR}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        """Stop the device manager and end the process (its namespace goes with the last process in it)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            self.request("stop")
        except (HarnessError, TimeoutError, BrokenPipeError):
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    # -- commands -----------------------------------------------------------------------------------

    def request(self, cmd: str, timeout: float = _ANSWER_TIMEOUT, **fields: Any) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self._proc.stdin.flush()
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"harness gave no answer to {cmd!r} within {timeout}s; log:\n"
                               f"{self.log_tail()}") from None
        if line is None:
            raise HarnessError(f"harness exited (code {self._proc.wait()}) on {cmd!r}; log:\n{self.log_tail()}")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise HarnessError(f"{cmd}: {answer['error']}")
        return answer

    def capacity(self) -> dict[str, Any]:
        """{"capacity": {resource: n}, "allocatable": {resource: n}, "inactive": [resource],
        "allocatableDevices": {resource: {device ID: [NUMA node]}}}."""
        return self.request("capacity")

    def wait(self, resources: Mapping[str, Mapping[str, int]], timeout: float) -> dict[str, Any]:
        """Wait until every resource has the given "capacity" and/or "allocatable"; the answer is
        the capacity then, with "elapsedMs" and "sinceStartMs" (since the device manager started)."""
        return self.request("wait", timeout=timeout + _ANSWER_TIMEOUT, resources=resources,
                            timeoutMs=int(timeout * 1000))

    def wait_for_counts(self, counts: Mapping[str, int], timeout: float) -> dict[str, Any]:
        """Wait until each resource has capacity = allocatable = its count."""
        return self.wait({name: {"capacity": n, "allocatable": n} for name, n in counts.items()}, timeout)

    def hints(self, spec: dict[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """container -> resource -> the device manager's topology hints ({"numaNodes", "preferred"})."""
        return self.request("hints", pod=spec)["hints"]

    def admit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The kubelet's admission of a new pod: "admitted", "reason", "message"; when admitted also
        "affinity" (container -> the topology manager's hint) and "devices" (container -> resource -> IDs)."""
        return self.request("admit", pod=spec)

    def devices(self, pod_uid: str, container: str) -> dict[str, list[str]]:
        return self.request("devices", podUID=pod_uid, container=container)["devices"]

    def run_options(self, pod_uid: str, container: str) -> dict[str, Any]:
        """What the runtime gets: "devices" [{hostPath, containerPath, permissions}], "annotations",
        "envs", "mounts", "cdiDevices"."""
        return self.request("runOptions", podUID=pod_uid, container=container)

    def restart(self) -> None:
        """A kubelet restart: stop the device manager, start a new one on the same directory."""
        self.request("restart")
