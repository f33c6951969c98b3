import pathlib
import shutil
import tempfile

import pytest


@pytest.fixture
def short_tmp():
    """A short temporary directory: unix socket paths must stay under ~107 characters."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="rbln-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
