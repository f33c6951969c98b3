"""Container images without a registry: the sandbox's pause and busybox, each one layer around a static binary,
written as docker-archive tarballs that `ctr images import` takes (run.sh imports them with the product's).

    python tests/cluster/images.py --pause PAUSE --busybox BUSYBOX --out DIR   # DIR/pause.tar, DIR/busybox.tar
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import pathlib
import subprocess
import tarfile

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BUSYBOX_IMAGE = "docker.io/library/busybox:rbln-cluster"


def single_layer(files: dict[str, pathlib.Path], links: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as layer:
        for directory in sorted({str(pathlib.PurePosixPath(p).parent) for p in [*files, *links]} - {"."}):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            layer.addfile(info)
        for path, source in files.items():
            layer.add(str(source), arcname=path)
        for path, target in links.items():
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            layer.addfile(info)
    return buffer.getvalue()


def write_image(out: pathlib.Path, reference: str, layer: bytes, config: dict) -> None:
    layer_digest = hashlib.sha256(layer).hexdigest()
    image_config = json.dumps({"architecture": "amd64", "os": "linux", "config": config,
                               "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]}}).encode()
    config_name = f"{hashlib.sha256(image_config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference],
                            "Layers": [f"{layer_digest}/layer.tar"]}]).encode()
    with tarfile.open(out, mode="w") as archive:
        for name, data in ((f"{layer_digest}/layer.tar", layer), (config_name, image_config),
                           ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pause", type=pathlib.Path, required=True, help="a static pause binary")
    parser.add_argument("--busybox", type=pathlib.Path, required=True, help="a static busybox binary")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="where pause.tar and busybox.tar go")
    args = parser.parse_args()
    write_image(args.out / "pause.tar", PAUSE_IMAGE, single_layer({"pause": args.pause}, {}),
                {"Entrypoint": ["/pause"]})
    applets = subprocess.run([str(args.busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    links = {f"bin/{applet}": "busybox" for applet in applets if applet != "busybox"}
    write_image(args.out / "busybox.tar", BUSYBOX_IMAGE, single_layer({"bin/busybox": args.busybox}, links),
                {"Env": ["PATH=/bin"], "Cmd": ["sh"]})


if __name__ == "__main__":
    main()
