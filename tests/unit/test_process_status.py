"""Status files: replaced whole, and written without new space once a process has its spare."""

from __future__ import annotations

import os

from shared import process_status


def test_a_status_is_written_over_the_spare_and_exchanged_for_the_old_one(tmp_path):
    process_status.write_status(tmp_path, "scanner", {"scans": 1})
    process_status.write_status(tmp_path, "scanner", {"scans": 2})
    status = process_status.status_file(tmp_path, "scanner")
    spare = tmp_path / ".status-scanner.spare"
    first = status.stat().st_ino
    process_status.write_status(tmp_path, "scanner", {"scans": 3})
    assert process_status.read_status(tmp_path, "scanner")["scans"] == 3
    assert spare.stat().st_ino == first, "the old status became the spare"
    assert status.stat().st_size == spare.stat().st_size == 4096
    process_status.remove_status(tmp_path, "scanner")
    assert list(tmp_path.iterdir()) == []


def test_with_no_new_space_a_status_of_the_same_size_class_is_still_written(tmp_path, monkeypatch):
    process_status.write_status(tmp_path, "watchdog", {"n": 0})
    process_status.write_status(tmp_path, "watchdog", {"n": 1})

    def no_space(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    monkeypatch.setattr(process_status.tempfile, "NamedTemporaryFile", no_space)
    for n in range(2, 6):
        process_status.write_status(tmp_path, "watchdog", {"n": n})
        assert process_status.read_status(tmp_path, "watchdog")["n"] == n
    # One that outgrows the spare needs space: the last status stays, whole.
    process_status.write_status(tmp_path, "watchdog", {"n": 6, "devices": ["x" * 100] * 100})
    assert process_status.read_status(tmp_path, "watchdog")["n"] == 5
