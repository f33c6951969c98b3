"""The running stack against the threats of docs/security.md: hostile clients on the health port, a
supervisord that stops answering, secrets and settings kept from rbln-smi and the logs, the files it
creates private, and the whole stack run by an unprivileged user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from simulator.stack import ENTRYPOINT
from tests.integration.test_supervision import program_info

NPU = "rebellions.ai/npu"
NOBODY = 65534


def test_the_files_the_stack_creates_on_the_node_are_private_to_root_and_its_group(make_node, kubelet,
                                                                                   start_stack):
    node = make_node("1")
    start_stack(node)
    kubelet.wait_for_devices(NPU, lambda view: view.connected, timeout=30)
    for name, info in program_info(node).items():
        with open(f"/proc/{info['pid']}/status") as status:
            assert "Umask:\t0027\n" in status.read(), name
    log_files = sorted(node.log_dir.glob("*.log"))
    assert len(log_files) == 5 and {stat.S_IMODE(path.stat().st_mode) for path in log_files} == {0o640}


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
