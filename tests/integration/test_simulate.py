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
    assert "Stack stopped (exit status 0)." in out


def test_simulate_in_dra_mode_shows_slices_a_prepared_claim_a_tainted_device_and_the_status():
    done = subprocess.run([sys.executable, "-c", ENTRYPOINT, "simulate", "--resource-api", "dra", "--node", "2,1:vf4",
                           "--scan-interval", "200ms"], capture_output=True, text=True, timeout=110, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "services v1.DRAPlugin, v1beta1.DRAPlugin, v1.DRAResourceHealth, v1alpha1.DRAResourceHealth" in out
    published = out.split("Published ResourceSlices:\n", 1)[1].split("The health stream", 1)[0]
    assert [line.split()[0] for line in published.splitlines()[1:]] == [
        "rbln0", "rbln1", "rbln2-0", "rbln2-1", "rbln2-2", "rbln2-3"]
    assert "reports 6 device(s), all HEALTHY" in out
    assert "k8s.npu.rebellions.ai/npu=5e1f0c2a-0000-4000-8000-00000000c1a1-rbln0" in out
    assert '"path": "/dev/rsd0"' in out
    assert 'rbln0: {"health": "Healthy", "pciBusID": "0000:03:00.0", "rsdGroup": "/dev/rsd1"}' in out
    assert "rbln0     npu   PCI 0000:03:00.0 NUMA 0 taint npu.rebellions.ai/unhealthy=FAULT:NoSchedule" in out
    assert "the health stream says rbln0 UNHEALTHY, message 'FAULT'" in out
    assert "dra: registered yes, 6 devices, 1 prepared claims, slice generation 1, 1 health streams, 1 tainted" in out
    assert "Stack stopped (exit status 0)." in out
