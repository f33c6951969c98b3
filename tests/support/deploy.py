"""The deployment material as tests reach it: the repository root, deploy/'s scripts, the project's version."""
from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_deploy_module(name: str) -> ModuleType:
    """deploy/<name>.py, which is a script directory rather than a package, imported under a private name."""
    module_name = f"_deploy_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "deploy" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def project_version() -> str:
    match = re.search(r'^VERSION\s*=\s*"([^"]+)"', (ROOT / "shared" / "version.py").read_text(), re.M)
    assert match, "shared/version.py has no VERSION"
    return match[1]
