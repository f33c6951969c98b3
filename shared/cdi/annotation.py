"""The CDI annotation of an Allocate answer, and when it is given (CDI_ANNOTATION).

The annotation names the CDI device `rebellions.ai/npu=runtime`, which only the RBLN container toolkit's
spec defines. A CDI-enabled runtime (containerd 2.x by default, CRI-O) refuses to create a container
whose annotation names a device no spec resolves; a runtime without CDI ignores the annotation.
"""

from __future__ import annotations

import enum

ANNOTATION_KEY = "cdi.k8s.io/rebellions.ai_npu"
RUNTIME_DEVICE = "rebellions.ai/npu=runtime"


class CdiAnnotation(enum.Enum):
    ALWAYS = "always"
    """The original's behaviour: on every allocation."""
    WHEN_RESOLVABLE = "when-resolvable"
    """Only while a spec in the spec dirs resolves the device."""
    NEVER = "never"


def allocate_annotations(policy: CdiAnnotation, resolvable: bool) -> dict[str, str]:
    """The annotations of one container's Allocate answer."""
    if policy is CdiAnnotation.ALWAYS or (policy is CdiAnnotation.WHEN_RESOLVABLE and resolvable):
        return {ANNOTATION_KEY: RUNTIME_DEVICE}
    return {}
