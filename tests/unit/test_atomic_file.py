"""The one atomic writer: the new content whole or the old one, never a part, and no temporary file left."""

from __future__ import annotations

import errno
import os

import pytest

from shared.fs import atomic_file


def test_a_write_replaces_the_file_whole_with_its_mode_whatever_the_umask(tmp_path):
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b"old")
    previous = os.umask(0o077)
    try:
        atomic_file.write_atomically(path, b"new" * 1000, mode=0o644)
    finally:
        os.umask(previous)
    assert path.read_bytes() == b"new" * 1000 and path.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["checkpoint.json"]


@pytest.mark.parametrize("durable", [True, False])
def test_a_full_disk_halfway_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch, durable):
    path = tmp_path / "spec.json"
    path.write_bytes(b"old")
    real_write = os.write

    def half_then_full(fd, data):
        if len(data) > 4:
            return real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_file.os, "write", half_then_full)
    with pytest.raises(OSError) as raised:
        atomic_file.write_atomically(path, b"a much longer content", durable=durable)
    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["spec.json"]


def test_a_temporary_file_a_killed_writer_left_is_replaced_by_the_next_write(tmp_path):
    path = tmp_path / "rbln-features"
    leftover = atomic_file.temp_path(path)
    assert leftover.parent == path.parent and leftover.name.startswith(".")
    leftover.write_bytes(b"half")
    atomic_file.write_atomically(path, b"whole")
    assert path.read_bytes() == b"whole" and os.listdir(tmp_path) == ["rbln-features"]


def test_a_missing_directory_is_an_error_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_file.write_atomically(tmp_path / "absent" / "file", b"x")
    assert os.listdir(tmp_path) == []
