"""Node Feature Discovery's own programs, as the NFD checks run them (tests/nfd/run.sh builds them).

- nfd-worker (`NFD_WORKER`): the real worker, one-shot and without publishing, in a mount namespace
  where a given directory is NFD's feature directory; what it would publish is read from its log.
- nfd-rules (`NFD_RULES`, tests/nfd/harness): NFD's NodeFeatureRule matcher over the features NFD's pci
  source finds in a sysfs tree.
- `NFD_CRDS`: NFD's CRD manifest (deployment/base/nfd-crds of the same module, in Go's module cache).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile

import yaml

HERE = pathlib.Path(__file__).resolve().parent
WITH_FEATURES_DIR = HERE / "with_features_dir.sh"
RUN_TIMEOUT = 60.0
# The worker builds a Kubernetes client before it knows it will not publish; this one is never called
# (nothing listens on the discard port of loopback, and -no-publish makes no request).
_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""
_COMPLETED = '"feature discovery completed" labels=<'


def binary(variable: str) -> str:
    path = os.environ.get(variable, "")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(f"{variable} is not set to an executable: run the NFD checks with tests/nfd/run.sh")
    return path


def worker_labels(features_dir: pathlib.Path) -> dict[str, str]:
    """The labels nfd-worker (local source only) would publish for `features_dir`."""
    with tempfile.TemporaryDirectory(prefix="rbln-nfd-") as scratch:
        kubeconfig = pathlib.Path(scratch) / "kubeconfig"
        kubeconfig.write_text(_KUBECONFIG)
        namespace_scratch = pathlib.Path(scratch) / "ns"
        namespace_scratch.mkdir()
        done = subprocess.run(
            ["unshare", "--mount", "sh", str(WITH_FEATURES_DIR), str(namespace_scratch), str(features_dir),
             binary("NFD_WORKER"), "-oneshot", "-no-publish", "-kubeconfig", str(kubeconfig), "-config", "/dev/null",
             "-feature-sources=local", "-label-sources=local", "-v=1"],
            capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    assert done.returncode == 0, f"nfd-worker failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return parse_worker_log(done.stderr)


def parse_worker_log(log: str) -> dict[str, str]:
    """The labels of the last `feature discovery completed` record (klog prints them as a YAML block)."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.endswith(_COMPLETED)]
    assert starts, f"nfd-worker logged no labels:\n{log[-4000:]}"
    block = []
    for line in lines[starts[-1] + 1:]:
        if line.strip() == ">":
            break
        block.append(line.removeprefix("\t"))
    labels = yaml.safe_load("\n".join(block)) or {}
    assert isinstance(labels, dict), block
    return {str(k): str(v) for k, v in labels.items()}


def rule_labels(sysfs_root: pathlib.Path, rules: pathlib.Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(labels the NodeFeatureRules of `rules` set, PCI devices NFD found) for the node of `sysfs_root`."""
    done = subprocess.run([binary("NFD_RULES"), "-sysfs", str(sysfs_root), "-rules", str(rules)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    assert done.returncode == 0, f"nfd-rules failed ({done.returncode}):\n{done.stderr[-4000:]}"
    answer = json.loads(done.stdout)
    return answer["labels"], answer["features"]["pci.device"]


def _crds_path() -> pathlib.Path:
    path = os.environ.get("NFD_CRDS", "")
    if not path or not os.path.isfile(path):
        raise RuntimeError("NFD_CRDS is not set to NFD's CRD manifest: run the NFD checks with tests/nfd/run.sh")
    return pathlib.Path(path)


def crds() -> list[dict]:
    with _crds_path().open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def nfd_module_dir() -> pathlib.Path:
    """The pinned NFD module in Go's module cache (NFD_CRDS is its deployment/base/nfd-crds/nfd-api-crds.yaml)."""
    return _crds_path().parents[3]
