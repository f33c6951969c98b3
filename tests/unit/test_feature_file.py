"""NFD_FEATURE_FILE on disk: NFD's local feature-file format, atomic replacement, rewritten only on a change or
when the expiry nears, and a directory that cannot be written reported once, never fatal."""

import datetime
import os
import random
import resource
import signal

import pytest
from loguru import logger

from scanner import feature_file
from scanner.feature_file import LIFETIME_SECONDS, FeatureFile, parse, render, renewal_margin
from tests.support.hostile_files import as_unprivileged, open_to_all

START = 1_790_000_000.0  # 2026-09-21T14:13:20Z, a whole second
LABELS = {"rebellions.ai/npu.present": "true", "rebellions.ai/npu.count": "4"}


class Clock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_file_is_nfds_local_format_an_expiry_directive_then_one_label_per_line():
    text = render(LABELS, START + 3600)
    lines = text.splitlines()
    assert lines[0].startswith("# ") and not lines[0].startswith("# +")  # a comment NFD ignores
    assert lines[1] == "# +expiry-time=2026-09-21T15:13:20Z"  # Go's time.RFC3339, in UTC
    assert lines[2:] == ["rebellions.ai/npu.present=true", "rebellions.ai/npu.count=4"]
    assert text.endswith("\n")
    expiry, labels = parse(text)
    assert expiry == datetime.datetime(2026, 9, 21, 15, 13, 20, tzinfo=datetime.timezone.utc)
    assert labels == LABELS


def test_an_expiry_is_written_to_the_whole_second_whatever_the_clock_says():
    assert feature_file.expiry_text(START + 0.999) == "2026-09-21T14:13:20Z"


def test_labels_are_written_at_the_first_scan_and_not_again_while_nothing_changes(tmp_path):
    path, clock = tmp_path / "rbln-features", Clock()
    keeper = FeatureFile(path, scan_interval=5.0, wall_clock=clock)
    keeper.update(LABELS)
    first = os.stat(path)
    for _ in range(100):
        clock.now += 5
        keeper.update(dict(LABELS))
    assert os.stat(path).st_ino == first.st_ino  # never replaced
    assert parse(path.read_text())[1] == LABELS
    assert oct(first.st_mode & 0o777) == "0o644"


def test_a_changed_value_is_written_at_once(tmp_path):
    path, clock = tmp_path / "rbln-features", Clock()
    keeper = FeatureFile(path, scan_interval=5.0, wall_clock=clock)
    keeper.update(LABELS)
    clock.now += 5
    keeper.update({**LABELS, "rebellions.ai/npu.count": "3"})
    assert parse(path.read_text())[1]["rebellions.ai/npu.count"] == "3"
    keeper.update({"rebellions.ai/npu.present": "true"})
    assert parse(path.read_text())[1] == {"rebellions.ai/npu.present": "true"}


@pytest.mark.parametrize("seed", range(20))
def test_the_expiry_never_lapses_while_the_scanner_runs_and_is_renewed_rarely(tmp_path, seed):
    """Scans at jittered intervals, labels changing now and then: at every scan the file on disk holds the
    current labels with an expiry at least two intervals ahead, and an unchanged file is rewritten at most
    once per half lifetime."""
    rng = random.Random(seed)
    interval = rng.choice([0.5, 5.0, 60.0, 600.0, 3600.0])
    path, clock = tmp_path / "rbln-features", Clock()
    keeper = FeatureFile(path, scan_interval=interval, wall_clock=clock)
    labels = dict(LABELS)
    writes, last_inode, changes = 0, None, 0
    for _ in range(400):
        if rng.random() < 0.02:
            labels = {**labels, "rebellions.ai/npu.healthy": str(rng.randrange(5))}
        before = dict(parse(path.read_text())[1]) if path.exists() else None
        keeper.update(labels)
        changes += before is not None and before != labels
        expiry, on_disk = parse(path.read_text())
        assert on_disk == labels
        assert expiry is not None and expiry.timestamp() - clock.now >= 2 * interval
        inode = os.stat(path).st_ino
        writes += inode != last_inode
        last_inode = inode
        clock.now += interval * rng.uniform(0.9, 1.1)
    lifetime = max(LIFETIME_SECONDS, 4 * interval)
    renewals_allowed = (clock.now - START) / (lifetime - renewal_margin(lifetime, interval)) + 1
    assert writes <= changes + renewals_allowed + 1


def test_a_file_deleted_or_changed_by_something_else_is_written_again_and_said_once(tmp_path, logs):
    path, clock = tmp_path / "rbln-features", Clock()
    keeper = FeatureFile(path, scan_interval=5.0, wall_clock=clock)
    keeper.update(LABELS)
    written = path.read_text()
    path.unlink()
    keeper.update(LABELS)
    assert path.read_text() == written
    path.write_text(render({"rebellions.ai/npu.present": "false"}, START + 60))  # another writer
    keeper.update(LABELS)
    assert parse(path.read_text())[1] == LABELS
    with path.open("a") as appended:
        appended.write("rebellions.ai/extra=1\n")
    keeper.update(LABELS)
    assert parse(path.read_text())[1] == LABELS
    assert [r["msg"] for r in logs if r["level"] == "WARNING"] == [
        "Node feature file was changed or removed by something else; writing it again"]


def test_an_unknown_scan_leaves_the_file_as_it_is(tmp_path):
    path, clock = tmp_path / "rbln-features", Clock()
    keeper = FeatureFile(path, scan_interval=5.0, wall_clock=clock)
    keeper.update(LABELS)
    text = path.read_text()
    clock.now += LIFETIME_SECONDS  # past the renewal point, and still not renewed: nothing new is known
    keeper.update(None)
    assert path.read_text() == text


def test_stop_removes_the_file_and_a_missing_file_is_no_error(tmp_path):
    path = tmp_path / "rbln-features"
    keeper = FeatureFile(path, scan_interval=5.0)
    keeper.update(LABELS)
    keeper.remove()
    assert not path.exists()
    keeper.remove()
    keeper.update(LABELS)  # a keeper that is used again writes again
    assert parse(path.read_text())[1] == LABELS


def test_a_temp_file_a_killed_keeper_left_is_replaced_by_the_next_write_and_removed_at_stop(tmp_path):
    path = tmp_path / "rbln-features"
    leftover = feature_file.temp_path(path)
    assert leftover.name.startswith(".")  # NFD's local source skips it
    leftover.write_text("rebellions.ai/npu.count=")  # killed halfway through a write
    keeper = FeatureFile(path, scan_interval=5.0)
    keeper.update(LABELS)
    assert os.listdir(tmp_path) == ["rbln-features"] and parse(path.read_text())[1] == LABELS
    leftover.write_text("rebellions.ai/npu.count=")  # another keeper, killed after this one's last write
    keeper.remove()
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_reported_once_and_the_file_appears_when_it_exists(tmp_path, logs):
    path, clock = tmp_path / "features.d" / "rbln-features", Clock()
    keeper = FeatureFile(path, scan_interval=5.0, wall_clock=clock)
    for _ in range(5):
        keeper.update(LABELS)
        clock.now += 5
    errors = [r for r in logs if r["level"] == "ERROR"]
    assert len(errors) == 1 and errors[0]["path"] == str(path) and errors[0]["err"]
    path.parent.mkdir()
    keeper.update(LABELS)
    assert parse(path.read_text())[1] == LABELS
    assert [r["msg"] for r in logs if r["level"] == "INFO"] == ["Node feature file written again",
                                                                "Node labels updated"]
    assert os.listdir(path.parent) == ["rbln-features"]


def _errors_of_three_scans(path, labels: dict[str, str] = LABELS) -> int:
    """In a child process (it replaces the logger's sinks): the errors logged by three scans' updates."""
    errors: list[str] = []
    logger.remove()
    logger.add(lambda m: errors.append(m), level="ERROR", format="{message}")
    keeper = FeatureFile(path, scan_interval=5.0)
    for _ in range(3):
        keeper.update(labels)
    return len(errors)


def _write_with_file_size_limit(path, limit: int, labels: dict[str, str]) -> int:
    """In a forked child whose files cannot grow past `limit` bytes (what a full disk does to a write):
    the number of errors logged, as the exit status."""
    pid = os.fork()
    if pid == 0:
        code = 100
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            code = _errors_of_three_scans(path, labels)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_full_disk_keeps_the_old_file_whole_leaves_no_temp_file_and_is_reported_once(tmp_path):
    path = tmp_path / "rbln-features"
    FeatureFile(path, scan_interval=5.0).update(LABELS)
    old = path.read_text()
    many = {f"rebellions.ai/x{i}": "y" * 60 for i in range(50)}
    assert _write_with_file_size_limit(path, 256, many) == 1
    assert path.read_text() == old
    assert os.listdir(tmp_path) == ["rbln-features"]




def test_a_read_only_directory_is_reported_once_and_keeps_the_old_file(short_tmp):
    features = short_tmp / "features.d"
    features.mkdir()
    FeatureFile(features / "rbln-features", scan_interval=5.0).update({"rebellions.ai/npu.present": "false"})
    old = (features / "rbln-features").read_text()
    open_to_all(short_tmp)
    features.chmod(0o555)  # root writes regardless (CAP_DAC_OVERRIDE): the keeper runs unprivileged
    try:
        assert as_unprivileged(_errors_of_three_scans, features / "rbln-features") == 1
    finally:
        features.chmod(0o755)
    assert (features / "rbln-features").read_text() == old
    assert os.listdir(features) == ["rbln-features"]

