"""Throwaway TLS credentials for loopback servers in tests and benchmarks, made by the openssl CLI."""

from __future__ import annotations

import pathlib
import subprocess


def self_signed(directory: pathlib.Path, host: str = "localhost") -> tuple[pathlib.Path, pathlib.Path]:
    """An EC key and a self-signed certificate for `host` (a name, or an IP address), valid for a day:
    (key, certificate), PEM files in `directory`."""
    key, cert = directory / "key.pem", directory / "cert.pem"
    alt_name = f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", f"/CN={host}", "-addext", f"subjectAltName={alt_name}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return key, cert
