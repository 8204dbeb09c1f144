"""core/atomicfile.py, the one atomic writer: rename over the target, file and directory fsynced in order,
mode and owner kept for an edit, each failing step named, nothing left behind. On tmp_path only."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from shaperd.core import atomicfile
from shaperd.core.atomicfile import AtomicWriteError, write_atomic
from shaperd.rdma import opensm_host


class FsyncLog:
    """os.fsync spy: what each fsync'd descriptor was, and what the target held at that moment."""

    def __init__(self, monkeypatch, target: Path, fail_on: str | None = None):
        self.target = target
        self.calls: list[tuple[str, bytes | None]] = []
        self.fail_on = fail_on
        self._fsync = os.fsync
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        st = os.fstat(fd)
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
        if kind == "dir":
            assert st.st_ino == self.target.parent.stat().st_ino, "fsync of another directory"
        self.calls.append((kind, self.target.read_bytes() if self.target.exists() else None))
        if kind == self.fail_on:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self._fsync(fd)


def leftovers(d: Path, *keep: str) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name not in keep)


def test_a_new_file_gets_its_data_and_mode_and_no_temporary_file_remains(tmp_path):
    target = tmp_path / "a.env"
    assert write_atomic(target, b"A=1\n", 0o640) == target
    assert target.read_bytes() == b"A=1\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == ["a.env"]


def test_the_file_is_fsynced_before_the_rename_and_the_directory_after_it(tmp_path, monkeypatch):
    target = tmp_path / "a.env"
    target.write_bytes(b"old\n")
    log = FsyncLog(monkeypatch, target)
    write_atomic(target, b"new\n")
    # The file's fsync sees the old content still in place (not yet renamed); the directory's, the new one.
    assert log.calls == [("file", b"old\n"), ("dir", b"new\n")]


def test_the_target_is_replaced_by_rename_not_rewritten_in_place(tmp_path):
    target = tmp_path / "a.env"
    target.write_bytes(b"old\n")
    with target.open("rb") as reader_before:
        write_atomic(target, b"new\n")
        assert reader_before.read() == b"old\n"  # an open reader keeps the old file whole
    assert target.read_bytes() == b"new\n"


def test_a_failed_write_leaves_the_target_and_no_temporary_file_and_names_the_step(tmp_path, monkeypatch):
    target = tmp_path / "a.env"
    target.write_bytes(b"old\n")
    FsyncLog(monkeypatch, target, fail_on="file")
    with pytest.raises(AtomicWriteError) as e:
        write_atomic(target, b"new\n")
    assert e.value.errno == errno.EIO and e.value.strerror == os.strerror(errno.EIO)
    assert str(e.value) == f"write {target}: Input/output error"
    assert target.read_bytes() == b"old\n" and leftovers(tmp_path) == ["a.env"]


def test_a_failed_directory_fsync_is_an_error_after_the_file_was_replaced(tmp_path, monkeypatch):
    target = tmp_path / "a.env"
    FsyncLog(monkeypatch, target, fail_on="dir")
    with pytest.raises(AtomicWriteError) as e:
        write_atomic(target, b"new\n")
    assert str(e.value) == f"fsync directory {tmp_path} after replacing a.env: Input/output error"
    assert target.read_bytes() == b"new\n" and leftovers(tmp_path) == ["a.env"]


def test_a_missing_directory_is_still_a_file_not_found_error(tmp_path):
    target = tmp_path / "gone" / "a.env"
    with pytest.raises(FileNotFoundError) as e:  # callers tell "the directory is gone" by this class
        write_atomic(target, b"x")
    assert isinstance(e.value, AtomicWriteError) and e.value.errno == errno.ENOENT
    assert str(e.value) == f"create a temporary file in {target.parent}: No such file or directory"


def test_without_edit_a_symlink_is_replaced_by_the_file(tmp_path):
    real = tmp_path / "real"
    real.write_bytes(b"theirs\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert write_atomic(link, b"ours\n") == link
    assert not link.is_symlink() and link.read_bytes() == b"ours\n" and real.read_bytes() == b"theirs\n"


def test_an_edit_follows_the_symlink_and_keeps_mode_and_owner(tmp_path, monkeypatch):
    real = tmp_path / "etc" / "opensm.conf"
    real.parent.mkdir()
    real.write_bytes(b"old\n")
    real.chmod(0o600)
    link = tmp_path / "opensm.conf"
    link.symlink_to(real)
    st = real.stat()
    chowns = []
    monkeypatch.setattr(os, "fchown", lambda fd, uid, gid: chowns.append((stat.S_ISREG(os.fstat(fd).st_mode),
                                                                            uid, gid)))
    log = FsyncLog(monkeypatch, real)
    assert write_atomic(link, b"new\n", 0o644, edit=True) == real
    assert link.is_symlink() and real.read_bytes() == b"new\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o600  # the old mode, not the 0644 asked for a new file
    assert chowns == [(True, st.st_uid, st.st_gid)]
    assert log.calls == [("file", b"old\n"), ("dir", b"new\n")]
    assert leftovers(real.parent) == ["opensm.conf"]


def test_an_edit_that_may_not_chown_still_writes(tmp_path, monkeypatch):
    target = tmp_path / "opensm.conf"
    target.write_bytes(b"old\n")

    def refused(fd, uid, gid):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "fchown", refused)
    write_atomic(target, b"new\n", edit=True)
    assert target.read_bytes() == b"new\n"


def test_an_edit_of_a_new_file_gets_the_mode_asked_for_and_no_chown(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fchown", lambda *a: pytest.fail("a new file is not chowned"))
    target = tmp_path / "new.conf"
    write_atomic(target, b"x\n", 0o644, edit=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_the_opensm_writer_is_this_writer_and_its_errors_read_as_verb_object_cause(tmp_path, monkeypatch):
    target = tmp_path / "opensm.conf"
    target.write_bytes(b"old\n")
    target.chmod(0o600)
    log = FsyncLog(monkeypatch, target)
    assert opensm_host.write_atomic(target, "qos TRUE\n\udcff\n") == target
    assert target.read_bytes() == b"qos TRUE\n\xff\n"  # bytes that were not UTF-8 come back as they were
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [k for k, _ in log.calls] == ["file", "dir"]
    log.fail_on = "file"
    with pytest.raises(opensm_host.SmHostError) as e:
        opensm_host.write_atomic(target, "x\n")
    assert str(e.value) == f"write {target}: Input/output error"
    assert isinstance(e.value.__cause__, atomicfile.AtomicWriteError)
    with pytest.raises(opensm_host.SmHostError) as e:
        opensm_host.write_atomic(tmp_path / "gone" / "opensm.conf", "x\n")
    assert str(e.value) == f"create a temporary file in {tmp_path / 'gone'}: No such file or directory"
