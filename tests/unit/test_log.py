"""The log stream (shared.observability.log) and the `logs` command (rbln_device_plugin.logs), in process."""

import argparse
import datetime
import errno
import io
import json
import logging
import os
import re
import sys
from concurrent import futures

import grpc
import pytest
from loguru import logger

from rbln_device_plugin import logs as logs_command
from shared.observability import log

PROCESS = "worker-npu"
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")


@pytest.fixture
def install():
    """`install(env)` sets the stream up for PROCESS on a StringIO and returns it with what `setup` returned;
    loguru and stdlib logging are restored after."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level

    def install(environ=None, **kwargs):
        stream = io.StringIO()
        installed = log.setup(PROCESS, {log.DIR_ENV: "", **(environ or {})}, stream, **kwargs)
        return stream, installed

    yield install
    logger.remove()
    logger.configure(extra={}, patcher=lambda record: None)
    logger.add(sys.stderr)
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def records(stream):
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_records_have_the_contract_keys_first_and_errors_under_err(install):
    stream, installed = install()
    logger.info("Completed container allocation", resourceName="rebellions.ai/npu", deviceIDs=["rbln0", "rbln1"],
                durationMs=1.5)
    try:
        raise OSError("disk gone")
    except OSError:
        logger.opt(exception=True).error("Container allocation failed")
    logger.debug("Reconciled device inventory")  # below the default level
    first, failed = records(stream)
    assert installed.fallbacks == []
    assert list(first) == ["ts", "level", "msg", "process", "resourceName", "deviceIDs", "durationMs"]
    assert first["level"] == "info" and first["process"] == PROCESS and first["deviceIDs"] == ["rbln0", "rbln1"]
    assert TS.match(first["ts"])
    age = datetime.datetime.now(datetime.timezone.utc) - log.parse_timestamp(first["ts"])
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=1)
    assert failed["level"] == "error" and failed["err"] == "OSError: disk gone"
    assert "caller" not in first


def test_timestamps_are_rfc3339nano_in_utc_and_parse_back():
    moment = datetime.datetime(2026, 8, 21, 18, 14, 2, 113000, tzinfo=datetime.timezone(datetime.timedelta(hours=9)))
    assert log.timestamp(moment) == "2026-08-21T09:14:02.113Z"
    assert log.timestamp(moment.replace(microsecond=0)) == "2026-08-21T09:14:02Z"
    assert log.parse_timestamp("2026-08-21T09:14:02.113Z") == moment
    assert log.parse_timestamp("2026-08-21T18:14:02.113000999+09:00") == moment
    with pytest.raises(ValueError):
        log.parse_timestamp("yesterday")


@pytest.mark.parametrize("setting,shown", [
    ("error", ["error"]),
    ("warning", ["warn", "error"]),
    ("WARN", ["warn", "error"]),
    ("info", ["info", "warn", "error"]),
    (" Debug ", ["debug", "info", "warn", "error"]),
])
def test_level_setting_gates_the_stream(install, setting, shown):
    stream, installed = install({log.LEVEL_ENV: setting})
    for level in ("DEBUG", "INFO", "WARNING", "ERROR"):
        logger.log(level, "event")
    assert installed.fallbacks == [] and [r["level"] for r in records(stream)] == shown
    assert installed.level == shown[0]


def test_debug_adds_caller_to_every_record(install):
    stream, _ = install({log.LEVEL_ENV: "debug"})
    line = sys._getframe().f_lineno + 1
    logger.debug("Sending device list to kubelet")
    logger.warning("Device disappeared from inventory")
    logging.getLogger("grpc._channel").info("channel state changed")
    own, warned, bridged = records(stream)
    assert own["caller"] == f"unit/test_log.py:{line}" and warned["caller"] == f"unit/test_log.py:{line + 1}"
    assert bridged["caller"].startswith("grpc._channel:")
    assert list(own)[-1] == "caller"


def test_invalid_level_and_format_fall_back_to_the_defaults_with_warnings(install):
    stream, installed = install({log.LEVEL_ENV: "verbose", log.FORMAT_ENV: "yaml"})
    assert stream.getvalue() == ""  # the caller logs them after its startup record
    assert (installed.level, installed.format) == ("info", "json")
    logger.info("Starting rbln-device-plugin")
    logger.debug("not shown at the default level")
    for fallback in installed.fallbacks:
        fallback.log()
    start, bad_level, bad_format = records(stream)  # json: the default format
    assert start["msg"] == "Starting rbln-device-plugin"
    assert (bad_level["level"], bad_level["msg"]) == ("warn", "Invalid log level; using the default")
    assert (bad_level["env"], bad_level["value"], bad_level["fallback"]) == (log.LEVEL_ENV, "verbose", "info")
    assert (bad_format["level"], bad_format["msg"]) == ("warn", "Invalid log format; using the default")
    assert (bad_format["env"], bad_format["value"], bad_format["fallback"]) == (log.FORMAT_ENV, "yaml", "json")


def test_text_format_is_one_readable_line_per_record(install):
    stream, _ = install({log.FORMAT_ENV: "text"})
    logger.warning("Device state changed", device="rbln3", health="Unhealthy", deviceCount=8,
                   deviceIDs=["rbln0", "rbln1"], err="read failed: no such file")
    (line,) = stream.getvalue().splitlines()
    ts, rest = line.split(" ", 1)
    assert TS.match(ts)
    assert rest == ('WARN  [worker-npu] Device state changed  device=rbln3 health=Unhealthy deviceCount=8 '
                    'deviceIDs=["rbln0","rbln1"] err="read failed: no such file"')


def test_an_oversized_record_is_shortened_to_one_atomic_pipe_write(install):
    stream, _ = install()
    logger.error("Container allocation failed", err="x" * 20000, deviceIDs=["rbln0"] * 2000)
    line = stream.getvalue()
    assert len(line.encode()) <= log.MAX_RECORD_BYTES and line.endswith("\n")
    (record,) = records(stream)
    assert record["msg"] == "Container allocation failed" and record["err"].endswith("…(truncated)")


def test_a_library_s_oversized_message_is_shortened_too(install):
    stream, _ = install({log.LEVEL_ENV: "debug"})
    logging.getLogger("hyperframe.frame").debug("Adding %s to the frame", "x" * 20000)
    (line,) = stream.getvalue().splitlines()
    assert len(line.encode()) < log.MAX_RECORD_BYTES
    (record,) = records(stream)
    assert record["msg"].startswith("Adding xxx") and record["component"] == "hyperframe"


def test_hpack_s_debug_records_with_the_coded_token_are_not_let_through(install):
    stream, _ = install({log.LEVEL_ENV: "debug"})
    logging.getLogger("hpack.hpack").debug("Encoded header block to %s", b"\x82\x87 bearer")
    logging.getLogger("hpack.hpack").warning("a header table overflow")
    assert [record["msg"] for record in records(stream)] == ["a header table overflow"]


def test_grpc_records_carry_component_grpc_and_its_chatter_is_debug(install):
    stream, _ = install()
    logging.getLogger("grpc._cython.cygrpc").info("Using AsyncIOEngine.POLLER")  # debug: not shown at info
    logging.getLogger("grpc._channel").warning("channel closed twice")
    (warned,) = records(stream)
    assert (warned["level"], warned["component"], warned["msg"]) == ("warn", "grpc", "channel closed twice")

    stream, _ = install({log.LEVEL_ENV: "debug"})
    logging.getLogger("grpc._cython.cygrpc").info("Using AsyncIOEngine.POLLER")
    (chatter,) = records(stream)
    assert (chatter["level"], chatter["component"]) == ("debug", "grpc")


def test_grpc_own_error_records_reach_the_stream(install):
    """A real gRPC server logs a handler's unexpected exception through Python logging."""
    stream, _ = install()

    def fail(request, context):
        raise RuntimeError("handler broke")

    handler = grpc.method_handlers_generic_handler("test.Broken", {"Call": grpc.unary_unary_rpc_method_handler(fail)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), handlers=(handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError):
                channel.unary_unary("/test.Broken/Call")(b"", timeout=5)
    finally:
        server.stop(None)
    (record,) = [r for r in records(stream) if r.get("component") == "grpc"]
    assert record["level"] == "error" and "handler broke" in record["err"]


def test_opentelemetry_errors_become_one_warning_and_its_chatter_is_debug(install):
    stream, _ = install({log.LEVEL_ENV: "debug"})
    exporter_log = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")
    exporter_log.warning("Transient error %s encountered while exporting traces", "UNAVAILABLE")
    exporter_log.error("Failed to export traces to collector:4317")
    try:
        raise ConnectionError("refused")
    except ConnectionError:
        logging.getLogger("opentelemetry.sdk._shared_internal").exception("Exception while exporting Span.")
    exporter_log.info("Reinitializing gRPC channel")
    transient, failed, crashed, chatter = records(stream)
    for record in (transient, failed, crashed):
        assert (record["level"], record["msg"], record["component"]) == ("warn", log.OTEL_ERROR_MESSAGE, "otel")
    assert transient["err"] == "Transient error UNAVAILABLE encountered while exporting traces"
    assert failed["err"] == "Failed to export traces to collector:4317"
    assert crashed["err"] == "Exception while exporting Span. (ConnectionError: refused)"
    assert (chatter["level"], chatter["msg"], chatter["component"]) == ("debug", "Reinitializing gRPC channel", "otel")


def test_each_process_writes_json_records_to_its_own_size_rotated_file(install, tmp_path):
    stream, installed = install({log.DIR_ENV: str(tmp_path / "logs"), log.FORMAT_ENV: "text"},
                                rotate_bytes=2000, keep_rotated=2)
    for index in range(200):
        logger.info("Device appeared in inventory", index=index)
    files = logs_command.log_files(tmp_path / "logs", PROCESS)
    assert installed.fallbacks == [] and installed.format == "text" and files[-1].name == f"{PROCESS}.log"
    assert len(files) == 3  # the current file and two rotated ones, however much was written
    assert all(path.stat().st_size <= 2000 for path in files)
    lines = [line for path in files for line in path.read_text().splitlines()]
    file_records = [json.loads(line) for line in lines]  # JSON although the stream is text
    assert {r["process"] for r in file_records} == {PROCESS}
    assert file_records[-1]["index"] == 199 and len(stream.getvalue().splitlines()) == 200
    assert not stream.getvalue().startswith("{")


class _BrokenStream(io.StringIO):
    """A stdout whose reader has gone: every write fails."""

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def test_the_file_has_each_record_of_the_stream_and_keeps_them_when_the_stream_fails(install, tmp_path, capsys):
    stream, _ = install({log.DIR_ENV: str(tmp_path / "logs")})
    logger.info("Device appeared in inventory", device="rbln0")
    file = tmp_path / "logs" / f"{PROCESS}.log"
    assert file.read_text() == stream.getvalue() and stream.getvalue().count("\n") == 1
    log.setup(PROCESS, {log.DIR_ENV: str(tmp_path / "logs")}, _BrokenStream())
    logger.warning("Device disappeared from inventory", device="rbln0")
    (_, kept) = [json.loads(line) for line in file.read_text().splitlines()]
    assert kept["msg"] == "Device disappeared from inventory" and kept["device"] == "rbln0"
    assert "BrokenPipeError" in capsys.readouterr().err  # loguru reports the stream's failure, as for any sink


def test_an_empty_log_dir_writes_no_file_and_an_unusable_one_falls_back(install, tmp_path):
    install({log.DIR_ENV: ""})
    logger.info("event")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    stream, installed = install({log.DIR_ENV: str(blocker / "logs")})
    (fallback,) = installed.fallbacks
    fallback.log()
    (record,) = records(stream)
    assert record["msg"] == "Log directory unavailable; logging to stdout only" and record["level"] == "warn"
    assert record["env"] == log.DIR_ENV and record["err"]
    assert list(tmp_path.iterdir()) == [blocker]


def test_a_log_file_behind_a_link_is_not_written_and_the_setting_is_named(install, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / f"{PROCESS}.log").symlink_to(victim)
    stream, installed = install({log.DIR_ENV: str(tmp_path)})
    (fallback,) = installed.fallbacks
    fallback.log()
    logger.info("event")
    assert victim.read_text() == "untouched\n"
    warning, event = records(stream)
    assert warning["msg"] == "Log directory unavailable; logging to stdout only"
    assert warning["err"] == f"{log.DIR_ENV} {tmp_path / f'{PROCESS}.log'}: is a symbolic link"
    assert event["msg"] == "event"


def test_a_log_file_that_cannot_be_written_costs_its_records_only_and_is_tried_again(install, tmp_path,
                                                                                     monkeypatch):
    log_dir = tmp_path / "logs"
    real_write = os.write
    full = {"on": False}

    def write(fd, data):
        if full["on"] and fd not in (0, 1, 2):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    stream, _ = install({log.DIR_ENV: str(log_dir)})
    monkeypatch.setattr(log.os, "write", write)
    logger.info("before")
    full["on"] = True
    for index in range(3):
        logger.info("while full", index=index)
    full["on"] = False
    logger.info("after")
    shown = [(r["msg"], r.get("path")) for r in records(stream)]
    assert shown == [("before", None), ("while full", None),
                     ("Log file not written; logging to stdout only", str(log_dir)),
                     ("while full", None), ("while full", None), ("after", None),
                     ("Log file written again", str(log_dir))]
    assert [json.loads(line)["msg"] for line in (log_dir / f"{PROCESS}.log").read_text().splitlines()] == \
        ["before", "after"]


def test_a_read_only_log_dir_at_start_is_tried_again_at_each_record(install, tmp_path, monkeypatch):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    opener = log.safe_open.opener

    def read_only(*args, **kwargs):
        open_checked = opener(*args, **kwargs)

        def refuse(path, flags):
            if refuse.read_only:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return open_checked(path, flags)

        refuse.read_only = True
        opened.append(refuse)
        return refuse

    opened: list = []
    monkeypatch.setattr(log.safe_open, "opener", read_only)
    stream, installed = install({log.DIR_ENV: str(log_dir)})
    assert installed.fallbacks == []
    logger.info("first")
    opened[0].read_only = False
    logger.info("second")
    assert [r["msg"] for r in records(stream)] == ["first", "Log file not written; logging to stdout only",
                                                   "second", "Log file written again"]
    assert [json.loads(line)["msg"] for line in (log_dir / f"{PROCESS}.log").read_text().splitlines()] == ["second"]


def test_retention_removes_only_the_process_own_rotated_files(install, tmp_path):
    """A log dir shared with other software (an operator's /var/log) loses none of their files, even
    those loguru's own retention would have taken for the process's."""
    stamp = "2020-01-01_00-00-0{}_000000"
    victim = tmp_path / "victim.log"
    victim.write_text(file_record(0, "info", "kept") + "\n")
    log_dir = tmp_path / "shared"
    log_dir.mkdir()
    others = {
        f"{PROCESS}.{stamp.format(0)}.log": json.dumps({"msg": "another program's file", "process": "other"}),
        f"{PROCESS}.{stamp.format(1)}.log.gz": file_record(0, "info", "compressed by someone else"),
        f"{PROCESS}.old.log": file_record(0, "info", "renamed by an operator"),
        f"{PROCESS}.log.1": file_record(0, "info", "logrotate's"),
        f"{PROCESS}.{stamp.format(2)}.log": file_record(0, "info", "writable by others"),
    }
    for name, text in others.items():
        (log_dir / name).write_text(text + "\n")
        (log_dir / name).chmod(0o640)
    (log_dir / f"{PROCESS}.{stamp.format(2)}.log").chmod(0o666)
    (log_dir / f"{PROCESS}.{stamp.format(3)}.log").symlink_to(victim)
    own_old = log_dir / f"{PROCESS}.{stamp.format(4)}.log"
    own_old.write_text(file_record(0, "info", "an earlier run's") + "\n")

    install({log.DIR_ENV: str(log_dir)}, rotate_bytes=2000, keep_rotated=2)
    for index in range(200):
        logger.info("Device appeared in inventory", index=index)
    for name, text in others.items():
        assert (log_dir / name).read_text() == text + "\n", name
    assert json.loads(victim.read_text())["msg"] == "kept"
    assert not own_old.exists()
    found = [str(path) for path in log_dir.iterdir()]
    own = log.own_rotated_files(log_dir, PROCESS, found)
    assert len(own) == 2 and all(json.loads(path.read_text().splitlines()[0])["msg"] == "Device appeared in inventory"
                                 for path in own)


# -- rbln-device-plugin logs ---------------------------------------------------------------------


def file_record(age_seconds, level, msg, **fields):
    moment = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=age_seconds)
    return json.dumps({"ts": log.timestamp(moment), "level": level, "msg": msg, "process": PROCESS, **fields})


def logs(capsys, log_dir, *argv):
    parser = argparse.ArgumentParser()
    logs_command.add_arguments(parser)
    code = logs_command.run(parser.parse_args([PROCESS, "--log-dir", str(log_dir), *argv]))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.fixture
def log_dir(tmp_path):
    """worker-npu's current file and two rotated ones, named so that name order is not age order;
    plus another process's file that must never show."""
    (tmp_path / f"{PROCESS}.2026-01-02_00-00-00_000000.log").write_text(
        file_record(3000, "info", "Starting rbln-device-plugin") + "\n" + file_record(2900, "debug", "Probe") + "\n")
    (tmp_path / f"{PROCESS}.2026-01-01_00-00-00_000000.log").write_text(
        file_record(2000, "warn", "Device disappeared from inventory", device="rbln1") + "\n")
    (tmp_path / f"{PROCESS}.log").write_text(
        file_record(30, "error", "Container allocation failed", err="rbln1 is Unhealthy (FAULT)") + "\n"
        + "a line that is not a record\n"
        + file_record(1, "info", "Completed container allocation", deviceIDs=["rbln0"]) + "\n")
    (tmp_path / f"{PROCESS}-vf4.log").write_text(file_record(5, "error", "Other process") + "\n")
    return tmp_path


def test_logs_shows_every_file_of_the_process_oldest_first_as_text(capsys, log_dir):
    code, lines, _ = logs(capsys, log_dir)
    assert code == 0
    assert [line.split("] ", 1)[1] if "] " in line else line for line in lines] == [
        "Starting rbln-device-plugin",
        "Probe",
        "Device disappeared from inventory  device=rbln1",
        'Container allocation failed  err="rbln1 is Unhealthy (FAULT)"',
        "a line that is not a record",
        'Completed container allocation  deviceIDs=["rbln0"]',
    ]
    assert TS.match(lines[0].split(" ")[0]) and " WARN  [worker-npu] " in lines[2]


def test_logs_filters_by_level_and_age(capsys, log_dir):
    _, lines, _ = logs(capsys, log_dir, "--level", "warning")
    assert [line.split("] ")[1].split("  ")[0] for line in lines if "] " in line] == [
        "Device disappeared from inventory", "Container allocation failed"]
    _, lines, _ = logs(capsys, log_dir, "--since", "1m", "--level", "INFO")
    assert [line.split("] ")[1].split("  ")[0] if "] " in line else line for line in lines] == [
        "Container allocation failed", "a line that is not a record", "Completed container allocation"]


def test_logs_refuses_bad_arguments_and_a_missing_file(capsys, tmp_path):
    assert logs(capsys, tmp_path, "--level", "loud")[0] == 2
    assert logs(capsys, tmp_path, "--since", "yesterday")[0] == 2
    code, lines, err = logs(capsys, tmp_path)
    assert code == 1 and lines == [] and f"no log file for {PROCESS}" in err
    parser = argparse.ArgumentParser()
    logs_command.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["worker-gpu"])
    capsys.readouterr()


def append(path, text):
    with path.open("a") as handle:
        handle.write(text)


def test_logs_follow_shows_whole_new_records_across_a_rotation(tmp_path):
    current = tmp_path / f"{PROCESS}.log"
    (tmp_path / f"{PROCESS}.2026-01-01_00-00-00_000000.log").write_text(file_record(120, "info", "rotated") + "\n")
    current.write_text(file_record(60, "info", "before following") + "\n")
    appended = file_record(0, "info", "appended in two writes") + "\n"

    def rotate():
        append(current, file_record(0, "info", "last before rotation") + "\n")
        current.rename(tmp_path / f"{PROCESS}.2026-01-02_00-00-00_000000.log")
        current.write_text(file_record(0, "warn", "first after rotation") + "\n")

    # Each poll of the follower runs the next step; then it is told to stop.
    steps = [lambda: append(current, appended[:25]), lambda: append(current, appended[25:]), rotate]

    def stopped(pause):
        assert pause == logs_command.FOLLOW_POLL_SECONDS
        if not steps:
            return True
        steps.pop(0)()
        return False

    out = io.StringIO()
    assert logs_command.show(tmp_path, PROCESS, logs_command.RecordFilter("debug", None), out, stopped) == 0
    assert [line.split("] ")[1] for line in out.getvalue().splitlines()] == [
        "rotated", "before following", "appended in two writes", "last before rotation", "first after rotation"]
