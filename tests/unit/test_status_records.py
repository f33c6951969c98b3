"""The status files' records: what a writer writes a reader reads back, keys as `status --json` and the probes
know them, and a file of another version's shape (or a broken one) reads as absent fields, never an error."""

from __future__ import annotations

import json
import os
import random

import pytest

from shared.channels import status_files, status_records
from shared.channels.status_records import (
    CdiCheck,
    DeviceState,
    DraStatus,
    RefusedSpec,
    ScannerStatus,
    WorkerStatus,
    decode,
    decode_scanner,
)
from shared.programs import WORKER_DRA

SCANNER = ScannerStatus({"rebellions.ai/npu": 4, "rebellions.ai/npu-vf1": 0}, "rbln-smi not found", 12.5,
                        CdiCheck("rebellions.ai/npu=runtime", False, ("/etc/cdi/a.yaml",), (),
                                 (RefusedSpec("/etc/cdi/b.yaml", "spec: field 'kinds'"),), 1, (), ("/etc/cdi",),
                                 "when-resolvable"))
WORKER = WorkerStatus("rebellions.ai/npu", True, 1, "plugin-1.sock", 49.0, 2, 1, 1, True,
                      {"rbln0": DeviceState("Healthy", "READY"), "rbln1": DeviceState("Unhealthy", "FAULT")})
DRA = DraStatus(True, 3, 7, 16)
RECORDS = {"scanner": SCANNER, "worker-npu": WORKER, "worker-dra": DRA}


@pytest.mark.parametrize("process", RECORDS)
def test_a_written_record_reads_back_equal_and_stamped_by_its_writer(tmp_path, process):
    record = RECORDS[process]
    status_records.write(tmp_path, process, record)
    read = decode(process, status_files.read_status(tmp_path, process))
    assert read is not None and read.stamp is not None and read.stamp.pid == os.getpid()
    assert read.stamp.monotonic is not None and read.stamp.time is not None
    assert type(read)(**{**vars(read), "stamp": None}) == record


def test_the_keys_on_disk_are_the_ones_the_probes_and_status_json_read(tmp_path):
    for process, record in RECORDS.items():
        status_records.write(tmp_path, process, record)
    on_disk = {process: json.loads(status_files.status_file(tmp_path, process).read_text())
               for process in RECORDS}
    stamp = {"process", "pid", "monotonic", "time"}
    assert set(on_disk["scanner"]) == stamp | {"resources", "discoveryError", "scanMs", "cdi"}
    assert set(on_disk["scanner"]["cdi"]) == {"device", "resolvable", "definedIn", "conflict", "refusedSpecs",
                                              "refusedSpecCount", "dirErrors", "specDirs", "annotation"}
    assert set(on_disk["worker-npu"]) == stamp | {"resource", "registered", "streams", "endpoint", "scannedAt",
                                                  "deviceCount", "healthyCount", "unhealthyCount",
                                                  "cdiResolvable", "devices"}
    assert on_disk["worker-npu"]["devices"]["rbln1"] == {"health": "Unhealthy", "status": "FAULT"}
    assert set(on_disk["worker-dra"]) == stamp | {"registered", "preparedClaims", "sliceGeneration", "devices",
                                                "healthStreams", "taintedDevices"}


def test_a_record_of_the_wrong_kind_is_not_written(tmp_path):
    with pytest.raises(TypeError, match="worker-npu's status is a WorkerStatus, not a ScannerStatus"):
        status_records.write(tmp_path, "worker-npu", SCANNER)
    assert not status_files.status_file(tmp_path, "worker-npu").exists()


def test_an_older_writers_file_reads_with_the_fields_it_predates_absent():
    worker = decode("worker-npu", {"pid": 7, "registered": True, "streams": 1})
    assert isinstance(worker, WorkerStatus) and worker.registered and worker.streams == 1
    assert (worker.devices, worker.cdi_resolvable, worker.device_count, worker.stamp.monotonic) == (None, None, None,
                                                                                                    None)
    scanner = decode_scanner({"pid": 7, "monotonic": 3})
    assert scanner is not None and (scanner.resources, scanner.cdi, scanner.stamp.monotonic) == ({}, None, 3.0)
    dra = decode("worker-dra", {"pid": 7})
    assert isinstance(dra, DraStatus) and dra == DraStatus(stamp=dra.stamp)


def test_a_newer_writers_file_reads_with_the_fields_it_added_ignored():
    newer = {**WORKER.to_json(), "pid": 7, "schema": 9, "numaNodes": [0, 1],
             "devices": {"rbln0": {"health": "Healthy", "status": "READY", "temperature": 40}}}
    worker = decode("worker-npu", newer)
    assert isinstance(worker, WorkerStatus) and worker.devices == {"rbln0": DeviceState("Healthy", "READY")}
    assert worker.registered is True and worker.endpoint == "plugin-1.sock"


@pytest.mark.parametrize("document", [None, [], "status", 7, {}, {"pid": 0}, {"pid": "7"}, {"pid": True},
                                      {"registered": True}])
def test_a_file_that_names_no_writer_reads_as_no_status(document):
    assert all(decode(process, document) is None for process in RECORDS)


def test_fields_of_the_wrong_type_read_as_absent():
    worker = decode("worker-npu", {"pid": 7, "registered": "yes", "streams": True, "healthyCount": 1.5,
                                          "devices": {"rbln0": "READY", "rbln1": {"status": 4, "health": "Healthy"}}})
    assert isinstance(worker, WorkerStatus)
    assert (worker.registered, worker.streams, worker.healthy_count) == (None, None, None)
    assert worker.devices == {"rbln0": DeviceState(None, None), "rbln1": DeviceState("Healthy", None)}
    scanner = decode_scanner({"pid": 7, "time": "soon", "resources": {"rebellions.ai/npu": "4", "x": 2},
                              "cdi": {"resolvable": "yes", "refusedSpecs": ["junk", {"path": 3}]}})
    assert scanner is not None and scanner.stamp.time is None and scanner.resources == {"x": 2}
    assert scanner.cdi == CdiCheck(refused_specs=(RefusedSpec(None, None),))


def test_any_json_document_decodes_or_reads_as_no_status():
    """Generated shapes: every reader gets a record or None, never an exception."""
    rng = random.Random(25)
    keys = ["pid", "monotonic", "time", "resources", "cdi", "registered", "streams", "devices", "scannedAt",
            "preparedClaims", "refusedSpecs", "health", "status", "rbln0"]

    def value(depth: int):
        choice = rng.randrange(8 if depth < 3 else 5)
        if choice < 5:
            return [None, True, rng.randrange(-3, 1000), rng.random() * 100, "x" * rng.randrange(3)][choice]
        if choice == 5:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        return {rng.choice(keys): value(depth + 1) for _ in range(rng.randrange(5))}

    for _ in range(2000):
        document = value(0) if rng.random() < 0.2 else {"pid": rng.choice([1, 7, 0, None, "7"]),
                                                        **{rng.choice(keys): value(1) for _ in range(6)}}
        for process in RECORDS:
            record = decode(process, json.loads(json.dumps(document)))
            assert record is None or record.stamp is not None


def test_a_change_writer_rewrites_the_file_only_when_the_record_changed(tmp_path):
    writer = status_records.ChangeWriter(tmp_path, WORKER_DRA)
    writer.write(DraStatus(registered=True, devices=8))
    path = tmp_path / f"status-{WORKER_DRA}.json"
    first = os.stat(path).st_ino
    writer.write(DraStatus(registered=True, devices=8))
    assert os.stat(path).st_ino == first, "the same record wrote nothing (no replacement to wake a reader)"
    writer.write(DraStatus(registered=True, devices=7))
    assert os.stat(path).st_ino != first
    assert status_records.decode(WORKER_DRA, status_files.read_status(tmp_path, WORKER_DRA)).devices == 7
