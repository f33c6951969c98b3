"""Where the API server is and how worker-dra proves who it is: the pod's service account, or a kubeconfig file.

What a DaemonSet's pod has is the service account (the API server's address in KUBERNETES_SERVICE_HOST and
_PORT, the cluster's CA and a projected token in the pod's secret directory). The kubelet refreshes that token
before it expires, so the token is read from its file again after TOKEN_REREAD seconds, as client-go does. A
kubeconfig file (KUBECONFIG; for a worker run outside a pod, and the tests) is read as kubectl reads one: its
current context's cluster (server, certificate-authority(-data), insecure-skip-tls-verify, tls-server-name) and
user (token, tokenFile, client-certificate(-data), client-key(-data)). What worker-dra cannot do (an exec or
auth-provider plugin, a password) is refused by name, not skipped: the worker would otherwise call the API server
anonymously and meet 401s it could not explain.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pathlib
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

SERVICE_ACCOUNT = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD = 60.0
_UNSUPPORTED_USER = ("exec", "auth-provider", "username", "password")
_CLIENT_CERTIFICATE = ("client-certificate", "client-key", "client-certificate-data", "client-key-data")


class ConfigError(ValueError):
    """The credentials cannot be used; the message names the file and what is wrong in it."""


class TokenFile:
    """A bearer token read from a file, read again once it is TOKEN_REREAD seconds old."""

    def __init__(self, path: pathlib.Path, clock: Callable[[], float] = time.monotonic):
        self._path = path
        self._clock = clock
        self._lock = threading.Lock()  # guards _token and _read_at: the watcher and the publisher both ask
        self._token = ""
        self._read_at: float | None = None

    def __call__(self) -> str:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= TOKEN_REREAD:
                try:
                    self._token = self._path.read_text().strip()
                except OSError as exc:
                    if self._read_at is None:  # a token read once stays in use while the file is replaced
                        raise ConfigError(f"the token file {self._path}: {exc.strerror or exc}") from None
                self._read_at = now
            return self._token


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One API server and the credentials to call it with."""

    host: str
    port: int
    tls: ssl.SSLContext | None
    """None for a plain-HTTP server (the loopback stand-in of the tests)."""
    server_name: str
    """The name the server's certificate is checked against (and sent in SNI)."""
    token: Callable[[], str] | None = None

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def from_service_account(environ: Mapping[str, str] = os.environ, root: pathlib.Path = SERVICE_ACCOUNT,
                         clock: Callable[[], float] = time.monotonic) -> Endpoint:
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port.isdigit():
        raise ConfigError("no API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
                          "(not in a pod? set KUBECONFIG)")
    context = _tls_context()
    try:
        context.load_verify_locations(cafile=str(root / "ca.crt"))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"the service account's CA {root / 'ca.crt'}: {exc}") from None
    token = TokenFile(root / "token", clock)
    token()  # a missing token is said at once, not at the first call
    return Endpoint(host, int(port), context, host, token)


def from_kubeconfig(path: pathlib.Path, clock: Callable[[], float] = time.monotonic) -> Endpoint:
    import yaml

    try:
        # libyaml's parser where PyYAML has it: the pure-Python one took 1.6 ms of a worker's start (0.13 ms)
        document = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"the kubeconfig {path}: {exc}") from None
    return _endpoint(path, document, clock)


def _endpoint(path: pathlib.Path, document: Any, clock: Callable[[], float]) -> Endpoint:
    if not isinstance(document, dict):
        raise ConfigError(f"the kubeconfig {path}: not a mapping")
    context = _named(path, document, "contexts", "context", document.get("current-context"))
    cluster = _named(path, document, "clusters", "cluster", context.get("cluster"))
    user = _named(path, document, "users", "user", context.get("user")) if context.get("user") else {}
    base = path.parent
    url = urllib.parse.urlsplit(str(cluster.get("server") or ""))
    if url.scheme not in ("https", "http") or not url.hostname:
        raise ConfigError(f"the kubeconfig {path}: the cluster's server {cluster.get('server')!r} is not an "
                          "http(s) URL")
    if url.path.strip("/"):
        raise ConfigError(f"the kubeconfig {path}: a server with a path ({url.path}) is not supported")
    unsupported = [key for key in _UNSUPPORTED_USER if user.get(key)]
    if unsupported:
        raise ConfigError(f"the kubeconfig {path}: the user's {', '.join(unsupported)} is not supported; "
                          "use a token, a token file or a client certificate")
    tls = None
    if url.scheme == "https":
        tls = _tls_context()
        try:
            _load_ca(tls, base, cluster)
            _load_client_certificate(tls, base, user)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"the kubeconfig {path}: {exc}") from None
    token: Callable[[], str] | None = None
    if user.get("token"):
        fixed = str(user["token"])
        token = lambda: fixed  # noqa: E731
    elif user.get("tokenFile"):
        token = TokenFile(base / str(user["tokenFile"]), clock)
        token()
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError as exc:
        raise ConfigError(f"the kubeconfig {path}: the cluster's server {cluster.get('server')!r}: {exc}") from None
    return Endpoint(url.hostname, port, tls, str(cluster.get("tls-server-name") or url.hostname), token)


def _named(path: pathlib.Path, document: dict[str, Any], section: str, key: str, name: Any) -> dict[str, Any]:
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(key), dict):
            return entry[key]
    raise ConfigError(f"the kubeconfig {path}: no {key} named {name!r} in {section}")


def _tls_context() -> ssl.SSLContext:
    """A client context that trusts only the CA given to it (not the system's: loading those costs a worker's
    start milliseconds, and no public CA signs an API server's certificate), speaking HTTP/2."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    return context


def _file(base: pathlib.Path, section: dict[str, Any], key: str) -> str:
    """The file `section[key]` names (relative to the kubeconfig's directory), which must be there."""
    path = base / str(section[key])
    if not path.is_file():
        raise ValueError(f"the {key} {path} is not a file")
    return str(path)


def _load_ca(context: ssl.SSLContext, base: pathlib.Path, cluster: dict[str, Any]) -> None:
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        context.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    elif cluster.get("certificate-authority"):
        context.load_verify_locations(cafile=_file(base, cluster, "certificate-authority"))
    else:
        raise ValueError("the cluster names no certificate-authority(-data) and does not skip verification")


def _load_client_certificate(context: ssl.SSLContext, base: pathlib.Path, user: dict[str, Any]) -> None:
    if user.get("client-certificate") and user.get("client-key"):
        context.load_cert_chain(_file(base, user, "client-certificate"), _file(base, user, "client-key"))
    elif user.get("client-certificate-data") and user.get("client-key-data"):
        # load_cert_chain reads files only: the two are written to a private directory for the moment it reads
        with tempfile.TemporaryDirectory() as private:
            cert, key = pathlib.Path(private, "cert.pem"), pathlib.Path(private, "key.pem")
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            context.load_cert_chain(str(cert), str(key))
    elif any(user.get(key) for key in _CLIENT_CERTIFICATE):
        raise ValueError("the user's client certificate and key must both be given, both as files or both inline")
