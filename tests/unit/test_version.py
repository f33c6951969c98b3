"""The version is written once: what the processes log is what the installed package says it is."""

import subprocess
import sys
from importlib import metadata

from shared.version import VERSION


def test_the_installed_package_takes_its_version_from_the_module():
    assert metadata.version("rbln-device-plugin") == VERSION


def test_knowing_the_version_does_not_load_the_package_metadata_machinery():
    script = "import sys, shared.version; print('importlib.metadata' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
