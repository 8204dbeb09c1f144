"""kernel/nlexchange.py's receive loop, the one every netlink reader uses: what ends an answer, the two
deadline modes (one deadline for the whole answer; or per datagram under a cap, rtnetlink's), late
answers skipped, and the fault seam only where a reader asks for it. Scripted sockets, a fake clock."""

from __future__ import annotations

import errno
import socket

import pytest

from shaperd.core.errors import KernelError
from shaperd.kernel import faults, nlmsg, rtnl
from shaperd.kernel.nlexchange import NetlinkExchange
from shaperd.kernel.rtnl import RtnlReader

ROW = 16  # RTM_NEWLINK: any type that is not DONE/ERROR


def msg(typ: int, flags: int, seq: int, payload: bytes = b"\0" * 4) -> bytes:
    return nlmsg.header(nlmsg.HDR.size + len(payload), typ, flags, seq) + payload


def ack(seq: int, code: int = 0) -> bytes:
    return msg(nlmsg.NLMSG_ERROR, 0, seq, nlmsg.I32.pack(-code) + b"\0" * 16)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedSocket:
    """recv answers from ``script(seq, n)`` (n: recvs so far for this request): bytes, or an exception."""

    def __init__(self, script, clock: Clock | None = None, step_s: float = 0.0):
        self.script, self.clock, self.step_s = script, clock, step_s
        self.seq, self.n = 0, 0
        self.timeouts: list[float] = []

    def settimeout(self, s):
        self.timeouts.append(s)

    def send(self, data: bytes) -> int:
        self.seq, self.n = nlmsg.HDR.unpack_from(data)[3], 0
        return len(data)

    def recv(self, _size: int) -> bytes:
        if self.clock is not None:
            self.clock.now += self.step_s
        self.n += 1
        out = self.script(self.seq, self.n)
        if isinstance(out, BaseException):
            raise out
        return out

    def close(self):
        pass


def request(seq: int) -> bytes:
    return nlmsg.header(nlmsg.HDR.size, 18, nlmsg.NLM_F_REQUEST | nlmsg.NLM_F_DUMP, seq)


def answer(ex, what="links", where=None):
    return [(m.type, m.seq) for _, msgs in ex._answer(request, what, where) for m in msgs]


def test_a_multipart_answer_ends_at_done_and_late_answers_to_earlier_requests_are_skipped():
    def script(seq, n):
        return {1: msg(ROW, nlmsg.NLM_F_MULTI, seq - 1) + msg(ROW, nlmsg.NLM_F_MULTI, seq),  # a late one first
                2: msg(ROW, nlmsg.NLM_F_MULTI, seq) + msg(nlmsg.NLMSG_DONE, nlmsg.NLM_F_MULTI, seq)
                + msg(ROW, nlmsg.NLM_F_MULTI, seq)}[n]  # after DONE: not part of the answer

    ex = NetlinkExchange(ScriptedSocket(script), "node", 5.0, Clock(), seq=6)
    assert answer(ex) == [(ROW, 7), (ROW, 7), (nlmsg.NLMSG_DONE, 7)]


def test_a_single_reply_ends_an_rtnetlink_get_but_an_exchange_reads_on_to_the_ack():
    def script(seq, n):
        return msg(ROW, 0, seq) if n == 1 else ack(seq)

    r = RtnlReader(sock=ScriptedSocket(script), timeout_s=5.0, clock=Clock())
    assert answer(r) == [(ROW, 1)]
    ex = NetlinkExchange(ScriptedSocket(script), "node", 5.0, Clock())
    assert answer(ex) == [(ROW, 1), (nlmsg.NLMSG_ERROR, 1)]


def trickle(seq, n):
    """One row per datagram, forever: a dump that never ends."""
    return msg(ROW, nlmsg.NLM_F_MULTI, seq)


def test_without_a_cap_one_deadline_bounds_the_whole_answer():
    clock = Clock()
    sock = ScriptedSocket(trickle, clock, step_s=2.0)
    ex = NetlinkExchange(sock, "node", 5.0, clock)
    with pytest.raises(KernelError) as e:
        answer(ex, "RDMA devices")
    assert e.value.errno == errno.ETIMEDOUT
    assert str(e.value) == "read RDMA devices on node: no complete answer from the kernel within 5 s"
    assert sock.timeouts == [5.0, 3.0, 1.0]  # what is left of the one deadline, not 5 s per recv


def test_rtnetlink_waits_timeout_s_per_datagram_and_the_cap_bounds_the_whole():
    clock = Clock()
    sock = ScriptedSocket(trickle, clock, step_s=2.0)
    r = RtnlReader(sock=sock, timeout_s=5.0, clock=clock)
    with pytest.raises(KernelError) as e:
        answer(r, "classes", "up0")
    assert str(e.value) == (f"read classes on up0: no complete answer from the kernel within "
                            f"{rtnl.ANSWER_CAP_S:g} s")
    assert len(sock.timeouts) > 100 and max(sock.timeouts[1:]) == 5.0  # each datagram gave it another 5 s


def test_rtnetlink_names_the_idle_deadline_when_the_kernel_stops_answering():
    def script(seq, n):
        return msg(ROW, nlmsg.NLM_F_MULTI, seq) if n == 1 else socket.timeout("timed out")

    r = RtnlReader(sock=ScriptedSocket(script), timeout_s=0.5, clock=Clock())
    with pytest.raises(KernelError) as e:
        answer(r, "classes", "up0")
    assert str(e.value) == "read classes on up0: no answer from the kernel within 0.5 s"


def test_a_socket_error_and_a_closed_socket_are_read_errors_naming_the_device():
    r = RtnlReader(sock=ScriptedSocket(lambda seq, n: OSError(errno.ENOBUFS, "No buffer space available")),
                   timeout_s=1.0, clock=Clock())
    with pytest.raises(KernelError) as e:
        answer(r, "qdiscs", "up1")
    assert e.value.errno == errno.ENOBUFS and str(e.value) == "read qdiscs on up1: No buffer space available"
    r = RtnlReader(sock=ScriptedSocket(lambda seq, n: b""), timeout_s=1.0, clock=Clock())
    with pytest.raises(KernelError) as e:
        answer(r, "qdiscs", "up1")
    assert e.value.errno == errno.EPIPE and str(e.value) == "read qdiscs on up1: netlink socket closed"


def done_dump(seq, n):
    return msg(ROW, nlmsg.NLM_F_MULTI, seq) + msg(nlmsg.NLMSG_DONE, nlmsg.NLM_F_MULTI, seq)


def test_the_fault_seam_reaches_the_rtnetlink_reader_only():
    plan = faults.FaultPlan()
    plan.dump_interrupted(times=1)
    with faults.installed(plan):
        r = RtnlReader(sock=ScriptedSocket(done_dump), timeout_s=1.0, clock=Clock())
        got = [m.flags & nlmsg.NLM_F_DUMP_INTR for _, msgs in r._answer(request, "links") for m in msgs]
        assert got == [nlmsg.NLM_F_DUMP_INTR] * 2 and plan.log == [("dump_interrupted", "node", 0)]
        ex = NetlinkExchange(ScriptedSocket(done_dump), "node", 1.0, Clock())
        assert [m.flags & nlmsg.NLM_F_DUMP_INTR for _, msgs in ex._answer(request, "x") for m in msgs] == [0, 0]
    assert len(plan.log) == 1  # the generic exchange did not consult the plan


def test_read_silent_drops_every_reply_until_the_deadline():
    plan = faults.FaultPlan()
    plan.read_silent(times=1)
    clock = Clock()
    with faults.installed(plan):
        r = RtnlReader(sock=ScriptedSocket(done_dump, clock, step_s=0.4), timeout_s=1.0, clock=clock)
        with pytest.raises(KernelError) as e:
            answer(r, "classes", "up0")
    assert str(e.value) == "read classes on up0: no answer from the kernel within 1 s"
    assert plan.log == [("read_silent", "up0", 0)]
