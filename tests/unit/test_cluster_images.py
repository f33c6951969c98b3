"""The cluster scenarios' images without a registry (tests/cluster/images.py): docker-archives as `ctr images
import` takes them, config and layer named by digest."""

import json
import tarfile

from tests.cluster.images import single_layer, write_image


def test_an_image_archive_names_its_config_and_layer_by_digest(tmp_path):
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF")
    layer = single_layer({"pause": binary}, {"bin/sh": "pause"})
    write_image(tmp_path / "pause.tar", "registry.k8s.io/pause:3.10", layer, {"Entrypoint": ["/pause"]})
    with tarfile.open(tmp_path / "pause.tar") as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        config = json.load(archive.extractfile(manifest["Config"]))
        (layer_name,) = manifest["Layers"]
        with tarfile.open(fileobj=archive.extractfile(layer_name)) as layer:
            members = {m.name: m for m in layer.getmembers()}
    assert manifest["RepoTags"] == ["registry.k8s.io/pause:3.10"]
    assert config["rootfs"]["diff_ids"] == [f"sha256:{layer_name.split('/')[0]}"]
    assert config["config"] == {"Entrypoint": ["/pause"]}
    assert members["pause"].isfile() and members["bin/sh"].issym() and members["bin"].isdir()
