#!/bin/sh
# crds.sh: print the path of NFD's CRD manifest (its own deployment file) in Go's module cache, from the
# sigs.k8s.io/node-feature-discovery release tests/nfd/harness/go.mod pins; downloaded through the Go
# module proxy if it is not there yet. Nothing of it is copied into the repository.
set -eu
cd "$(dirname "$0")/harness"
go mod download sigs.k8s.io/node-feature-discovery
dir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/node-feature-discovery)
crds="$dir/deployment/base/nfd-crds/nfd-api-crds.yaml"
if [ ! -f "$crds" ]; then
    echo "$0: $crds is missing from the module" >&2
    exit 1
fi
echo "$crds"
