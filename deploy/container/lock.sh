#!/usr/bin/env bash
# Regenerate the image's hashed locks, then prove that they install on the image's Pythons.
#
#   bash deploy/container/lock.sh          # or: make -f deploy/container/Makefile lock
#
# requirements.lock        the stack's dependencies (pyproject.toml's [project] dependencies)
# build-requirements.lock  pip itself and the build backend ([build-system] requires)
# Both pin every distribution with the SHA-256 of each of its files, so the Dockerfile installs them
# with --require-hashes. uv resolves them "universally": one lock for every Python from 3.11 on and
# every platform, with environment markers where a dependency differs (colorama on Windows, say),
# where pip-compile would resolve for the interpreter it runs on only.
#
# The check downloads, with hash checking and wheels only, what each lock installs on CPython 3.11
# (Debian bookworm's, the base of the image test) and on the Python of the Dockerfile's default base,
# on linux/amd64. Run it after changing a dependency in pyproject.toml; commit the two locks.
#
# Environment: PYTHON (an interpreter >= 3.11 to run uv and pip with, default python3),
# LOCK_CHECK_PLATFORM (manylinux architecture of the check, default x86_64).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
UV_VERSION=0.13.9
LOWEST_PYTHON=3.11
LOCK_DIR=deploy/container
ARCH=${LOCK_CHECK_PLATFORM:-x86_64}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbln-lock.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"

# --native-tls: the system's CA store, as pip uses it (uv would otherwise trust its own roots only).
compile=("$WORK/venv/bin/uv" pip compile --quiet --native-tls --universal --python-version "$LOWEST_PYTHON"
         --generate-hashes --custom-compile-command "bash deploy/container/lock.sh")
"${compile[@]}" --output-file "$LOCK_DIR/requirements.lock" pyproject.toml
"$WORK/venv/bin/python" - >"$WORK/build.in" <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("pip", *tomllib.load(f)["build-system"]["requires"], sep="\n")
EOF
"${compile[@]}" --output-file "$LOCK_DIR/build-requirements.lock" "$WORK/build.in"
# The input file lives in a temporary directory: name what it was made of instead.
sed -i "s|# via -r .*build.in|# via pyproject.toml [build-system] requires, or pip itself|" "$LOCK_DIR/build-requirements.lock"

default_python=$(sed -n 's/^ARG BASE_IMAGE=python:\([0-9.]*\)-slim.*/\1/p' "$LOCK_DIR/Dockerfile")
[ -n "$default_python" ] || { echo "lock.sh: cannot read the default base's Python from the Dockerfile" >&2; exit 1; }
platforms=()
for tag in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_36; do
  platforms+=(--platform "${tag}_$ARCH")
done
for version in "$LOWEST_PYTHON" "$default_python"; do
  for lock in requirements.lock build-requirements.lock; do
    "$WORK/venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-cache-dir \
      --require-hashes --only-binary=:all: --python-version "$version" "${platforms[@]}" \
      --dest "$WORK/check-$version-$lock" -r "$LOCK_DIR/$lock"
    echo "$lock: $(find "$WORK/check-$version-$lock" -name '*.whl' | wc -l) wheels for CPython $version ($ARCH)"
  done
done
