"""What the kubelet checks of a Register request before it dials the plugin back, with the kubelet's messages."""

from __future__ import annotations

import json
import re

from shared.kubelet.deviceplugin.v1beta1 import api_pb2

SUPPORTED_VERSIONS = ("v1beta1",)

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def is_extended_resource_name(name: str) -> bool:
    """k/k v1helper.IsExtendedResourceName: `domain/name`, not native, valid as `requests.<name>`."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = f"requests.{name}".split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    return (len(prefix) <= 253 and bool(_DNS1123_SUBDOMAIN.match(prefix))
            and len(short) <= 63 and bool(_QUALIFIED_NAME.match(short)))


def _go_quote(value: str | list[str]) -> str:
    """Go's %q of a string or a string slice, as the kubelet's messages print them."""
    return json.dumps(value, separators=(" ", ":"))



def refusal_of(request: api_pb2.RegisterRequest) -> str | None:
    """The kubelet's error for a request it refuses before dialing back; None when it goes on."""
    if request.version not in SUPPORTED_VERSIONS:
        return (f"requested API version {_go_quote(request.version)} is not supported by kubelet. "
                f"Supported versions are {_go_quote(list(SUPPORTED_VERSIONS))}")
    if not is_extended_resource_name(request.resource_name):
        return f"the ResourceName {_go_quote(request.resource_name)} is invalid"
    return None
