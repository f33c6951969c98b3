"""Regenerate the committed Python stubs of the kubelet APIs the project speaks, and of the API server's.

    python protos/generate.py            # rewrite shared/<home>/<api>/<version>/ for every API
    python protos/generate.py --out DIR  # write to DIR/<home>/<api>/<version>/ instead (the drift test does this)

The stubs are committed so that `pip install .` needs no code generator; the
test `tests/unit/test_proto_stubs.py` regenerates them and fails on any drift.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
# Each API as <api>/<version>/api.proto: the device plugin API the workers serve, the PodResources API
# `status` asks which pod holds which device, and for worker-dra the plugin registration API and both
# versions of the DRA plugin API the kubelet may call, and both versions of the DRA health service it may
# watch (k8s.io/kubelet/pkg/apis/dra-health/<version>: the dash, which no Python package name takes, is an
# underscore here).
KUBELET_APIS = ("deviceplugin/v1beta1", "podresources/v1", "pluginregistration/v1", "dra/v1", "dra/v1beta1",
                "dra_health/v1", "dra_health/v1alpha1")
# The API server's ResourceSlices in its protobuf encoding (worker-dra's publisher): messages only, no service.
APISERVER_APIS = ("resource/v1",)
APIS = KUBELET_APIS + APISERVER_APIS
DEFAULT_OUT = PROTO_ROOT.parent / "shared"


def home(api: str) -> str:
    """Where an API's stubs live under shared/: kubelet/<api>/<version> or kubeapi/<api>/<version>."""
    return f"{'kubelet' if api in KUBELET_APIS else 'kubeapi'}/{api}"


def _package_import(api: str) -> tuple[str, str]:
    """protoc names a module by its proto's path; the stubs live in the package shared.<home>, so the gRPC
    module's import is rewritten to match."""
    return f"from {api.replace('/', '.')} import api_pb2", f"from shared.{home(api).replace('/', '.')} import api_pb2"


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    import tempfile

    from grpc_tools import protoc

    written = []
    for api in APIS:
        out_dir = out_root / home(api)
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as raw:
            services = [f"--grpc_python_out={raw}"] if api in KUBELET_APIS else []
            status = protoc.main(
                [
                    "grpc_tools.protoc",
                    f"-I{PROTO_ROOT}",
                    f"--python_out={raw}",
                    f"--pyi_out={raw}",
                    *services,
                    str(PROTO_ROOT / api / "api.proto"),
                ]
            )
            if status != 0:
                raise SystemExit(f"protoc failed on {api} with status {status}")
            generated_import, package_import = _package_import(api)
            for produced in sorted((pathlib.Path(raw) / api).iterdir()):
                target = out_dir / produced.name
                target.write_text(produced.read_text().replace(generated_import, package_import))
                written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
