"""tests/nfd/harness/go.mod takes NFD's own replaces of the Kubernetes staging modules (a dependency's
replaces do not apply to the module that requires it): they must stay those of the pinned release."""

import pathlib
import re

from tests.nfd.nfd_tools import HERE, nfd_module_dir

_REPLACE = re.compile(r"^\s*(k8s\.io/\S+)\s+=>\s+(\S+)\s+(\S+)\s*$", re.MULTILINE)


def replaces(go_mod: pathlib.Path) -> dict[str, tuple[str, str]]:
    return {module: (target, version) for module, target, version in _REPLACE.findall(go_mod.read_text())}


def test_the_harness_replaces_the_staging_modules_as_the_pinned_nfd_release_does():
    pinned = replaces(nfd_module_dir() / "go.mod")
    assert pinned, "NFD's go.mod has no k8s.io replaces: read it again"
    assert replaces(HERE / "harness" / "go.mod") == pinned
