"""The parser (shared/cdi/spec.py, shared/cdi/spec_dirs.py) held to the CDI reference library on the seeded
family of tests/support/cdi_spec_family.py: for every file, the same verdict (valid or refused) and, when valid, the
same devices; and across dirs, the same answer on whether rebellions.ai/npu=runtime resolves."""

from __future__ import annotations

import itertools
import pathlib
import random

import pytest

from shared.cdi.annotation import RUNTIME_DEVICE
from shared.cdi.spec import resolve
from shared.cdi.spec_dirs import SpecDirs, read_spec
from tests.support.cdi_spec_family import MUTATIONS, family


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_file_of_the_family_gets_the_library_s_verdict(tmp_path, reference, seed):
    cases = list(family(seed, 3 * len(MUTATIONS)))
    dirs = []
    for index, case in enumerate(cases):
        directory = tmp_path / str(index)
        directory.mkdir()
        (directory / case.name).write_bytes(case.data)
        dirs.append(directory)
    _prefix, answers = reference.ask([{"specDirs": [str(d)]} for d in dirs])
    mismatches = []
    for case, directory, answer in zip(cases, dirs, answers, strict=True):
        path = str(directory / case.name)
        ours = read_spec(path, 0)
        library_valid = path not in answer.spec_errors
        if case.valid is not None:
            assert library_valid is case.valid, f"the family is wrong about {case.name} ({case.why})"
        our_devices = ours.devices.devices if ours.devices else frozenset()
        if (ours.error is None) != library_valid or (library_valid and our_devices != answer.devices):
            mismatches.append(f"{case.name} ({case.why or 'valid'}): ours {ours.error or sorted(our_devices)}, "
                              f"the library's {answer.spec_errors.get(path) or sorted(answer.devices)}")
    assert mismatches == []


def _runtime_spec(kind: str = "rebellions.ai/npu", name: str = "runtime", version: str = "0.5.0") -> str:
    return f"cdiVersion: {version}\nkind: {kind}\ndevices:\n- name: {name}\n  containerEdits:\n    env: [A=1]\n"


def test_resolving_across_dirs_is_the_library_s(tmp_path, reference):
    """Random layouts of two dirs, each with up to three specs that may define the device, may be refused or
    may define something else: the same verdict on rebellions.ai/npu=runtime as the library's cache."""
    rng = random.Random(5)
    contents = [_runtime_spec(), _runtime_spec(name="all"), _runtime_spec(kind="example.com/npu"),
                _runtime_spec(version="0.2.0"), _runtime_spec() + "extra: 1\n", _runtime_spec(version="1.1.0")]
    layouts = []
    for index in range(60):
        dirs = [tmp_path / str(index) / "etc-cdi", tmp_path / str(index) / "run-cdi"]
        for directory in dirs:
            directory.mkdir(parents=True)
            for file_index in range(rng.randint(0, 3)):
                suffix = rng.choice(("yaml", "json", "yml"))
                (directory / f"spec{file_index}.{suffix}").write_text(rng.choice(contents))
        layouts.append(dirs)
    _prefix, answers = reference.ask([{"specDirs": [str(d) for d in dirs], "devices": [RUNTIME_DEVICE]}
                                      for dirs in layouts])
    verdicts = [(resolve(RUNTIME_DEVICE, SpecDirs(dirs).read().specs).resolvable, answer.resolved[RUNTIME_DEVICE])
                for dirs, answer in zip(layouts, answers, strict=True)]
    assert all(ours == library for ours, library in verdicts), verdicts
    # The family reaches both verdicts, and conflicts among them.
    assert {ours for ours, _ in verdicts} == {True, False}


def test_the_library_names_the_stack_s_transient_specs_as_the_housekeeping_removes_them(reference):
    from shared.cdi.stale_specs import TRANSIENT_SPEC_PREFIX

    prefix, _ = reference.ask([])
    assert prefix == TRANSIENT_SPEC_PREFIX


def test_the_dir_order_of_the_runtime_and_the_stack_give_the_same_verdict(tmp_path, reference):
    """The stack searches CDI_ROOT first and containerd /etc/cdi first: resolving does not depend on it."""
    first, second = tmp_path / "a", tmp_path / "b"
    for directory, spec in itertools.product((first, second), ("rbln.yaml",)):
        directory.mkdir(exist_ok=True)
        (directory / spec).write_text(_runtime_spec())
    (first / "again.yaml").write_text(_runtime_spec())  # a conflict in one dir
    for order in ([first, second], [second, first]):
        answer = reference.resolve(order, devices=[RUNTIME_DEVICE])
        assert answer.resolved[RUNTIME_DEVICE] is resolve(RUNTIME_DEVICE, SpecDirs(order).read().specs).resolvable
        assert answer.resolved[RUNTIME_DEVICE] is False
    assert pathlib.Path(first / "again.yaml").exists()
