#!/usr/bin/env python3
"""Checks on rendered manifests that schema validation cannot make.

kubernetes-validate checks every object against the OpenAPI schema of a Kubernetes
release: field names and types. The API server also rejects objects for reasons no
schema states (a mount naming a volume that does not exist, two mounts at one path,
duplicate names, a selector that does not match the template's labels). This module
makes those checks for the kinds this project ships (DaemonSet, Pod), plus the
device plugin's own rules: a DaemonSet update never surges in device plugin mode, and in DRA mode surges only
with sockets named by the pod's UID (POD_UID from the downward API), NPUs are requested
as whole numbers under `limits`, and a PodMonitor or NetworkPolicy selects the pods of a
DaemonSet of the same render by labels they have and port names their container declares (and a
NetworkPolicy's every rule has a source). A NodeFeatureRule (Node Feature Discovery) is
cluster-scoped, sets only valid labels, matches on something, and gives a DaemonSet of the same
render its nodeSelector.
A DaemonSet in DRA mode (RESOURCE_API=dra) gets a service account token and exactly the RBAC worker-dra
needs, bound to its service account, and a ValidatingAdmissionPolicy that limits that account's ResourceSlice
writes to its own node; in device plugin mode no token and no RBAC. A DeviceClass selects
devices of the driver npu.rebellions.ai and names one of the device plugin's resource names.

Objects of a custom resource are checked against the schema of its CRD when the CRD
manifest is given (`--crds`, e.g. NFD's): unknown fields are refused, as the API
server's strict field validation refuses them.

    python deploy/manifest_checks.py [--crds CRDS.yaml] FILE.yaml...    # prints each problem; exit 1 if any
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import yaml

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A label key (optional DNS prefix, then a name) and value, as apimachinery validates them.
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
NPU_RESOURCE_PREFIX = "rebellions.ai/"


def _duplicates(values: Iterable[Any]) -> list[Any]:
    return sorted(value for value, count in Counter(values).items() if count > 1)


def _pod_spec_problems(where: str, spec: dict[str, Any]) -> Iterator[str]:
    volumes = spec.get("volumes") or []
    volume_names = [volume.get("name", "") for volume in volumes]
    for name in _duplicates(volume_names):
        yield f"{where}: volume name {name!r} is used twice"
    for volume in volumes:
        name = volume.get("name", "")
        if not DNS1123_LABEL.match(name) or len(name) > 63:
            yield f"{where}: volume name {name!r} is not a DNS-1123 label"
        host_path = (volume.get("hostPath") or {}).get("path")
        if host_path is not None and not str(host_path).startswith("/"):
            yield f"{where}: hostPath {host_path!r} of volume {name!r} is not absolute"
    containers = [("container", c) for c in spec.get("containers") or []]
    containers += [("initContainer", c) for c in spec.get("initContainers") or []]
    if not spec.get("containers"):
        yield f"{where}: no containers"
    for name in _duplicates(c.get("name") for _, c in containers):
        yield f"{where}: container name {name!r} is used twice"
    for kind, container in containers:
        here = f"{where} {kind} {container.get('name')!r}"
        mounts = container.get("volumeMounts") or []
        for mount in mounts:
            if mount.get("name") not in volume_names:
                yield f"{here}: volumeMount {mount.get('name')!r} names no volume of the pod"
            if not str(mount.get("mountPath", "")).startswith("/"):
                yield f"{here}: mountPath {mount.get('mountPath')!r} is not absolute"
        for path in _duplicates(mount.get("mountPath") for mount in mounts):
            yield f"{here}: two volumeMounts at {path!r}"
        for env_name in _duplicates(env.get("name") for env in container.get("env") or []):
            yield f"{here}: environment variable {env_name!r} is set twice"
        ports = container.get("ports") or []
        for port in _duplicates(port.get("containerPort") for port in ports):
            yield f"{here}: containerPort {port} is declared twice"
        for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
            grpc = (container.get(probe_name) or {}).get("grpc")
            if grpc is not None and not (isinstance(grpc.get("port"), int) and 1 <= grpc["port"] <= 65535):
                yield f"{here}: {probe_name}.grpc.port {grpc.get('port')!r} is not a port number"
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        for resource in sorted(set(limits) | set(requests)):
            if not resource.startswith(NPU_RESOURCE_PREFIX):
                continue
            if resource not in limits:
                yield f"{here}: {resource} is requested but has no limit (extended resources need one)"
                continue
            if not isinstance(limits[resource], int) or limits[resource] < 1:
                yield f"{here}: {resource} limit {limits[resource]!r} is not a positive whole number"
            if resource in requests and str(requests[resource]) != str(limits[resource]):
                yield f"{here}: {resource} request differs from its limit (no overcommit for extended resources)"


def _daemonset_problems(where: str, daemonset: dict[str, Any]) -> Iterator[str]:
    spec = daemonset.get("spec") or {}
    template = spec.get("template") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not selector:
        yield f"{where}: spec.selector.matchLabels is empty"
    for key, value in selector.items():
        if labels.get(key) != value:
            yield f"{where}: selector {key}={value} does not match the pod template's labels"
    strategy = spec.get("updateStrategy") or {}
    rolling = strategy.get("rollingUpdate") or {}
    surges = str(rolling.get("maxSurge", 0)) not in ("0", "0%")
    if surges and _env(daemonset, "RESOURCE_API") != "dra":
        yield (f"{where}: rollingUpdate.maxSurge is {rolling['maxSurge']!r}; a device plugin must not run twice "
               "on a node")
    if surges and _env_field(daemonset, "POD_UID") != "metadata.uid":
        yield (f"{where}: rollingUpdate.maxSurge is {rolling['maxSurge']!r} but POD_UID is not the pod's "
               "metadata.uid: two DRA instances on a node would share socket names")
    yield from _pod_spec_problems(where, template.get("spec") or {})


def _selected(where: str, field: str, spec: dict[str, Any],
              templates: list[dict[str, Any]]) -> tuple[list[str], set[str]]:
    """Problems of the selector `field` of `spec` if it selects no pod template of the render, and the port
    names the selected containers declare."""
    selector = (spec.get(field) or {}).get("matchLabels") or {}
    selected = [t for t in templates if selector and selector.items() <= ((t.get("metadata") or {}).get("labels")
                                                                          or {}).items()]
    found = [] if selected else [f"{where}: spec.{field}.matchLabels {selector} selects no pod template of this "
                                 "render"]
    ports = {port.get("name") for template in selected for container in (template.get("spec") or {}).get("containers")
             or [] for port in container.get("ports") or []}
    return found, ports


def _pod_monitor_problems(where: str, monitor: dict[str, Any], templates: list[dict[str, Any]]) -> Iterator[str]:
    """A PodMonitor that selects no pod of the render, or names a port no selected container has, scrapes nothing."""
    spec = monitor.get("spec") or {}
    found, ports = _selected(where, "selector", spec, templates)
    yield from found
    for endpoint in spec.get("podMetricsEndpoints") or []:
        if endpoint.get("port") not in ports:
            yield f"{where}: podMetricsEndpoints port {endpoint.get('port')!r} is no port of the selected containers"


def _network_policy_problems(where: str, policy: dict[str, Any], templates: list[dict[str, Any]]) -> Iterator[str]:
    """A NetworkPolicy must select the render's pods, name ports their container declares, and give every
    rule a source: a rule without `from` admits everyone."""
    spec = policy.get("spec") or {}
    found, ports = _selected(where, "podSelector", spec, templates)
    yield from found
    for index, rule in enumerate(spec.get("ingress") or []):
        if not rule.get("from"):
            yield f"{where}: ingress rule {index} has no `from` and admits every source"
        for port in rule.get("ports") or []:
            if isinstance(port.get("port"), str) and port["port"] not in ports:
                yield f"{where}: ingress port {port['port']!r} is no port of the selected containers"


def _label_problems(where: str, labels: dict[str, Any]) -> Iterator[str]:
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if not name or not LABEL_NAME.match(name) or (prefix and (len(prefix) > 253
                                                                  or not DNS1123_SUBDOMAIN.match(prefix))):
            yield f"{where}: label key {key!r} is not a qualified name"
        if not isinstance(value, str) or len(value) > 63 or not LABEL_NAME.match(value):
            yield f"{where}: label {key} has the value {value!r}, not a label value"


def _node_feature_rule_problems(where: str, rule: dict[str, Any], daemonsets: list[dict[str, Any]]) -> Iterator[str]:
    metadata = rule.get("metadata") or {}
    if "namespace" in metadata:
        yield f"{where}: a NodeFeatureRule is cluster-scoped; metadata.namespace has no place in it"
    name = str(metadata.get("name", ""))
    if len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        yield f"{where}: name {name!r} is not a DNS-1123 subdomain"
    labels: dict[str, Any] = {}
    for index, entry in enumerate((rule.get("spec") or {}).get("rules") or []):
        here = f"{where} rule {entry.get('name', index)!r}"
        if not entry.get("matchFeatures") and not entry.get("matchAny"):
            yield f"{here}: matches on nothing (no matchFeatures, no matchAny): it would label every node"
        yield from _label_problems(here, entry.get("labels") or {})
        labels.update(entry.get("labels") or {})
    for daemonset in daemonsets:
        selector = ((daemonset.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
        if not selector.items() <= labels.items():
            yield (f"{where}: its labels {labels} do not meet the nodeSelector {selector} of DaemonSet/"
                   f"{(daemonset.get('metadata') or {}).get('name')}")


def _strict_schema(schema: Any) -> Any:
    """An openAPIV3Schema as JSON Schema that refuses unknown fields (the API server's strict field validation),
    except where the schema keeps them (x-kubernetes-preserve-unknown-fields, additionalProperties)."""
    if not isinstance(schema, dict):
        return schema
    strict = {key: value for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    if "properties" in schema:
        strict["properties"] = {name: _strict_schema(value) for name, value in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            strict["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            strict[key] = _strict_schema(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            strict[key] = [_strict_schema(branch) for branch in schema[key]]
    return strict


def crd_problems(where: str, document: dict[str, Any], crds: Iterable[dict[str, Any]]) -> Iterator[str]:
    """`document` against the schema of the served version of its CRD; nothing when no CRD defines its kind."""
    import jsonschema  # only for --crds: a dependency of kubernetes-validate, which validate.sh installs

    group, _, version = str(document.get("apiVersion", "")).rpartition("/")
    for crd in crds:
        spec = crd.get("spec") or {}
        if spec.get("group") != group or (spec.get("names") or {}).get("kind") != document.get("kind"):
            continue
        if spec.get("scope") == "Cluster" and "namespace" in (document.get("metadata") or {}):
            yield f"{where}: {document.get('kind')} is cluster-scoped but has a namespace"
        served = [v for v in spec.get("versions") or [] if v.get("name") == version and v.get("served")]
        if not served:
            yield f"{where}: the CRD serves no version {version!r} of {document.get('kind')}"
            return
        schema = _strict_schema(served[0]["schema"]["openAPIV3Schema"])
        for error in sorted(jsonschema.Draft7Validator(schema).iter_errors(document), key=str):
            yield f"{where}: {'.'.join(map(str, error.absolute_path)) or '(object)'}: {error.message}"
        return


DRA_DRIVER = "npu.rebellions.ai"
# What worker-dra may do, and nothing more: (apiGroup, resource) -> verbs.
DRA_RULES = {("resource.k8s.io", "resourceclaims"): {"get"},
             # status.devices of a prepared claim: its node's token only (the synthetic subresource of 1.36+).
             ("resource.k8s.io", "resourceclaims/status"): {"patch"},
             ("resource.k8s.io", "resourceclaims/driver"): {"associated-node:patch"},
             ("resource.k8s.io", "resourceslices"): {"list", "watch", "create", "update", "delete"},
             ("", "nodes"): {"get"}}


def _env_entry(daemonset: dict[str, Any], name: str) -> dict[str, Any]:
    """The first container's entry for the variable `name`; empty when no container sets it."""
    containers = (((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    for container in containers:
        for entry in container.get("env") or []:
            if entry.get("name") == name:
                return entry
    return {}


def _env(daemonset: dict[str, Any], name: str) -> str | None:
    return _env_entry(daemonset, name).get("value")


def _env_field(daemonset: dict[str, Any], name: str) -> str | None:
    """The downward-API field path the variable `name` is set from."""
    return ((_env_entry(daemonset, name).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")


def _granted(documents: list[dict[str, Any]], namespace: str, account: str) -> dict[tuple[str, str], set[str]]:
    """The (apiGroup, resource) -> verbs ClusterRoles of the render grant the service account."""
    roles = {(doc.get("metadata") or {}).get("name"): doc for doc in documents if doc.get("kind") == "ClusterRole"}
    granted: dict[tuple[str, str], set[str]] = {}
    for binding in (doc for doc in documents if doc.get("kind") == "ClusterRoleBinding"):
        subjects = binding.get("subjects") or []
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace") == namespace
                   for s in subjects):
            continue
        role = roles.get((binding.get("roleRef") or {}).get("name")) or {}
        for rule in role.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    granted.setdefault((group, resource), set()).update(rule.get("verbs") or [])
    return granted


def _resource_api_problems(where: str, daemonset: dict[str, Any], documents: list[dict[str, Any]]) -> Iterator[str]:
    pod = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    dra = _env(daemonset, "RESOURCE_API") == "dra"
    namespace = (daemonset.get("metadata") or {}).get("namespace") or ""
    granted = _granted(documents, namespace, pod.get("serviceAccountName") or "default")
    if dra and pod.get("automountServiceAccountToken") is not True:
        yield f"{where}: RESOURCE_API=dra needs the service account token, but it is not mounted"
    if dra and granted != DRA_RULES:
        yield f"{where}: RESOURCE_API=dra grants {sorted(granted.items())}, not exactly worker-dra's {DRA_RULES}"
    user = f"system:serviceaccount:{namespace}:{pod.get('serviceAccountName') or 'default'}"
    if dra and not _node_policy_for(documents, user):
        yield (f"{where}: RESOURCE_API=dra, but no ValidatingAdmissionPolicy (bound with Deny) limits {user} to "
               "its own node's ResourceSlices")
    if not dra and granted:
        yield f"{where}: the device plugin calls no API, yet its service account is granted {sorted(granted)}"


def _node_policy_for(documents: list[dict[str, Any]], user: str) -> bool:
    """Whether the render holds a ValidatingAdmissionPolicy, bound with Deny, on resourceslices writes of `user`
    that compares the slice's node with the token's node name."""
    bound = {(doc.get("spec") or {}).get("policyName") for doc in documents
             if doc.get("kind") == "ValidatingAdmissionPolicyBinding"
             and "Deny" in ((doc.get("spec") or {}).get("validationActions") or [])}
    for policy in (doc for doc in documents if doc.get("kind") == "ValidatingAdmissionPolicy"):
        spec = policy.get("spec") or {}
        rules = (spec.get("matchConstraints") or {}).get("resourceRules") or []
        text = repr(spec)
        if ((policy.get("metadata") or {}).get("name") in bound
                and any("resourceslices" in (r.get("resources") or []) for r in rules)
                and f'"{user}"' in text and "authentication.kubernetes.io/node-name" in text and "nodeName" in text):
            return True
    return False


def _device_class_problems(where: str, device_class: dict[str, Any]) -> Iterator[str]:
    spec = device_class.get("spec") or {}
    expressions = [(s.get("cel") or {}).get("expression") or "" for s in spec.get("selectors") or []]
    if not any(f'device.driver == "{DRA_DRIVER}"' in e for e in expressions):
        yield f"{where}: no selector limits the class to the driver {DRA_DRIVER}"
    resource = spec.get("extendedResourceName")
    if resource is not None and not str(resource).startswith(NPU_RESOURCE_PREFIX):
        yield f"{where}: extendedResourceName {resource!r} is not one of the device plugin's resource names"


def problems(documents: Iterable[Any], source: str = "", crds: Iterable[dict[str, Any]] = ()) -> list[str]:
    found: list[str] = []
    documents = list(documents)
    daemonsets = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "DaemonSet"]
    templates = [(doc.get("spec") or {}).get("template") or {} for doc in daemonsets]
    for document in documents:
        if not isinstance(document, dict):
            continue
        kind = document.get("kind")
        name = (document.get("metadata") or {}).get("name")
        where = f"{source}: {kind}/{name}" if source else f"{kind}/{name}"
        if kind == "DaemonSet":
            found.extend(_daemonset_problems(where, document))
            found.extend(_resource_api_problems(where, document, [d for d in documents if isinstance(d, dict)]))
        elif kind == "DeviceClass":
            found.extend(_device_class_problems(where, document))
        elif kind == "Pod":
            found.extend(_pod_spec_problems(where, document.get("spec") or {}))
        elif kind == "PodMonitor":
            found.extend(_pod_monitor_problems(where, document, templates))
        elif kind == "NetworkPolicy":
            found.extend(_network_policy_problems(where, document, templates))
        elif kind == "NodeFeatureRule":
            found.extend(_node_feature_rule_problems(where, document, daemonsets))
        found.extend(crd_problems(where, document, crds))
    return found


def _load(path: str) -> list[Any]:
    with open(path, encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def main(paths: list[str]) -> int:
    crds: list[Any] = []
    if paths[:1] == ["--crds"] and len(paths) > 1:
        crds, paths = _load(paths[1]), paths[2:]
    if not paths or paths[0].startswith("-"):
        print("usage: manifest_checks.py [--crds CRDS.yaml] FILE.yaml...", file=sys.stderr)
        return 2
    failed = False
    for path in paths:
        documents = _load(path)
        found = problems(documents, path, crds)
        for problem in found:
            print(f"ERROR {problem}")
        kinds = ", ".join(f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}" for doc in documents)
        if not found:
            print(f"INFO {path}: {kinds}: no problems")
        failed = failed or bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
