#!/usr/bin/env bash
# The node's private world, run by tests/cluster/run.sh under `unshare --mount --propagation private --net --pid
# --fork --mount-proc`: everything mounted here is this mount namespace's alone and gone with it, every address
# and route is this network namespace's, and every process of the cluster is in this PID namespace. Then the
# command given (the scenarios) runs in it.
#
#   NODE_IP=... KUBERNETES_SERVICE_IP=... bash tests/cluster/namespaces.sh WORK -- COMMAND...
#
# WORK is the run's temp dir. The scenarios add the simulated NPUs' device nodes to the namespace's own /dev
# (where containerd looks for the host paths the stack hands out).
set -euo pipefail

WORK=$1
shift
[ "${1:-}" = -- ] && shift

# The kubelet, containerd and the chart's hostPath volumes write under these: tmpfs, so the host's stay as
# they are. /var/lib as a whole, since /var/lib/kubelet may not exist on the host (a mount point made there
# would be a change of the host's).
for dir in /var/lib /var/log /run; do
  mount -t tmpfs -o mode=0755 tmpfs "$dir"
done
# /dev: the host's basic nodes, its pts and shm.
mkdir -p "$WORK/dev"
mount -t tmpfs -o mode=0755 tmpfs "$WORK/dev"
for name in null zero full random urandom tty kmsg ptmx console; do
  [ -e "/dev/$name" ] && cp -a "/dev/$name" "$WORK/dev/"
done
ln -s /proc/self/fd "$WORK/dev/fd"
for fd in 0 1 2; do ln -s "/proc/self/fd/$fd" "$WORK/dev/$(echo stdin stdout stderr | cut -d' ' -f$((fd + 1)))"; done
for dir in pts shm mqueue; do
  mkdir -p "$WORK/dev/$dir"
  [ -d "/dev/$dir" ] && mount --rbind "/dev/$dir" "$WORK/dev/$dir"
done
mount --move "$WORK/dev" /dev

# The kubelet sets a few kernel parameters (vm.overcommit_memory, kernel.panic, ...) that are not
# namespaced: each is a file of this run's here, so the host's values stay.
mkdir -p "$WORK/sysctl"
for key in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys \
           kernel/keys/root_maxbytes; do
  file="$WORK/sysctl/${key//\//.}"
  cat "/proc/sys/$key" >"$file"
  mount --bind "$file" "/proc/sys/$key"
done

# The chart mounts /run/rbln with HostToContainer propagation, which containerd allows only on a shared or
# slave mount (as / is on a systemd node): new peer groups, of this namespace's own.
# Last: a mount under a shared one cannot be moved.
mount --make-rshared /

# Network: loopback, holding the node's address too (pods reach it through the CNI bridge's gateway: a local
# address whatever its link) and the `kubernetes` Service's ClusterIP, where kube-apiserver listens on 443
# itself, which is what kube-proxy's rule would lead to (there is no kube-proxy).
ip link set lo up
ip addr add "$NODE_IP/32" dev lo
ip addr add "$KUBERNETES_SERVICE_IP/32" dev lo

# Not exec'd: this shell stays PID 1 of the run's PID namespace, reaping the processes orphaned to it
# (containerd's shims); when it ends, the kernel ends whatever of the cluster is left.
"$@"
