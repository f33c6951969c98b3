"""Whether the CDI device the Allocate annotation names resolves in the spec dirs, and saying so.

The scanner checks at start and at every scan (shared/cdi/spec_dirs.py rereads only what changed), publishes
the verdict with each inventory snapshot (a worker's Allocate decides from it) and keeps it in its status
file (`rbln-device-plugin status`, the metric). It logs once at start and again whenever the verdict or the
set of refused specs changes, never on a steady state.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable, Sequence

from loguru import logger

from shared.cdi.annotation import RUNTIME_DEVICE, CdiAnnotation
from shared.cdi.spec import resolve
from shared.cdi.spec_dirs import SpecDirs
from shared.channels.status_records import CdiCheck, RefusedSpec

# Refused specs a record or the status file lists: a hostile dir must not make either large.
_MAX_LISTED = 16

CONSEQUENCES = {
    CdiAnnotation.ALWAYS: "Allocate still returns the annotation (CDI_ANNOTATION=always): a CDI-enabled runtime "
                          "(containerd 2.x by default, CRI-O) refuses to create every container that gets an NPU "
                          "(unresolvable CDI devices); install the RBLN container toolkit, or set "
                          "CDI_ANNOTATION=when-resolvable",
    CdiAnnotation.WHEN_RESOLVABLE: "Allocate leaves the annotation out (CDI_ANNOTATION=when-resolvable): containers "
                                   "get their device nodes and the RSD node, without the toolkit's tools and "
                                   "libraries",
    CdiAnnotation.NEVER: "Allocate never returns the annotation (CDI_ANNOTATION=never): containers get their "
                         "device nodes and the RSD node, without the toolkit's tools and libraries",
}


@dataclasses.dataclass(frozen=True)
class CdiState:
    resolvable: bool
    defined_in: tuple[str, ...]
    conflict: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]
    """(path, reason) of every spec file the runtime would refuse."""
    dir_errors: tuple[str, ...]

    def record(self, spec_dirs: Sequence[str] = (), annotation: str | None = None) -> CdiCheck:
        """As the scanner's status file carries it, with the dirs checked and the annotation policy."""
        return CdiCheck(device=RUNTIME_DEVICE, resolvable=self.resolvable, defined_in=self.defined_in,
                        conflict=self.conflict,
                        refused_specs=tuple(RefusedSpec(path, reason) for path, reason in self.refused[:_MAX_LISTED]),
                        refused_spec_count=len(self.refused), dir_errors=self.dir_errors[:_MAX_LISTED],
                        spec_dirs=tuple(spec_dirs), annotation=annotation)


class CdiWatch:
    """The check and its records; owned by the scan loop's thread."""

    def __init__(self, dirs: Sequence[pathlib.Path], policy: CdiAnnotation, clock: Callable[[], int] = time.time_ns):
        self._dirs = SpecDirs(dirs, clock)
        self._policy = policy
        self._last: CdiState | None = None

    @property
    def dirs(self) -> list[str]:
        return list(self._dirs.dirs)

    def check(self) -> CdiState:
        view = self._dirs.read()
        resolution = resolve(RUNTIME_DEVICE, view.specs)
        state = CdiState(resolution.resolvable, resolution.defined_in, resolution.conflict,
                         tuple((spec.path, spec.error) for spec in view.specs if spec.error is not None),
                         view.dir_errors)
        self._report(state)
        self._last = state
        return state

    def _report(self, state: CdiState) -> None:
        last = self._last
        fields = {"cdiDevice": RUNTIME_DEVICE, "specDirs": self.dirs, "cdiAnnotation": self._policy.value}
        for path, reason in sorted(set(state.refused) - set(last.refused if last else ()))[:_MAX_LISTED]:
            logger.warning("CDI spec refused; a runtime ignores it", path=path, err=reason, **fields)
        for problem in sorted(set(state.dir_errors) - set(last.dir_errors if last else ())):
            logger.warning("CDI spec dir cannot be read in full", err=problem, **fields)
        if last is not None and (last.resolvable, last.defined_in, last.conflict) == \
                (state.resolvable, state.defined_in, state.conflict):
            return
        if state.resolvable:
            logger.info("CDI device resolvable", definedIn=list(state.defined_in), **fields)
        else:
            reason = (f"specs of one directory both define it: {', '.join(state.conflict)}" if state.conflict
                      else "no valid spec in the spec dirs defines it")
            logger.warning("CDI device unresolvable", err=reason, consequence=CONSEQUENCES[self._policy], **fields)
