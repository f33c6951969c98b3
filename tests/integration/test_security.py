"""The running stack against the threats of docs/security.md: hostile clients on the health port, a
supervisord that stops answering, secrets and settings kept from rbln-smi and the logs, the files it
creates private, and the whole stack run by an unprivileged user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from simulator.stack import ENTRYPOINT

NOBODY = 65534


def run_refused(node, **env) -> str:
    """`rbln-device-plugin run` that must refuse to start: its one line on stderr."""
    result = subprocess.run([sys.executable, "-c", ENTRYPOINT, "run"], env={**os.environ, **node.env("1s"), **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    return line


def test_run_refuses_a_run_dir_that_is_a_link_or_someone_elses(make_node, node_root):
    node = make_node("1")
    elsewhere = node_root / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    link = node_root / "linked-run"
    link.symlink_to(elsewhere)
    assert run_refused(node, RBLN_DEVICE_PLUGIN_RUN_DIR=str(link)) == \
        f"rbln-device-plugin run: RBLN_DEVICE_PLUGIN_RUN_DIR {link}: is a symbolic link"
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755 and list(elsewhere.iterdir()) == []
    if os.geteuid() == 0:
        os.chown(elsewhere, NOBODY, NOBODY)
        assert run_refused(node, RBLN_DEVICE_PLUGIN_RUN_DIR=str(elsewhere)) == \
            f"rbln-device-plugin run: RBLN_DEVICE_PLUGIN_RUN_DIR {elsewhere}: is owned by uid {NOBODY}, not 0"
