"""The node labels of NFD_FEATURE_FILE, derived from one scan: plain functions on plain data (docs/node-labels.md).

The names and values of Rebellions' NPU Feature Discovery (`npu.present`, `npu.count`, `npu.family`,
`npu.product`, `driver-version.*`), and the stack's own counts. A value that is not known, or that
Kubernetes would not take as a label value, leaves its label out: never a guess.
"""

from __future__ import annotations

import dataclasses
import re

PREFIX = "rebellions.ai/"
PRESENT = PREFIX + "npu.present"
COUNT = PREFIX + "npu.count"
FAMILY = PREFIX + "npu.family"
PRODUCT = PREFIX + "npu.product"
DRIVER_FULL = PREFIX + "driver-version.full"
DRIVER_MAJOR = PREFIX + "driver-version.major"
DRIVER_MINOR = PREFIX + "driver-version.minor"
DRIVER_PATCH = PREFIX + "driver-version.patch"
VF1_COUNT = PREFIX + "npu-vf1.count"
VF4_COUNT = PREFIX + "npu-vf4.count"
HEALTHY = PREFIX + "npu.healthy"
# Every label, in the order the file lists them.
ALL_LABELS = (PRESENT, COUNT, FAMILY, PRODUCT, DRIVER_FULL, DRIVER_MAJOR, DRIVER_MINOR, DRIVER_PATCH,
              VF1_COUNT, VF4_COUNT, HEALTHY)

# A Kubernetes label value (apimachinery's IsValidLabelValue): NFD drops any other, so it is never written.
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
# Product code prefix -> family: the rule of Rebellions' feature discovery (CA*: ATOM, CR*: REBEL).
_FAMILIES = (("CA", "ATOM"), ("CR", "REBEL"))
_PRODUCT_PREFIX = "RBLN-"
# Where a driver version's revision starts (`1.2.3-rebel1`, `1.2.3+abc`, `1.2.3~rc1`).
_REVISION_SEPARATORS = re.compile(r"[-+~]")


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What one successful scan says about the node."""

    npu_products: tuple[str, ...]
    """rbln-smi's product name of each NPU: every listed device but the PFs hosting VFs."""
    vf1_count: int
    vf4_count: int
    healthy: int
    """Devices advertised (in any resource) that are Healthy now."""
    driver_version: str
    """Raw, as the driver gives it; empty when unknown."""


@dataclasses.dataclass(frozen=True)
class DriverVersion:
    full: str
    major: str
    minor: str
    patch: str


def is_label_value(value: str) -> bool:
    return bool(_LABEL_VALUE.fullmatch(value))


def parse_driver_version(raw: str) -> DriverVersion | None:
    """As Rebellions' feature discovery reads it: the revision after the first `-`, `+` or `~` is cut off,
    and the rest must have at least three dot-separated parts (major, minor, patch); None otherwise."""
    version = _REVISION_SEPARATORS.split(raw.strip(), maxsplit=1)[0]
    parts = version.split(".")
    if len(parts) < 3:
        return None
    return DriverVersion(version, parts[0], parts[1], parts[2])


def family_of(product: str) -> str | None:
    code = product.removeprefix(_PRODUCT_PREFIX)
    for prefix, family in _FAMILIES:
        if code.startswith(prefix):
            return family
    return None


def node_product(products: tuple[str, ...]) -> str | None:
    """The product of the node's NPUs when they all are one; None for none, a mix, or a name that is no label
    value (blank, spaces, too long)."""
    names = set(products)
    if len(names) != 1:
        return None
    (name,) = names
    return name if is_label_value(name) else None


def derive_labels(facts: NodeFacts) -> dict[str, str]:
    """Every label whose value is known, in ALL_LABELS order. Without an NPU only `npu.present=false`
    (and the driver version, if known) is said, as Rebellions' feature discovery says it."""
    values: dict[str, str | None] = {PRESENT: "true" if facts.npu_products else "false"}
    if facts.npu_products:
        product = node_product(facts.npu_products)
        values.update({
            COUNT: str(len(facts.npu_products)),
            PRODUCT: product,
            FAMILY: family_of(product) if product else None,
            VF1_COUNT: str(facts.vf1_count),
            VF4_COUNT: str(facts.vf4_count),
            HEALTHY: str(facts.healthy),
        })
    version = parse_driver_version(facts.driver_version)
    if version is not None:
        values.update({DRIVER_FULL: version.full, DRIVER_MAJOR: version.major, DRIVER_MINOR: version.minor,
                       DRIVER_PATCH: version.patch})
    return {name: value for name in ALL_LABELS
            if (value := values.get(name)) is not None and is_label_value(value)}
