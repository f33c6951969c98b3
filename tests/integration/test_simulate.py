"""`rbln-device-plugin simulate` end to end: the demo shows what the kubelet sees and the node labels."""

import subprocess
import sys

from simulator.stack import ENTRYPOINT


def test_simulate_shows_the_kubelets_view_and_the_node_labels_and_exits_cleanly():
    done = subprocess.run([sys.executable, "-c", ENTRYPOINT, "simulate", "--node", "1,1:vf4", "--scan-interval",
                           "200ms"], capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "rebellions.ai/npu-vf4: 4 device(s)" in out
    heading = next(line for line in out.splitlines() if line.startswith("Node labels for Node Feature Discovery"))
    labels = out.split(heading + "\n", 1)[1].split("Sample allocations:", 1)[0].split()
    assert labels == [
        "rebellions.ai/npu.present=true", "rebellions.ai/npu.count=5", "rebellions.ai/npu.family=ATOM",
        "rebellions.ai/npu.product=RBLN-CA25", "rebellions.ai/driver-version.full=1.3.73",
        "rebellions.ai/driver-version.major=1", "rebellions.ai/driver-version.minor=3",
        "rebellions.ai/driver-version.patch=73", "rebellions.ai/npu-vf1.count=0", "rebellions.ai/npu-vf4.count=4",
        "rebellions.ai/npu.healthy=5"]
    # The node's processes alone (it has no npu-vf1); the workers serve and have said they are up: RUNNING, not
    # STARTING until supervisord's startsecs has passed.
    table = out.split("  PROCESS ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    states = {row.split()[0]: row.split()[1] for row in table}
    assert set(states) == {"scanner", "worker-npu", "worker-npu-vf4", "watchdog"}
    assert states["worker-npu"] == states["worker-npu-vf4"] == "RUNNING"
    assert "Stack stopped (exit status 0)." in out
