"""Regenerate the committed Python stubs of the kubelet device plugin API.

    python protos/generate.py            # rewrite shared/deviceplugin/v1beta1/
    python protos/generate.py --out DIR  # write to DIR instead (the drift test does this)

The stubs are committed so that `pip install .` needs no code generator; the
test `tests/unit/test_proto_stubs.py` regenerates them and fails on any drift.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
PROTO_FILE = "deviceplugin/v1beta1/api.proto"
DEFAULT_OUT = PROTO_ROOT.parent / "shared" / "deviceplugin" / "v1beta1"
# protoc names the module by the proto's path; the stubs live in the package
# shared.deviceplugin.v1beta1, so the gRPC module's import is rewritten to match.
GENERATED_IMPORT = "from deviceplugin.v1beta1 import api_pb2"
PACKAGE_IMPORT = "from shared.deviceplugin.v1beta1 import api_pb2"


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    import tempfile

    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as raw:
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"--python_out={raw}",
                f"--pyi_out={raw}",
                f"--grpc_python_out={raw}",
                str(PROTO_ROOT / PROTO_FILE),
            ]
        )
        if status != 0:
            raise SystemExit(f"protoc failed with status {status}")
        written = []
        for produced in sorted((pathlib.Path(raw) / "deviceplugin" / "v1beta1").iterdir()):
            text = produced.read_text().replace(GENERATED_IMPORT, PACKAGE_IMPORT)
            target = out_dir / produced.name
            target.write_text(text)
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
