#!/bin/sh
# with_features_dir.sh SCRATCH FEATURES COMMAND...: run COMMAND with FEATURES at
# /etc/kubernetes/node-feature-discovery/features.d, the directory nfd-worker's local source reads
# (a path compiled into NFD). Only inside a private mount namespace (unshare --mount), as root: /etc
# becomes an overlay of itself whose changes live in a tmpfs on SCRATCH, so the node's /etc is
# never written, and everything goes when the namespace does.
set -eu

if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)" ]; then
    echo "$0: not in a private mount namespace; run it under unshare --mount" >&2
    exit 1
fi
scratch=$1
features=$2
shift 2
mount --make-rprivate /
mount -t tmpfs -o mode=0755 nfd-scratch "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay nfd-etc -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mkdir -p /etc/kubernetes/node-feature-discovery/features.d
mount --bind "$features" /etc/kubernetes/node-feature-discovery/features.d
exec "$@"
