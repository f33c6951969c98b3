"""A node serves its NPUs one way: a stack refuses to start while a live instance of the other mode serves it,
and a dead one's leftover socket files do not count."""

from __future__ import annotations

import pathlib
import shutil
import socket
import tempfile

import pytest

from rbln_device_plugin.mode_exclusivity import is_live, other_mode_conflict
from shared.config import ResourceApi, Settings


def _settings(tmp_path, api: ResourceApi) -> Settings:
    return Settings.from_environ({
        "RESOURCE_API": api.value, "KUBELET_DEVICE_PLUGIN_PATH": str(tmp_path / "dp"),
        "KUBELET_PLUGINS_PATH": str(tmp_path / "plugins"), "KUBELET_PLUGIN_REGISTRY_PATH": str(tmp_path / "reg"),
        "RBLN_DEVICE_PLUGIN_RUN_DIR": str(tmp_path / "run")})


@pytest.fixture
def tmp_path():
    """A short directory: the kubelet's socket dirs and names must fit a unix socket path."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="rbln-mx-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def listening():
    sockets = []

    def listen(path) -> socket.socket:
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.listen()
        sockets.append(sock)
        return sock

    yield listen
    for sock in sockets:
        sock.close()


def test_a_live_device_plugin_socket_keeps_dra_from_starting(tmp_path, listening):
    settings = _settings(tmp_path, ResourceApi.DRA)
    assert other_mode_conflict(settings) is None
    listening(tmp_path / "dp" / "rbln-device-plugin-rebellions-ai-npu-vf4-0123abcd.sock")
    conflict = other_mode_conflict(settings)
    assert conflict is not None and "\n" not in conflict and "rebellions-ai-npu-vf4" in conflict


def test_a_live_dra_registration_socket_keeps_the_device_plugin_from_starting(tmp_path, listening):
    settings = _settings(tmp_path, ResourceApi.DEVICE_PLUGIN)
    assert other_mode_conflict(settings) is None
    listening(settings.dra_registration_socket)
    assert "a live DRA plugin" in other_mode_conflict(settings)


def test_a_dead_instance_s_socket_files_and_other_names_do_not_count(tmp_path, listening):
    dead = listening(tmp_path / "dp" / "rbln-device-plugin-rebellions-ai-npu-0123abcd.sock")
    dead.close()  # the file stays, nothing accepts on it
    listening(tmp_path / "dp" / "some-other-vendor.sock")
    settings = _settings(tmp_path, ResourceApi.DRA)
    assert not is_live(tmp_path / "dp" / "rbln-device-plugin-rebellions-ai-npu-0123abcd.sock")
    assert other_mode_conflict(settings) is None
    (tmp_path / "reg").mkdir()
    (tmp_path / "reg" / "npu.rebellions.ai-reg.sock").write_text("not a socket")
    assert other_mode_conflict(_settings(tmp_path, ResourceApi.DEVICE_PLUGIN)) is None
