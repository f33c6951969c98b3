"""Where worker-dra finds the API server and its credentials: a kubeconfig read as kubectl reads one, or the pod's
service account; what it cannot use is refused by name; a token file is read again as the kubelet rotates it."""

from __future__ import annotations

import base64
import json
import pathlib
import ssl

import pytest

from dra_worker.api_credentials import TOKEN_REREAD, ConfigError, from_kubeconfig, from_service_account
from tests.support.certificates import self_signed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pki(tmp_path):
    (tmp_path / "pki").mkdir()
    return self_signed(tmp_path / "pki", "127.0.0.1")


def _kubeconfig(path: pathlib.Path, cluster: dict, user: dict) -> pathlib.Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "other", "cluster": {"server": "https://elsewhere:1"}},
                     {"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_the_current_context_s_cluster_and_token_are_used(tmp_path, pki):
    _, cert = pki
    config = _kubeconfig(tmp_path / "kubeconfig", {
        "server": "https://10.0.0.1:6443", "certificate-authority-data": base64.b64encode(cert.read_bytes()).decode(),
        "tls-server-name": "kubernetes"}, {"token": "abc"})
    endpoint = from_kubeconfig(config)
    assert (endpoint.host, endpoint.port, endpoint.server_name, endpoint.authority) == (
        "10.0.0.1", 6443, "kubernetes", "10.0.0.1:6443")
    assert endpoint.token is not None and endpoint.token() == "abc"
    assert endpoint.tls is not None and endpoint.tls.verify_mode == ssl.CERT_REQUIRED
    assert endpoint.tls.minimum_version == ssl.TLSVersion.TLSv1_2


def test_relative_files_are_found_beside_the_kubeconfig_and_a_token_file_is_read_again(tmp_path, pki):
    _, cert = pki
    (tmp_path / "token").write_text("first\n")
    config = _kubeconfig(tmp_path / "kubeconfig",
                         {"server": "https://api:443", "certificate-authority": "pki/cert.pem"},
                         {"tokenFile": "token", "client-certificate": str(cert), "client-key": "pki/key.pem"})
    clock = Clock()
    endpoint = from_kubeconfig(config, clock)
    assert endpoint.token is not None and endpoint.token() == "first"
    (tmp_path / "token").write_text("rotated")
    clock.now += TOKEN_REREAD - 1
    assert endpoint.token() == "first"
    clock.now += 1
    assert endpoint.token() == "rotated"
    (tmp_path / "token").unlink()  # replaced while it is read: the token in hand stays in use
    clock.now += TOKEN_REREAD
    assert endpoint.token() == "rotated"


def test_a_client_certificate_given_inline_is_loaded(tmp_path, pki):
    key, cert = pki
    config = _kubeconfig(tmp_path / "kubeconfig", {"server": "https://api", "insecure-skip-tls-verify": True}, {
        "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode()})
    endpoint = from_kubeconfig(config)
    assert endpoint.port == 443 and endpoint.token is None
    assert endpoint.tls is not None and endpoint.tls.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(("cluster", "user", "named"), [
    ({"server": "https://api"}, {"token": "t"}, "names no certificate-authority"),
    ({"server": "api:6443", "insecure-skip-tls-verify": True}, {}, r"is not an http\(s\) URL"),
    ({"server": "https://api/prefix", "insecure-skip-tls-verify": True}, {}, "a server with a path"),
    ({"server": "http://api"}, {"exec": {"command": "aws"}}, "the user's exec is not supported"),
    ({"server": "http://api"}, {"username": "a", "password": "b"}, "username, password is not supported"),
    ({"server": "https://api", "certificate-authority": "missing.pem"}, {},
     "certificate-authority .*missing.pem is not"),
    ({"server": "http://api"}, {"tokenFile": "missing-token"}, "the token file"),
    ({"server": "https://api:99999", "insecure-skip-tls-verify": True}, {}, "out of range"),
    ({"server": "https://api", "insecure-skip-tls-verify": True}, {"client-certificate": "cert.pem"},
     "client certificate and key must both be given"),
])
def test_what_cannot_be_used_is_refused_by_name(tmp_path, cluster, user, named):
    with pytest.raises(ConfigError, match=named) as refused:
        from_kubeconfig(_kubeconfig(tmp_path / "kubeconfig", cluster, user))
    assert str(tmp_path / "kubeconfig") in str(refused.value) or "token file" in named


@pytest.mark.parametrize(("text", "named"), [
    ("[1, 2]", "not a mapping"), ("a: [", "kubeconfig"),
    (json.dumps({"current-context": "nowhere", "contexts": []}), "no context named 'nowhere'")])
def test_a_broken_kubeconfig_is_refused_by_name(tmp_path, text, named):
    (tmp_path / "kubeconfig").write_text(text)
    with pytest.raises(ConfigError, match=named):
        from_kubeconfig(tmp_path / "kubeconfig")
    with pytest.raises(ConfigError, match="missing"):
        from_kubeconfig(tmp_path / "missing")


def test_the_service_account_is_the_pod_s_environment_ca_and_rotated_token(tmp_path, pki):
    _, cert = pki
    (tmp_path / "ca.crt").write_bytes(cert.read_bytes())
    (tmp_path / "token").write_text("sa-token")
    clock = Clock()
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    endpoint = from_service_account(environ, tmp_path, clock)
    assert endpoint.authority == "[fd00::1]:443" and endpoint.server_name == "fd00::1"
    assert endpoint.token is not None and endpoint.token() == "sa-token"
    (tmp_path / "token").write_text("sa-token-2")
    clock.now += TOKEN_REREAD
    assert endpoint.token() == "sa-token-2"


def test_no_service_account_is_said_plainly(tmp_path, pki):
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        from_service_account({}, tmp_path)
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match=r"ca\.crt"):
        from_service_account(environ, tmp_path)
    (tmp_path / "ca.crt").write_bytes(pki[1].read_bytes())
    with pytest.raises(ConfigError, match="token"):
        from_service_account(environ, tmp_path)
