"""The bounded netlink writer and tc's use of it, against a fake kernel (no root, no timing).

The fake kernel answers every request with a capped ack, keeps a receive
buffer of limited capacity (a full buffer drops acks and reports ENOBUFS once,
as the kernel does), and can leave requests unanswered. "No answer" is a
recv with nothing queued: the fake raises socket.timeout at once, so no test
waits for a deadline to pass.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest

from shaperd.backends.htb import ops as htb
from shaperd.backends.htb.kernel_tc import CODEC as HTB_CODEC
from shaperd.kernel import faults, nlmsg, nlwriter, tc

ERR = struct.Struct("=i")


class FakeKernel:
    def __init__(self, capacity_acks: int = 10_000, refuse=None, silent_after: int | None = None, text: str = ""):
        self.capacity = capacity_acks
        self.refuse = refuse or {}  # request index (0-based, over the kernel's life) -> errno
        self.silent_after = silent_after  # requests from this index on are applied but never answered
        self.text = text
        self.queue: list[bytes] = []
        self.pending_error: int | None = None
        self.received: list[tuple[int, int]] = []  # (seq, type) of every request, in order
        self.sends = 0
        self.max_queued = 0

    # the socket surface the writer uses
    def settimeout(self, _t):
        pass

    def getsockopt(self, *_a):
        return self.capacity * nlwriter.ACK_COST_BYTES * 2

    def on_send(self):
        pass

    def send(self, data: bytes) -> int:
        self.sends += 1
        self.on_send()
        for m in nlmsg.messages(data):
            i = len(self.received)
            self.received.append((m.seq, m.type))
            if self.silent_after is not None and i >= self.silent_after:
                continue
            code = self.refuse.get(i, 0)
            self._ack(data, m, code)
        return len(data)

    def _ack(self, data, m, code):
        if len(self.queue) >= self.capacity:
            self.pending_error = errno.ENOBUFS  # the kernel drops the ack and flags the socket
            return
        orig = data[m.start - nlmsg.HDR.size:m.start]
        flags = nlwriter.NLM_F_CAPPED
        tlv = b""
        if code and self.text:
            flags |= nlwriter.NLM_F_ACK_TLVS
            tlv = nlmsg.rta(nlwriter.NLMSGERR_ATTR_MSG, self.text.encode() + b"\0")
        body = ERR.pack(-code) + orig + tlv
        self.queue.append(nlmsg.header(nlmsg.HDR.size + len(body), nlmsg.NLMSG_ERROR, flags, m.seq) + body)
        self.max_queued = max(self.max_queued, len(self.queue))

    def recv(self, _n):
        if self.pending_error is not None:
            e, self.pending_error = self.pending_error, None
            self.queue.clear()
            raise OSError(e, "No buffer space available")
        if not self.queue:
            raise socket.timeout()
        return self.queue.pop(0)

    def close(self):
        pass


def enc(i: int):
    return lambda seq: nlmsg.header(nlmsg.HDR.size + 4, 44, nlmsg.NLM_F_REQUEST | nlmsg.NLM_F_ACK, seq) + ERR.pack(i)


def test_batches_are_sized_so_acks_fit_the_receive_buffer_and_every_request_is_acked():
    k = FakeKernel(capacity_acks=40)
    w = nlwriter.NetlinkWriter(k, "ns")
    assert w.batch_messages == 40  # half of a buffer that holds 80 acks of ACK_COST_BYTES
    ans = w.request([enc(i) for i in range(4000)])
    assert ans.lost is None and ans.codes == [0] * 4000
    assert k.max_queued <= 40 and k.sends == 100 == w.batches_sent
    seqs = [s for s, _t in k.received]
    assert len(set(seqs)) == 4000  # one sequence number per request


def test_one_unbounded_batch_overflows_and_is_reported_as_lost_answers_not_a_hang():
    k = FakeKernel(capacity_acks=40)
    ans = nlwriter.NetlinkWriter(k, "ns", batch_messages=4000).request([enc(i) for i in range(4000)])
    assert ans.lost is not None and "answers lost" in ans.lost and ans.lost_errno == errno.ENOBUFS


def test_a_refusal_is_matched_to_its_request_with_the_kernels_text():
    k = FakeKernel(refuse={7: errno.EINVAL}, text="Invalid rate")
    ans = nlwriter.NetlinkWriter(k, "ns", batch_messages=5).request([enc(i) for i in range(12)])
    assert ans.lost is None
    assert [i for i, c in enumerate(ans.codes) if c] == [7] and ans.codes[7] == errno.EINVAL
    assert ans.texts[7] == "Invalid rate"


def test_no_answer_stops_after_the_unanswered_batch_and_says_how_many():
    k = FakeKernel(silent_after=6)
    ans = nlwriter.NetlinkWriter(k, "ns", timeout_s=3, batch_messages=4).request([enc(i) for i in range(20)])
    assert ans.codes[:6] == [0] * 6 and ans.codes[6:] == [None] * 14
    assert ans.sent == 8 and len(k.received) == 8  # nothing after the batch that went unanswered
    assert ans.lost == "no answer within 3 s (2 of 4 requests unanswered)" and ans.lost_errno == errno.ETIMEDOUT


def _ops(n: int):
    return [htb.DeleteClass(device="up0", ifindex=3, classid=0x73680010 + i) for i in range(n)]


def _writer(k, **kw):
    return tc.TcWriter(nlwriter.NetlinkWriter(k, "ns", **kw))


def test_apply_without_an_answer_names_object_and_device_and_does_not_ask_for_a_replay():
    k = FakeKernel(silent_after=2)
    res = tc.apply_ops(_writer(k, timeout_s=5, batch_messages=3), _ops(6), codec=HTB_CODEC)
    assert not res.batch_failed and len(res.applied) == 2
    msgs = [str(e) for _op, e in res.failed]
    assert msgs[0] == "delete class 7368:12 on up0: no answer within 5 s (1 of 3 requests unanswered)"
    assert msgs[-1] == "delete class 7368:15 on up0: not sent: an earlier write on this device got no answer"
    assert all(e.transient for _op, e in res.failed)


def test_a_refused_batch_asks_for_a_re_read_and_replay():
    res = tc.apply_ops(_writer(FakeKernel(refuse={1: errno.EPERM})), _ops(3), codec=HTB_CODEC)
    assert res.batch_failed and not res.applied


@pytest.mark.parametrize("code", [errno.EBUSY, errno.ENOBUFS])
def test_one_by_one_retries_a_transient_refusal_with_backoff(code):
    pauses = []
    k = FakeKernel(refuse={0: code, 1: code})
    res = tc.apply_ops(_writer(k), _ops(1), batch=False, sleep=pauses.append, codec=HTB_CODEC)
    assert res.applied == _ops(1) and not res.failed
    assert pauses == list(tc.RETRY_BACKOFF_S[:2]) and len(k.received) == 3


@pytest.mark.parametrize("code", [errno.EPERM, errno.EINVAL])
def test_one_by_one_does_not_retry_a_permanent_refusal(code):
    pauses = []
    k = FakeKernel(refuse={0: code})
    ops = _ops(2)
    res = tc.apply_ops(_writer(k), ops, batch=False, sleep=pauses.append, codec=HTB_CODEC)
    assert pauses == [] and res.applied == ops[1:]
    (op, err), = res.failed
    assert str(err) == f"delete class 7368:10 on up0: {os.strerror(code)}"
    assert not err.transient


def test_one_by_one_gives_up_on_the_device_at_its_budget():
    """A kernel that takes 0.2 s per write, a 0.5 s budget: two land, the third is cut off, the rest not sent."""
    now = [0.0]
    k = FakeKernel()
    k.on_send = lambda: now.__setitem__(0, now[0] + 0.2)
    w = _writer(k, clock=lambda: now[0])
    w.device_budget_s = 0.5
    ops = _ops(5)
    res = tc.apply_ops(w, ops, batch=False, codec=HTB_CODEC)
    assert res.applied == ops[:2]
    causes = [e.cause for _op, e in res.failed]
    assert causes[0] == "no answer before the device's deadline (1 of 1 requests unanswered)"
    assert causes[1:] == ["not sent: an earlier write on this device got no answer"] * 2
    assert len(k.received) == 3


def test_fault_plan_refuses_on_one_device_only_and_is_off_by_default():
    assert faults.ACTIVE is None
    plan = faults.FaultPlan()
    plan.refuse(errno.EPERM, ifindex=3)
    k = FakeKernel()
    other = [htb.DeleteClass(device="up1", ifindex=4, classid=0x73680010)]
    with faults.installed(plan):
        res = tc.apply_ops(_writer(k), _ops(1) + other, batch=False, codec=HTB_CODEC)
    assert faults.ACTIVE is None
    assert res.applied == other and res.failed[0][1].errno == errno.EPERM
    assert "injected" in str(res.failed[0][1]) and len(k.received) == 1  # the refused write never reached the kernel


def test_dump_interrupted_marks_every_message():
    buf = nlmsg.header(20, 44, nlmsg.NLM_F_MULTI, 1) + b"\0" * 4 + nlmsg.header(20, 3, nlmsg.NLM_F_MULTI, 1) + b"\0" * 4
    assert all(m.flags & nlmsg.NLM_F_DUMP_INTR for m in nlmsg.messages(faults.mark_dump_intr(buf)))


def test_only_tests_reach_the_fault_seam():
    """No module of the agent installs a fault plan: the seam is not reachable from config or CLI."""
    import pathlib

    root = pathlib.Path(tc.__file__).resolve().parents[1]
    users = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
             if "installed(" in p.read_text() and "faults" in p.read_text() and p.name != "faults.py"]
    assert users == []
