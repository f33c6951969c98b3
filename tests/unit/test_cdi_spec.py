"""CDI specs as the reference library reads them: the seeded family of valid and invalid specs, the name
rules, resolving across spec dirs, the bounded and cached reading, and what the scanner says about it.
(tests/cdi holds the same family to the Go library itself.)"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from scanner.cdi_watch import CONSEQUENCES, CdiWatch
from shared.cdi import spec_dirs
from shared.cdi.annotation import ANNOTATION_KEY, RUNTIME_DEVICE, CdiAnnotation, allocate_annotations
from shared.cdi.spec import (
    LoadedSpec,
    Scalar,
    SpecDevices,
    SpecError,
    check_spec,
    device_name_error,
    parse_qualified_name,
    required_version,
    resolve,
    vendor_or_class_error,
)
from shared.cdi.spec_dirs import MAX_SPEC_BYTES, MAX_SPECS_PER_DIR, SpecDirs, parse_spec_text, read_spec
from shared.config import ConfigError, Settings
from tests.support.cdi_spec_family import MUTATIONS, family

TOOLKIT_SPEC = """---
cdiVersion: 0.5.0
kind: rebellions.ai/npu
devices:
- name: runtime
  containerEdits:
    env: [RBLN_VISIBLE_DEVICES=all]
"""


@pytest.mark.parametrize("seed", range(4))
def test_every_valid_spec_of_the_family_defines_its_devices_and_every_mutation_is_refused(seed):
    cases = list(family(seed, 2 * len(MUTATIONS)))
    for case in cases:
        if case.valid is None:
            continue
        try:
            found = check_spec(parse_spec_text(case.data))
        except SpecError as exc:
            assert not case.valid, f"{case.name} refused: {exc}\n{case.data.decode(errors='replace')}"
        else:
            assert case.valid, f"{case.name} ({case.why}) accepted:\n{case.data.decode()}"
            assert found.devices == case.devices
    assert sum(case.valid is False for case in cases) > len(MUTATIONS)


def test_each_mutation_is_refused_with_a_reason_of_its_own():
    reasons = {case.why: check_or_reason(case.data) for case in family(11, len(MUTATIONS)) if case.valid is False}
    assert all(isinstance(reason, str) and reason for reason in reasons.values()), reasons
    assert len(set(reasons.values())) > len(reasons) // 2  # reasons say what is wrong, not just "invalid"


def check_or_reason(data: bytes) -> str | SpecDevices:
    try:
        return check_spec(parse_spec_text(data))
    except SpecError as exc:
        return str(exc)


@pytest.mark.parametrize("name,valid", [
    ("runtime", True), ("0", True), ("a:b", True), ("x.y-z_1", True), ("R", True),
    ("", False), ("-a", False), ("a-", False), ("a b", False), ("a/b", False), ("é", False), ("aé", False),
    ("a=b", False),
])
def test_device_names_follow_the_library(name, valid):
    assert (device_name_error(name) is None) is valid


@pytest.mark.parametrize("name,valid", [
    ("rebellions.ai", True), ("a", True), ("vendor-x_1", True), ("Z9", True),
    ("1a", False), ("a.", False), ("a:b", False), ("", False), ("a b", False),
])
def test_vendor_and_class_names_follow_the_library(name, valid):
    assert (vendor_or_class_error(name, "vendor") is None) is valid


def test_qualified_names():
    assert parse_qualified_name(RUNTIME_DEVICE) == ("rebellions.ai", "npu", "runtime")
    for bad in ("rebellions.ai/npu", "npu=runtime", "/dev/npu=x", "rebellions.ai/npu=", "a/b/c=x", "=x"):
        with pytest.raises(SpecError, match="not a qualified CDI device name"):
            parse_qualified_name(bad)


def _spec(kind: str = "rebellions.ai/npu", version: str = "0.3.0", **extra) -> dict:
    return {"cdiVersion": Scalar(version, True), "kind": Scalar(kind, True),
            "devices": [{"name": Scalar("runtime", True), "containerEdits": {"env": [Scalar("A=1", True)]}}],
            **extra}


def test_the_version_must_cover_the_features_used():
    assert check_spec(_spec()).devices == {RUNTIME_DEVICE}
    with pytest.raises(SpecError, match=r"needs at least 0\.6\.0"):
        check_spec(_spec(kind="rebellions.ai/npu.v2", version="0.5.0"))
    assert check_spec(_spec(kind="rebellions.ai/npu.v2", version="v0.6.0")).kind == "rebellions.ai/npu.v2"
    with pytest.raises(SpecError, match="invalid cdiVersion"):
        check_spec(_spec(version="0.2.5"))


def test_required_version_is_the_newest_feature_s():
    from shared.cdi.spec import _SPEC

    decoded = _SPEC(_spec(annotations={"a": Scalar("b")}), "spec")
    assert required_version(decoded) == "0.6.0"


def _loaded(path: str, index: int, *devices: str) -> LoadedSpec:
    return LoadedSpec(path, index, devices=SpecDevices("rebellions.ai/npu", frozenset(devices)))


def test_a_later_directory_overrides_an_earlier_one_but_two_specs_of_one_directory_conflict():
    assert resolve(RUNTIME_DEVICE, [_loaded("/etc/cdi/a.yaml", 0, RUNTIME_DEVICE),
                                    _loaded("/var/run/cdi/b.yaml", 1, RUNTIME_DEVICE)]).resolvable
    conflict = resolve(RUNTIME_DEVICE, [_loaded("/etc/cdi/a.yaml", 0, RUNTIME_DEVICE),
                                        _loaded("/etc/cdi/b.yaml", 0, RUNTIME_DEVICE),
                                        _loaded("/var/run/cdi/c.yaml", 1, RUNTIME_DEVICE)])
    assert not conflict.resolvable and conflict.conflict == ("/etc/cdi/a.yaml", "/etc/cdi/b.yaml")
    refused = LoadedSpec("/etc/cdi/bad.yaml", 0, error="no spec data")
    assert not resolve(RUNTIME_DEVICE, [refused, _loaded("/etc/cdi/x.json", 0, "rebellions.ai/npu=all")]).resolvable


def test_reading_json_yaml_and_skipping_what_a_runtime_skips(tmp_path):
    (tmp_path / "rbln.yaml").write_text(TOOLKIT_SPEC)
    (tmp_path / "other.yml").write_text(TOOLKIT_SPEC.replace("runtime", "yml"))  # not a spec to the library
    (tmp_path / "sub.json").mkdir()
    (tmp_path / "gpu.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "example.com/gpu", "devices": [
        {"name": "g0", "containerEdits": {"env": ["A=1"]}}]}))
    os.mkfifo(tmp_path / "fifo.yaml")  # never blocks the scan
    view = SpecDirs([tmp_path]).read()
    by_name = {pathlib.Path(spec.path).name: spec for spec in view.specs}
    assert sorted(by_name) == ["fifo.yaml", "gpu.json", "rbln.yaml"]
    assert by_name["rbln.yaml"].devices.devices == {RUNTIME_DEVICE}
    assert by_name["gpu.json"].devices.devices == {"example.com/gpu=g0"}
    assert by_name["fifo.yaml"].error == "not a regular file"


def test_bounds_on_hostile_dirs(tmp_path):
    (tmp_path / "huge.yaml").write_bytes(b"#" * (MAX_SPEC_BYTES + 1))
    assert read_spec(str(tmp_path / "huge.yaml"), 0).error == f"larger than {MAX_SPEC_BYTES} bytes"
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefg", "bcdefgh", strict=True))
    (tmp_path / "bomb.yaml").write_text(bomb)
    assert "nodes" in read_spec(str(tmp_path / "bomb.yaml"), 0).error
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert read_spec(str(tmp_path / "deep.json"), 0).error
    many = tmp_path / "many"
    many.mkdir()
    for index in range(MAX_SPECS_PER_DIR + 5):
        (many / f"s{index:04}.json").write_text("{}")
    view = SpecDirs([many]).read()
    assert len(view.specs) == MAX_SPECS_PER_DIR and "only the first" in view.dir_errors[0]


def test_an_unchanged_file_is_not_read_again_and_a_changed_one_is(tmp_path, monkeypatch):
    spec = tmp_path / "rbln.yaml"
    spec.write_text(TOOLKIT_SPEC)
    reads: list[str] = []
    real = spec_dirs.read_spec
    monkeypatch.setattr(spec_dirs, "read_spec", lambda path, index: (reads.append(path), real(path, index))[1])
    now = [time.time_ns()]
    dirs = SpecDirs([tmp_path, tmp_path / "missing"], clock=lambda: now[0])
    # Read within a second of the file's last change: it may change again within the same clock tick.
    assert resolve(RUNTIME_DEVICE, dirs.read().specs).resolvable
    assert resolve(RUNTIME_DEVICE, dirs.read().specs).resolvable
    assert reads == [str(spec)] * 2
    now[0] += 2 * 10**9  # settled: each later scan only looks at the file's times
    for _ in range(3):
        assert resolve(RUNTIME_DEVICE, dirs.read().specs).resolvable
    assert reads == [str(spec)] * 3
    spec.write_text(TOOLKIT_SPEC.replace("runtime", "other"))
    assert not resolve(RUNTIME_DEVICE, dirs.read().specs).resolvable
    assert len(reads) == 4
    spec.unlink()
    assert dirs.read().specs == ()


def test_yaml_is_imported_only_when_a_spec_is_not_json(tmp_path):
    (tmp_path / "gpu.json").write_text(json.dumps({"cdiVersion": "0.3.0", "kind": "example.com/gpu", "devices": [
        {"name": "g0", "containerEdits": {"env": ["A=1"]}}]}))
    program = ("import sys, pathlib; from shared.cdi.spec_dirs import SpecDirs; "
               f"SpecDirs([pathlib.Path({str(tmp_path)!r})]).read(); print('yaml' in sys.modules)")
    run = [sys.executable, "-c", program]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip() == "False"
    (tmp_path / "rbln.yaml").write_text(TOOLKIT_SPEC)
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip() == "True"


@pytest.mark.parametrize("policy", list(CdiAnnotation))
def test_the_scanner_warns_at_start_and_on_each_change_only(tmp_path, logs, policy):
    root, static = tmp_path / "cdi", tmp_path / "etc-cdi"
    root.mkdir()
    watch = CdiWatch([root, static], policy)
    assert not watch.check().resolvable
    assert not watch.check().resolvable
    [warning] = [r for r in logs if r["msg"] == "CDI device unresolvable"]
    assert warning["level"] == "WARNING" and warning["cdiDevice"] == RUNTIME_DEVICE
    assert warning["specDirs"] == [str(root), str(static)] and warning["consequence"] == CONSEQUENCES[policy]
    (root / "rbln.yaml").write_text(TOOLKIT_SPEC)
    state = watch.check()
    assert state.resolvable and state.defined_in == (str(root / "rbln.yaml"),)
    (root / "broken.json").write_text("{")
    watch.check()
    watch.check()
    (root / "rbln.yaml").unlink()
    assert not watch.check().resolvable
    assert [(r["level"], r["msg"]) for r in logs] == [
        ("WARNING", "CDI device unresolvable"), ("INFO", "CDI device resolvable"),
        ("WARNING", "CDI spec refused; a runtime ignores it"), ("WARNING", "CDI device unresolvable")]


def test_a_conflict_is_named_in_the_warning_and_the_status(tmp_path, logs):
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(TOOLKIT_SPEC)
    state = CdiWatch([tmp_path], CdiAnnotation.WHEN_RESOLVABLE).check()
    assert not state.resolvable and state.record().conflict == (str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"))
    assert "specs of one directory both define it" in logs[-1]["err"]


@pytest.mark.parametrize("policy,resolvable,annotated", [
    (CdiAnnotation.ALWAYS, False, True), (CdiAnnotation.ALWAYS, True, True),
    (CdiAnnotation.WHEN_RESOLVABLE, False, False), (CdiAnnotation.WHEN_RESOLVABLE, True, True),
    (CdiAnnotation.NEVER, False, False), (CdiAnnotation.NEVER, True, False),
])
def test_the_annotation_per_setting(policy, resolvable, annotated):
    expected = {ANNOTATION_KEY: RUNTIME_DEVICE} if annotated else {}
    assert allocate_annotations(policy, resolvable) == expected


def test_settings():
    settings = Settings.from_environ({"CDI_ROOT": "/var/run/cdi", "CDI_ANNOTATION": "when-resolvable"})
    assert settings.cdi_annotation is CdiAnnotation.WHEN_RESOLVABLE
    assert settings.cdi_spec_dirs == (pathlib.Path("/var/run/cdi"), pathlib.Path("/etc/cdi"))
    assert Settings.from_environ({"CDI_SPEC_DIRS": "/a::/b"}).cdi_spec_dirs == (pathlib.Path("/a"), pathlib.Path("/b"))
    for env, message in ((("CDI_ANNOTATION", "sometimes"), "invalid CDI_ANNOTATION 'sometimes': not one of always, "
                                                           "when-resolvable, never"),
                         (("CDI_SPEC_DIRS", "etc/cdi"), "invalid CDI_SPEC_DIRS 'etc/cdi': 'etc/cdi' is not an "
                                                        "absolute path"),
                         (("CDI_SPEC_DIRS", ":"), "invalid CDI_SPEC_DIRS ':': names no directory")):
        with pytest.raises(ConfigError) as caught:
            Settings.from_environ(dict([env]))
        assert str(caught.value) == message


def test_status_shows_the_verdict_the_dirs_and_refused_specs(tmp_path):
    from rbln_device_plugin.status import build_report, render_text
    from tests.support.status_samples import running, scanner_status

    programs = running()
    (tmp_path / "rbln.yaml").write_text(TOOLKIT_SPEC.replace("kind:", "kinds:"))
    watch = CdiWatch([tmp_path], CdiAnnotation.WHEN_RESOLVABLE)
    cdi = watch.check().record(watch.dirs, CdiAnnotation.WHEN_RESOLVABLE.value).to_json()
    report = build_report(programs, {**scanner_status(programs, npu=1), "cdi": cdi}, {}, 50.5)
    assert report["cdi"]["resolvable"] is False and report["cdi"]["refusedSpecCount"] == 1
    lines = [line for line in render_text(report).splitlines() if line.startswith("cdi:")]
    assert lines[0].startswith(f"cdi: {RUNTIME_DEVICE} UNRESOLVABLE: no valid spec defines it")
    assert lines[1] == f"cdi: spec dirs {tmp_path}; annotation when-resolvable"
    assert lines[2].startswith(f"cdi: spec refused: {tmp_path / 'rbln.yaml'}: spec: field 'kinds'")
    (tmp_path / "rbln.yaml").write_text(TOOLKIT_SPEC)
    cdi = watch.check().record(watch.dirs, CdiAnnotation.WHEN_RESOLVABLE.value).to_json()
    report = build_report(programs, {**scanner_status(programs, npu=1), "cdi": cdi}, {}, 50.5)
    assert f"cdi: {RUNTIME_DEVICE} resolvable (defined in {tmp_path / 'rbln.yaml'})" in render_text(report)


@pytest.mark.parametrize("cdi,expected", [({"resolvable": True}, 1.0), ({"resolvable": False}, 0.0),
                                          ({"resolvable": "yes"}, None), (None, None)])
def test_the_metric_is_the_scanner_s_verdict(cdi, expected):
    from kubelet_watchdog.probes import current_status
    from kubelet_watchdog.stack_metrics import StackView, state_samples
    from tests.support.status_samples import running, scanner_status

    programs = running()
    scanner = {**scanner_status(programs, npu=1), **({"cdi": cdi} if cdi is not None else {})}
    samples = {family.name: v for family, _labels, v in
               state_samples(StackView(current_status(scanner, programs, "scanner"), {}, True))}
    assert samples.get("rbln_device_plugin_cdi_spec_resolvable") == expected
