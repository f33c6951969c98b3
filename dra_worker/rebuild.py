"""The prepared claims as the node still shows them, for a checkpoint that could not be read
(docs/dra.md#the-checkpoint).

Each claim's CDI spec in CDI_ROOT names the claim's UID, its devices and its RSD group (none: an admin-access
claim's, whose devices need no group to be checked); rbln-smi's group listing
says whether that group still holds exactly those devices. A claim whose spec and group agree is prepared again
as far as the node goes (its name and requests come from the claim at its next Prepare, its Unprepare undoes it).
A spec that does not agree (unreadable, its group gone or holding other devices now) would give a container
devices the claim no longer has: it is removed, and that claim is prepared afresh when the kubelet asks again.
"""

from __future__ import annotations

import contextlib
import pathlib

from loguru import logger

from dra_worker import cdi
from dra_worker.checkpoint import PreparedClaim, PreparedDevice
from shared.rbln_smi import SmiListing
from shared.rsd_group import DEFAULT_GROUP


def group_members(groups: SmiListing) -> dict[int, set[str]]:
    """The devices of each RSD group but the default one."""
    members: dict[int, set[str]] = {}
    for device in groups.devices:
        if device.group_id is not None and device.group_id != DEFAULT_GROUP:
            members.setdefault(device.group_id, set()).add(device.device)
    return members


def rebuild_claims(cdi_root: pathlib.Path, groups: SmiListing) -> dict[str, PreparedClaim]:
    members = group_members(groups)
    claims: dict[str, PreparedClaim] = {}
    for uid, path in cdi.claim_spec_paths(cdi_root):
        try:
            spec = cdi.read_claim_spec(path, uid)
            if spec.rsd_group is not None and members.get(spec.rsd_group) != set(spec.devices):
                raise ValueError(f"RSD group {spec.rsd_group} does not hold exactly {', '.join(spec.devices)} now")
        except (OSError, ValueError) as exc:
            logger.warning("Removed a claim's CDI spec the node no longer backs", claimUID=uid, path=str(path),
                           err=str(exc))
            with contextlib.suppress(OSError):  # one that stays is replaced when the claim is prepared afresh
                path.unlink(missing_ok=True)
            continue
        claims[uid] = PreparedClaim("", "", tuple(PreparedDevice(device, (), (cdi.qualified_name(uid, device),))
                                                  for device in spec.devices), spec.rsd_group, rebuilt=True,
                                  admin_access=spec.rsd_group is None)
    return claims
