"""Status files: replaced whole (a reader racing the writer sees whole records only), and written without new
space once a process has its spare."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from shared.channels import status_files


def test_a_status_is_written_over_the_spare_and_exchanged_for_the_old_one(tmp_path):
    status_files.write_status(tmp_path, "scanner", {"scans": 1})
    status_files.write_status(tmp_path, "scanner", {"scans": 2})
    status = status_files.status_file(tmp_path, "scanner")
    spare = tmp_path / ".status-scanner.spare"
    first = status.stat().st_ino
    status_files.write_status(tmp_path, "scanner", {"scans": 3})
    assert status_files.read_status(tmp_path, "scanner")["scans"] == 3
    assert spare.stat().st_ino == first, "the old status became the spare"
    assert status.stat().st_size == spare.stat().st_size == 4096
    status_files.remove_status(tmp_path, "scanner")
    assert list(tmp_path.iterdir()) == []


def test_with_no_new_space_a_status_of_the_same_size_class_is_still_written(tmp_path, monkeypatch):
    status_files.write_status(tmp_path, "watchdog", {"n": 0})
    status_files.write_status(tmp_path, "watchdog", {"n": 1})

    def no_space(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    monkeypatch.setattr(status_files, "write_atomically", no_space)
    for n in range(2, 6):
        status_files.write_status(tmp_path, "watchdog", {"n": n})
        assert status_files.read_status(tmp_path, "watchdog")["n"] == n
    # One that outgrows the spare needs space: the last status stays, whole.
    status_files.write_status(tmp_path, "watchdog", {"n": 6, "devices": ["x" * 100] * 100})
    assert status_files.read_status(tmp_path, "watchdog")["n"] == 5


# A writer process publishing records whose fill tells its number, of sizes that move the padding about.
_WRITER = textwrap.dedent("""
    import pathlib, sys
    from shared.channels import status_files
    run_dir, writes = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    for n in range(writes):
        status_files.write_status(run_dir, "worker-npu", {"n": n, "fill": chr(97 + n % 26) * (500 + n % 7 * 9000)})
""")


def _whole(record):
    n = record["n"]
    return record["fill"] == chr(97 + n % 26) * (500 + n % 7 * 9000)


def test_a_reader_racing_the_writer_sees_whole_records_only(tmp_path):
    status_files.write_status(tmp_path, "worker-npu", {"n": -1, "fill": "z" * 500})
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), "4000"])
    reads, last = 0, -1
    try:
        while writer.poll() is None:
            record = status_files.read_status(tmp_path, "worker-npu")
            assert record is not None, "a status file that exists read as no status"
            assert record["n"] == -1 or _whole(record), f"a torn record (number {record['n']})"
            assert record["n"] >= last, "an older record after a newer one"
            reads, last = reads + 1, record["n"]
        assert writer.wait(timeout=60) == 0
    finally:
        writer.kill()
        writer.wait()
    assert reads > 100 and status_files.read_status(tmp_path, "worker-npu")["n"] == 3999
