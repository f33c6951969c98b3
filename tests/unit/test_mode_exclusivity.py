"""A node serves its NPUs one way: a stack refuses to start while a live instance of the other mode serves it,
and a dead one's leftover socket files do not count."""

from __future__ import annotations

import pathlib
import shutil
import socket
import tempfile

import pytest

from shared.config import ConfigError, ResourceApi, Settings
from shared.mode_exclusivity import is_live, other_mode_conflict


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


@pytest.mark.parametrize("name", ["npu.rebellions.ai-reg.sock",
                                  "npu.rebellions.ai-0c8e2f4a-6b1d-4e2f-9a7c-3d5e6f708192-reg.sock"])
def test_a_live_dra_registration_socket_keeps_the_device_plugin_from_starting(tmp_path, listening, name):
    """Either naming scheme: the fixed name, or an instance's with its pod UID (surge upgrades)."""
    settings = _settings(tmp_path, ResourceApi.DEVICE_PLUGIN)
    assert other_mode_conflict(settings) is None
    listening(tmp_path / "reg" / name)
    assert f"a live DRA plugin serves this node's NPUs ({tmp_path / 'reg' / name})" in other_mode_conflict(settings)


def test_pod_uid_names_the_dra_sockets_and_is_checked():
    fixed = Settings.from_environ({})
    assert (fixed.dra_socket.name, fixed.dra_registration_socket.name) == ("dra.sock", "npu.rebellions.ai-reg.sock")
    uid = "0c8e2f4a-6b1d-4e2f-9a7c-3d5e6f708192"
    own = Settings.from_environ({"POD_UID": uid})
    assert own.dra_socket.name == f"dra-{uid}.sock"
    assert own.dra_registration_socket.name == f"npu.rebellions.ai-{uid}-reg.sock"
    with pytest.raises(ConfigError, match=r"^invalid POD_UID '\.\./x': not a pod UID"):
        Settings.from_environ({"POD_UID": "../x"})


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
