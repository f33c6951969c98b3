"""The CDI reference library (tags.cncf.io/container-device-interface, which containerd and CRI-O link),
asked through the Go checker tests/cdi/run.sh builds (tests/cdi/checker)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CHECKER_ENV = "CDI_CHECKER"


@dataclasses.dataclass(frozen=True)
class Answer:
    devices: frozenset[str]
    """Every device the library resolves in the dirs."""
    spec_errors: Mapping[str, list[str]]
    """Spec files it refuses, with its reasons."""
    annotation_devices: tuple[str, ...]
    annotation_error: str
    resolved: Mapping[str, bool]
    inject_error: str


def _answer(raw: Mapping[str, Any]) -> Answer:
    return Answer(frozenset(raw["devices"] or ()), raw["specErrors"] or {}, tuple(raw["annotationDevices"] or ()),
                  raw["annotationError"], raw["resolved"] or {}, raw["injectError"])


class ReferenceLibrary:
    def __init__(self, binary: pathlib.Path):
        self.binary = binary

    @classmethod
    def from_environ(cls) -> ReferenceLibrary:
        return cls(pathlib.Path(os.environ[CHECKER_ENV]))

    def ask(self, queries: Sequence[Mapping[str, Any]]) -> tuple[str, list[Answer]]:
        """(the library's transient spec prefix for rebellions.ai/npu, one answer per query)."""
        run = subprocess.run([str(self.binary)], input=json.dumps({"queries": list(queries)}), capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, f"cdi-checker failed: {run.stderr}"
        output = json.loads(run.stdout)
        return output["transientSpecPrefix"], [_answer(raw) for raw in output["results"] or ()]

    def resolve(self, spec_dirs: Iterable[pathlib.Path], annotations: Mapping[str, str] | None = None,
                devices: Iterable[str] = ()) -> Answer:
        query = {"specDirs": [str(d) for d in spec_dirs], "devices": list(devices),
                 "annotations": dict(annotations or {})}
        return self.ask([query])[1][0]
