#!/bin/sh
# Usage: unshare --mount --propagation private -- sh private_plugin_dir.sh COMMAND [ARG...]
#
# Gives the new mount namespace an empty /var/lib/kubelet/device-plugins (the directory the
# kubelet's device manager always serves) on a tmpfs, then execs COMMAND in it. The tmpfs goes
# over the deepest directory of that path that exists, so nothing is created outside the
# namespace, and it goes away with the namespace's last process.
set -eu

if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)" ]; then
    echo "$0: not in a private mount namespace; run it under unshare --mount" >&2
    exit 1
fi
dir=/var/lib/kubelet/device-plugins
top=$dir
while [ ! -d "$top" ]; do top=$(dirname "$top"); done
case $top in
    /var/lib | /var/lib/*) ;;
    *) echo "$0: $top would hide more than the kubelet's files; refusing" >&2; exit 1 ;;
esac
mount -t tmpfs -o mode=0755 kubelet-conformance "$top"
mkdir -p "$dir"
exec "$@"
