"""Opening what a setting names: only a plain file or directory of the stack's user, never through a link."""

import os
import stat

import pytest

from shared.fs import safe_open
from shared.fs.safe_open import UnsafePathError, ensure_private_dir, open_file
from shared.node.rsd_group import RsdGroupError, held_flock

SETTING = "SOME_SETTING"
ME = os.geteuid()


def refusal(path, **kwargs) -> str:
    with pytest.raises(UnsafePathError) as refused:
        os.close(open_file(path, os.O_RDWR | os.O_CREAT, SETTING, **kwargs))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{SETTING} {path}: ")
    return message.removeprefix(f"{SETTING} {path}: ")


def test_a_plain_file_of_the_stack_user_is_opened_or_created_with_the_given_mode(tmp_path):
    created = tmp_path / "new"
    os.close(open_file(created, os.O_RDWR | os.O_CREAT, SETTING, mode=0o640))
    assert stat.S_IMODE(created.stat().st_mode) == 0o640 & ~current_umask()
    existing = tmp_path / "existing"
    existing.write_text("kept")
    existing.chmod(0o644)
    fd = open_file(existing, os.O_RDONLY, SETTING)
    try:
        assert os.read(fd, 10) == b"kept"
        assert os.get_blocking(fd)  # the non-blocking open is undone
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("target_exists", [True, False], ids=["link", "dangling-link"])
def test_a_symbolic_link_is_refused_and_nothing_is_created_through_it(tmp_path, target_exists):
    target = tmp_path / "elsewhere"
    if target_exists:
        target.write_text("someone else's")
    link = tmp_path / "lock"
    link.symlink_to(target)
    assert refusal(link) == "is a symbolic link"
    assert target.exists() == target_exists
    if target_exists:
        assert target.read_text() == "someone else's"


def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert refusal(fifo) == "is not a regular file"
    with pytest.raises(UnsafePathError):
        open_file(fifo, os.O_WRONLY, SETTING)  # no reader: a blocking open would hang here
    directory = tmp_path / "dir"
    directory.mkdir()
    assert "Is a directory" in refusal(directory)


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_file_others_may_write_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.touch()
    shared.chmod(mode)
    assert refusal(shared) == f"is writable by group or others (mode {mode:04o})"


def test_a_file_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.touch()
    assert refusal(theirs, owner=ME + 1) == f"is owned by uid {ME}, not {ME + 1}"


def test_a_secret_must_not_even_be_readable_by_others(tmp_path):
    secret = tmp_path / "secret"
    secret.touch()
    secret.chmod(0o640)
    assert refusal(secret, forbidden=safe_open.OTHERS_ANY) == "is accessible by group or others (mode 0640)"


def test_the_private_dir_is_created_0700_or_made_so(tmp_path):
    created = tmp_path / "a" / "run"
    ensure_private_dir(created, SETTING)
    assert stat.S_IMODE(created.stat().st_mode) == 0o700
    empty_dir = tmp_path / "empty-dir"  # as the kubelet makes an emptyDir
    empty_dir.mkdir()
    empty_dir.chmod(0o777)
    ensure_private_dir(empty_dir, SETTING)
    assert stat.S_IMODE(empty_dir.stat().st_mode) == 0o700


def test_a_private_dir_that_is_a_link_a_file_or_someone_elses_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    link = tmp_path / "run"
    link.symlink_to(real)
    with pytest.raises(UnsafePathError, match=f"^{SETTING} {link}: is a symbolic link$"):
        ensure_private_dir(link, SETTING)
    assert stat.S_IMODE(real.stat().st_mode) == 0o755  # not chmod-ed through the link
    file = tmp_path / "file"
    file.touch()
    with pytest.raises(UnsafePathError, match=f"^{SETTING} {file}: is not a directory$"):
        ensure_private_dir(file, SETTING)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        ensure_private_dir(dangling, SETTING)
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(UnsafePathError, match=f"is owned by uid {ME}, not {ME + 1}"):
        ensure_private_dir(real, SETTING, owner=ME + 1)
    assert stat.S_IMODE(real.stat().st_mode) == 0o755


def test_the_rsd_lock_is_refused_through_a_link_with_the_setting_named(tmp_path):
    target = tmp_path / "victim"
    link = tmp_path / "rsd.lock"
    link.symlink_to(target)
    with pytest.raises(RsdGroupError, match=f"^RBLN_RSD_LOCK_FILE {link}: is a symbolic link$"):
        with held_flock(link, timeout=1):
            pass
    assert not target.exists()
