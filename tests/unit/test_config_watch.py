"""engine/config_watch.py: settle before reading, torn reads retried, same bytes not re-parsed, racy stamps."""

from __future__ import annotations

import os

from shaperd.core.config import limits as config_limits
from shaperd.engine import config_watch
from shaperd.engine.config_watch import ConfigWatch, stamp


class Wall:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def far_future(path) -> Wall:
    return Wall(os.stat(path).st_mtime + 1000)  # no racy re-checks unless a test wants them


def test_a_change_is_read_only_once_its_stamp_has_settled(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("a: 1\n")
    w = ConfigWatch(str(p), wall=far_future(p))
    assert w.read().text == "a: 1\n"
    assert not w.due(0.0)
    p.write_text("a: 22\n")
    assert not w.due(1.0)  # seen, not read yet
    assert w.poll_interval_s(1.0) == config_watch.SETTLE_S
    p.write_text("a: 333\n")
    assert not w.due(1.25)  # changed again: still settling
    assert w.due(1.5)  # unchanged for one settle period
    assert w.read().text == "a: 333\n"
    assert w.poll_interval_s(1.0) == 1.0


def test_a_file_rewritten_without_pause_is_read_after_max_defer(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("x")
    w = ConfigWatch(str(p), wall=far_future(p))
    w.read()
    t = 0.0
    results = []
    for i in range(40):
        p.write_text("y" * (i + 2))  # a new size each time: the stamp never settles
        t += 0.25
        results.append(w.due(t))
    first = results.index(True)
    assert 0.25 * first >= config_watch.MAX_DEFER_S - 0.25 and 0.25 * first <= config_watch.MAX_DEFER_S + 0.5


def test_a_read_that_sees_the_file_change_is_torn_and_retried(tmp_path, monkeypatch):
    p = tmp_path / "t.yaml"
    p.write_text("good: 1\n")
    w = ConfigWatch(str(p), wall=far_future(p))
    real = config_limits.read_capped

    def racing_read(path):
        data = real(path)[:4]  # what a reader saw half-way...
        p.write_text("good: 2 and longer\n")  # ...while the writer finished
        return data

    monkeypatch.setattr(config_limits, "read_capped", racing_read)
    got = w.read()
    assert got.torn and got.text is None and not got.new and w.torn_reads == 1
    monkeypatch.setattr(config_limits, "read_capped", real)
    assert not w.due(10.0) and w.due(10.3)  # a change to settle, then read
    assert w.read().text == "good: 2 and longer\n"


def test_same_bytes_are_not_new_unless_forced(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("a: 1\n")
    w = ConfigWatch(str(p), wall=far_future(p))
    assert w.read().new
    os.utime(p, ns=(0, os.stat(p).st_mtime_ns + 10**9))  # touched: a new stamp, the same bytes
    assert not w.due(0.0) and w.due(0.3)
    assert not w.read().new
    assert w.read(force=True).text == "a: 1\n"


def test_same_size_rewrite_inside_one_timestamp_tick_is_caught_by_the_racy_rule(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("limit: 10\n")
    st = os.stat(p)
    wall = Wall(st.st_mtime + 0.5)  # read half a second after the write: a racy stamp
    w = ConfigWatch(str(p), wall=wall)
    assert w.read().text == "limit: 10\n"
    with open(p, "r+") as f:  # same inode, same size
        f.write("limit: 20\n")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime: the stamp cannot tell
    assert stamp(str(p)) == w.read_stamp
    assert w.due(1.0)  # racy: the bytes are compared again
    assert w.read().text == "limit: 20\n"
    wall.t = st.st_mtime + 10  # old enough now: the stamp is trusted, no more re-reads
    w.read(force=True)
    assert not w.due(2.0)


def test_missing_and_oversized_files_are_typed_errors(tmp_path):
    p = tmp_path / "t.yaml"
    w = ConfigWatch(str(p), wall=Wall())
    got = w.read()
    assert got.error is not None and "cannot read file" in str(got.error)
    assert not w.due(0.0)  # still missing: nothing new
    with open(p, "wb") as f:
        f.truncate(config_limits.MAX_FILE_BYTES + 1)
    assert not w.due(1.0) and w.due(1.3)
    got = w.read()
    assert got.error is not None and "8,388,609 bytes" in str(got.error)
    p.write_bytes(b"\xff\xfe")
    got = ConfigWatch(str(p), wall=Wall()).read()
    assert got.error is not None and "not UTF-8" in str(got.error)
