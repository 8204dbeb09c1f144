"""The kernel event socket's drain: overflow is a resync, not a silent loop; other errors are errors."""

from __future__ import annotations

import errno

import pytest

from shaperd.core.errors import KernelError
from shaperd.kernel import events, nlmsg


def msg(typ: int) -> bytes:
    return nlmsg.header(nlmsg.HDR.size, typ, 0, 0)


class FakeSock:
    def __init__(self, script):
        self.script = list(script)
        self.reads = 0

    def recv(self, _n):
        self.reads += 1
        item = self.script.pop(0) if self.script else BlockingIOError()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self):
        pass


def test_counts_link_and_tc_events():
    ev = events.KernelEvents(sock=FakeSock([msg(events.RTM_NEWLINK) + msg(36), msg(events.RTM_DELLINK)]))
    assert ev.drain() == events.Drained(links=2, tcs=1, overflow=False)
    assert not ev.drain().any


def test_enobufs_is_reported_as_overflow_and_reading_goes_on():
    sock = FakeSock([OSError(errno.ENOBUFS, "No buffer space available"), msg(36)])
    d = events.KernelEvents(sock=sock).drain()
    assert d.overflow and d.tcs == 1 and d.any
    assert sock.reads == 3  # ENOBUFS, the event, then "nothing pending"


def test_other_socket_errors_raise_instead_of_looping():
    ev = events.KernelEvents("ns1", sock=FakeSock([OSError(errno.EBADF, "Bad file descriptor")]))
    with pytest.raises(KernelError) as e:
        ev.drain()
    assert str(e.value) == "read kernel events on ns1: Bad file descriptor" and e.value.errno == errno.EBADF


def test_a_storm_is_drained_in_bounded_steps():
    class Endless(FakeSock):
        def recv(self, _n):
            self.reads += 1
            return msg(36)

    sock = Endless([])
    d = events.KernelEvents(sock=sock).drain()
    assert sock.reads == events.MAX_READS_PER_DRAIN and d.tcs == events.MAX_READS_PER_DRAIN
