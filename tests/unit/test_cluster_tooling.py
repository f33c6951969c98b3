"""The cluster scenarios' tooling, without Go or root: the cluster harness pins the conformance harness's
k8s.io/kubernetes release with that release's staging replaces, and the images without a registry are
docker-archives `ctr images import` takes."""

import json
import pathlib
import re
import tarfile

from tests.cluster.images import single_layer, write_image
from tests.conformance.pin_kubelet import HARNESS, staging_version
from tests.unit.test_dra_tooling import kubernetes_release

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLUSTER_HARNESS = ROOT / "tests" / "cluster" / "harness"


def test_the_cluster_harness_pins_the_conformance_harness_release_and_its_staging_replaces():
    release = kubernetes_release(CLUSTER_HARNESS)
    assert release == kubernetes_release(HARNESS)
    replaces = re.findall(r"^\s+(k8s\.io/\S+) => (\S+) (\S+)$", (CLUSTER_HARNESS / "go.mod").read_text(), re.M)
    assert replaces and all(old == new and version == staging_version(release) for old, new, version in replaces)


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
