"""Each node label's derivation, over families of inputs: the pure functions of scanner.node_labels, then
whole scans of seeded simulated node shapes turned into labels by the scanner's NodeLabeller."""

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scanner import node_labels as nl
from scanner.discovery import scan
from scanner.feature_file import FeatureFile, parse
from scanner.main import NodeLabeller
from scanner.node_labels import NodeFacts, derive_labels, family_of, parse_driver_version
from shared.node.rbln_smi import RblnSmi
from simulator.node import KMD_VERSION, SimulatedNode, build_node
from simulator.spec import NodeSpec, PfSpec

PRODUCTS = ["RBLN-CA12", "RBLN-CA22", "RBLN-CA25", "RBLN-CR03", "RBLN-CR13"]


def is_kubernetes_label_value(value: str) -> bool:
    """apimachinery's rule, spelt out: at most 63 characters, alphanumerics at both ends, `-_.` inside."""
    if not value or len(value) > 63 or not (value[0].isascii() and value[0].isalnum()):
        return False
    if not (value[-1].isascii() and value[-1].isalnum()):
        return False
    return all(c.isascii() and (c.isalnum() or c in "-_.") for c in value)


# Driver versions

@pytest.mark.parametrize("raw, full, major, minor, patch", [
    ("3.4.0", "3.4.0", "3", "4", "0"),
    (" \t3.4.0\n", "3.4.0", "3", "4", "0"),
    ("1.2.3-rebel1", "1.2.3", "1", "2", "3"),  # the revision is not part of any label
    ("1.2.92-6d00b56", "1.2.92", "1", "2", "92"),
    ("3.5.0-rc3", "3.5.0", "3", "5", "0"),
    ("1.20.300+abc123", "1.20.300", "1", "20", "300"),
    ("1.2.3~rc1", "1.2.3", "1", "2", "3"),
    ("1.2.3-rc1-build2", "1.2.3", "1", "2", "3"),
    ("1.2.3-", "1.2.3", "1", "2", "3"),
    ("1.3.73", "1.3.73", "1", "3", "73"),
])
def test_a_driver_version_splits_as_rebellions_feature_discovery_splits_it(raw, full, major, minor, patch):
    assert parse_driver_version(raw) == nl.DriverVersion(full, major, minor, patch)


@pytest.mark.parametrize("raw", ["", " \n", "3", "3.4", "3.4-rc1", "kmd-1.2.3", "-1.2.3"])
def test_a_version_without_major_minor_and_patch_is_unknown(raw):
    assert parse_driver_version(raw) is None


def test_an_unknown_or_unusable_driver_version_writes_no_version_label():
    base = NodeFacts(("RBLN-CA25",), 0, 0, 1, "")
    for raw in ["", "3.4", "kmd-1.2.3"]:
        assert not any(k.startswith("rebellions.ai/driver-version.") for k in derive_labels(
            NodeFacts(base.npu_products, 0, 0, 1, raw)))
    # Parts Kubernetes would refuse as values are left out one by one; the others stay.
    labels = derive_labels(NodeFacts(base.npu_products, 0, 0, 1, "1.2.x y"))
    assert labels[nl.DRIVER_MAJOR] == "1" and labels[nl.DRIVER_MINOR] == "2"
    assert nl.DRIVER_PATCH not in labels and nl.DRIVER_FULL not in labels


# Family and product

@pytest.mark.parametrize("product, family", [
    ("RBLN-CA12", "ATOM"), ("RBLN-CA25", "ATOM"), ("CA22", "ATOM"),
    ("RBLN-CR03", "REBEL"), ("RBLN-CR13", "REBEL"), ("CR23", "REBEL"),
    ("RBLN-XY01", None), ("", None), ("rbln-ca25", None), ("RBLN-", None),
])
def test_the_family_is_the_product_code_prefix(product, family):
    assert family_of(product) == family


def test_a_node_with_one_product_is_labelled_with_it_and_its_family():
    labels = derive_labels(NodeFacts(("RBLN-CR13",) * 8, 0, 8, 8, KMD_VERSION))
    assert labels[nl.PRODUCT] == "RBLN-CR13" and labels[nl.FAMILY] == "REBEL"


@pytest.mark.parametrize("products", [("RBLN-CA25", "RBLN-CA22"), ("RBLN-CA25", ""), ("",), ("RBLN CA25",),
                                      ("RBLN-XY01",), ("x" * 64,)])
def test_a_mixed_blank_or_unusable_product_is_left_out(products):
    labels = derive_labels(NodeFacts(products, 0, 0, 0, ""))
    assert labels[nl.COUNT] == str(len(products))
    if products == ("RBLN-XY01",):  # a product Kubernetes takes, of no known family
        assert labels[nl.PRODUCT] == "RBLN-XY01" and nl.FAMILY not in labels
    else:
        assert nl.PRODUCT not in labels and nl.FAMILY not in labels


def test_a_node_without_an_npu_says_only_that_and_its_driver_version():
    assert derive_labels(NodeFacts((), 0, 0, 0, "1.3.73")) == {
        nl.PRESENT: "false", nl.DRIVER_FULL: "1.3.73", nl.DRIVER_MAJOR: "1", nl.DRIVER_MINOR: "3",
        nl.DRIVER_PATCH: "73"}
    assert derive_labels(NodeFacts((), 0, 0, 0, "")) == {nl.PRESENT: "false"}


facts = st.builds(
    NodeFacts,
    npu_products=st.lists(st.sampled_from([*PRODUCTS, "", "RBLN CA25", "RBLN-CA25\n", "é"]), max_size=40)
    .map(tuple),
    vf1_count=st.integers(0, 64), vf4_count=st.integers(0, 64), healthy=st.integers(0, 64),
    driver_version=st.one_of(st.sampled_from(["1.3.73", "1.2.92-6d00b56", "3.4", "", "1.2.3.4"]),
                             st.text(max_size=70)))


@given(facts)
def test_every_label_is_one_of_ours_with_a_value_kubernetes_takes_and_none_is_a_guess(node):
    labels = derive_labels(node)
    assert list(labels) == [name for name in nl.ALL_LABELS if name in labels]
    assert all(is_kubernetes_label_value(value) for value in labels.values())
    assert labels[nl.PRESENT] == ("true" if node.npu_products else "false")
    if not node.npu_products:
        assert not set(labels) & {nl.COUNT, nl.PRODUCT, nl.FAMILY, nl.VF1_COUNT, nl.VF4_COUNT, nl.HEALTHY}
        return
    assert (labels[nl.COUNT], labels[nl.VF1_COUNT], labels[nl.VF4_COUNT], labels[nl.HEALTHY]) == tuple(
        map(str, (len(node.npu_products), node.vf1_count, node.vf4_count, node.healthy)))
    if nl.PRODUCT in labels:
        assert set(node.npu_products) == {labels[nl.PRODUCT]}
    elif len(set(node.npu_products)) == 1 and node.npu_products[0] in PRODUCTS:
        pytest.fail("a single known product was left out")
    assert (nl.FAMILY in labels) == (labels.get(nl.PRODUCT, "")[5:7] in ("CA", "CR"))
    version = parse_driver_version(node.driver_version)
    if version is None:
        assert not any(name.startswith("rebellions.ai/driver-version.") for name in labels)
    else:
        assert labels.get(nl.DRIVER_FULL, version.full) == version.full
        assert re.fullmatch(r"[^-+~]*", labels.get(nl.DRIVER_FULL, ""))


# Whole scans of simulated nodes

def node_labels(node: SimulatedNode, labeller: NodeLabeller | None = None) -> dict[str, str]:
    labeller = labeller or NodeLabeller(FeatureFile(node.root / "features" / "rbln-features", 5.0))
    result = scan(RblnSmi(node.rbln_smi), node.sysfs_root)
    facts = labeller.facts(result)
    assert facts is not None, result.error
    return derive_labels(facts)


def random_spec(rng: random.Random) -> NodeSpec:
    product = rng.choice(PRODUCTS)
    mixed = rng.random() < 0.2
    return NodeSpec(tuple(
        PfSpec(vf_mode=rng.choice(["none", "none", "vf1", "vf4", 2]),
               product=rng.choice(PRODUCTS) if mixed else product)
        for _ in range(rng.randint(1, 6))))


@pytest.mark.parametrize("seed", range(12))
def test_the_labels_of_seeded_node_shapes(short_tmp, seed):
    """npu.count is every NPU but the PFs hosting VFs (VFs of an unsupported count included, as they are
    NPUs on the node); the VF counts and npu.healthy count what is advertised."""
    spec = random_spec(random.Random(seed))
    node = build_node(short_tmp / "node", spec)
    labels = node_labels(node)
    plain = sum(pf.num_vfs == 0 for pf in spec.pfs)
    vfs = {n: sum(pf.num_vfs for pf in spec.pfs if pf.num_vfs == n) for n in (1, 2, 4)}
    products = {pf.product for pf in spec.pfs}
    expected = {
        nl.PRESENT: "true", nl.COUNT: str(plain + sum(vfs.values())),
        nl.DRIVER_FULL: KMD_VERSION, nl.DRIVER_MAJOR: "1", nl.DRIVER_MINOR: "3", nl.DRIVER_PATCH: "73",
        nl.VF1_COUNT: str(vfs[1]), nl.VF4_COUNT: str(vfs[4]), nl.HEALTHY: str(plain + vfs[1] + vfs[4]),
    }
    if len(products) == 1:
        (product,) = products
        expected.update({nl.PRODUCT: product, nl.FAMILY: "ATOM" if "-CA" in product else "REBEL"})
    assert labels == expected


def test_the_counts_follow_devices_and_health_within_one_scan(short_tmp):
    node = build_node(short_tmp / "node", NodeSpec.parse("3,1:vf4"))
    labeller = NodeLabeller(FeatureFile(short_tmp / "rbln-features", 5.0))

    def counts() -> tuple[str, str, str]:
        labels = node_labels(node, labeller)
        return labels[nl.COUNT], labels[nl.HEALTHY], labels[nl.VF4_COUNT]

    assert counts() == ("7", "7", "4")
    node.set_status("rbln1", 4)  # FAULT
    assert counts() == ("7", "6", "4")
    node.set_status("rbln1", None)  # unreadable after a fault: still Unhealthy, as the workers judge it
    assert counts() == ("7", "6", "4")
    node.set_status("rbln1", 0)  # recovered
    assert counts() == ("7", "7", "4")
    node.remove_device("rbln2")
    node.remove_device("rbln3-1")
    assert counts() == ("5", "5", "3")
    node.restore_device("rbln3-1")
    assert counts() == ("6", "6", "4")


def test_a_driver_upgrade_changes_the_version_labels_and_sysfs_comes_before_rbln_smi(short_tmp):
    node = build_node(short_tmp / "node", NodeSpec.parse("2"))
    node.set_driver_version("2.0.1-abc")
    labels = node_labels(node)
    assert (labels[nl.DRIVER_FULL], labels[nl.DRIVER_MAJOR], labels[nl.DRIVER_MINOR], labels[nl.DRIVER_PATCH]) \
        == ("2.0.1", "2", "0", "1")
    node.kernel_version_file("rbln0").write_text("2.0.2\n")  # what the driver says in sysfs wins
    assert node_labels(node)[nl.DRIVER_FULL] == "2.0.2"
    node.kernel_version_file("rbln0").unlink()  # an older driver without it: rbln-smi's KMD_version
    assert node_labels(node)[nl.DRIVER_FULL] == "2.0.1"


def test_a_failed_discovery_is_unknown_not_an_empty_node(short_tmp):
    node = build_node(short_tmp / "node", NodeSpec.parse("2"))
    path = short_tmp / "rbln-features"
    labeller = NodeLabeller(FeatureFile(path, 5.0))
    labeller.update(scan(RblnSmi(node.rbln_smi), node.sysfs_root))
    before = path.read_text()
    node.set_smi_fault("exit")
    result = scan(RblnSmi(node.rbln_smi), node.sysfs_root)
    assert result.error and labeller.facts(result) is None
    labeller.update(result)
    assert path.read_text() == before
    assert parse(before)[1][nl.COUNT] == "2"
