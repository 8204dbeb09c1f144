"""Asking the kernel whether it knows a qdisc kind with a request it must refuse (kernel/kind_ask.py).

Fixtures (tests/unit/fixtures/kind_ask/, recorded with ``strace -f -e trace=sendmsg,recvmsg -e write=all
-e read=all -xx`` in a fresh namespace on this machine's kernel, 6.18, which has no sch_fq):
- tc_add_fq_buckets1.strace: ``tc qdisc add dev lo root handle 7370: fq buckets 1`` (tc sends buckets
  as TCA_FQ_BUCKETS_LOG = ilog2(1) = 0, exactly the probe's refused option); the kernel answers ENOENT
  "Specified qdisc kind is unknown";
- tc_add_htb_lo_taken.strace: ``tc qdisc add dev lo root handle 7370: htb`` with an htb root already on
  lo: EEXIST "NLM_F_REPLACE needed to override." (the probe never replaces: no answer).
"""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest

from shaperd.kernel import devlink, kind_ask, nlmsg

from ..strace_dump import received, sent

FIX = Path(__file__).parent / "fixtures" / "kind_ask"
REAL_ASK = kind_ask.ask  # tests/unit/conftest.py replaces it for every other unit test


def _reply(name: str) -> tuple[int, str]:
    last = received((FIX / name).read_text())[-1]
    m = next(nlmsg.messages(last))
    assert m.type == nlmsg.NLMSG_ERROR
    return nlmsg.error_code(last, m), devlink.ack_message(last, m)


def test_the_fq_question_is_byte_for_byte_what_tc_sends_for_fq_buckets_1():
    (theirs,) = [b for b in sent((FIX / "tc_add_fq_buckets1.strace").read_text())
                 if nlmsg.HDR.unpack_from(b)[1] == kind_ask.RTM_NEWQDISC]
    ours = kind_ask.request("fq", kind_ask.REFUSED_OPTIONS["fq"], 7)
    # tc add: NLM_F_CREATE | NLM_F_EXCL, never NLM_F_REPLACE; seq and pid aside, the same bytes.
    assert struct.unpack_from("=IHH", ours) == struct.unpack_from("=IHH", theirs)
    assert not struct.unpack_from("=H", ours, 6)[0] & 0x100  # NLM_F_REPLACE
    assert ours[16:] == theirs[16:]


def test_the_kernels_answers_mean_absent_present_or_nothing():
    code, text = _reply("tc_add_fq_buckets1.strace")
    assert (code, text) == (errno.ENOENT, "Specified qdisc kind is unknown")  # tc adds the full stop
    assert kind_ask.answer("fq", code, text).state == kind_ask.ABSENT
    code, text = _reply("tc_add_htb_lo_taken.strace")
    assert code == errno.EEXIST and kind_ask.answer("htb", code, text).state == kind_ask.NO_ANSWER
    assert "NLM_F_REPLACE needed to override" in kind_ask.answer("htb", code, text).detail
    for code in (errno.EINVAL, errno.ERANGE):
        assert kind_ask.answer("fq", code, "").state == kind_ask.PRESENT
    for code in (errno.EPERM, errno.ENODEV, errno.EOPNOTSUPP):
        assert kind_ask.answer("fq", code, "").state == kind_ask.NO_ANSWER


class FakeSock:
    """Answers each request with an NLMSG_ERROR carrying the next errno of ``codes``; records what was sent."""

    def __init__(self, codes):
        self.codes = list(codes)
        self.sent: list[bytes] = []
        self._pending: list[bytes] = []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        seq = nlmsg.HDR.unpack_from(data)[3]
        body = struct.pack("=i", -self.codes.pop(0)) + data[:16]
        self._pending.append(nlmsg.header(16 + len(body), nlmsg.NLMSG_ERROR, 0, seq) + body)
        return len(data)

    def settimeout(self, t) -> None:
        pass

    def recv(self, n: int) -> bytes:
        return self._pending.pop(0)

    def close(self) -> None:
        pass


def test_an_accepted_question_is_taken_off_lo_at_once():
    s = FakeSock([0, 0])
    got = REAL_ASK("fq", sock_factory=lambda: s)
    assert got.state == kind_ask.PRESENT and "removed again" in got.detail
    assert [nlmsg.HDR.unpack_from(b)[1] for b in s.sent] == [kind_ask.RTM_NEWQDISC, kind_ask.RTM_DELQDISC]
    assert s.sent[1][16:36] == s.sent[0][16:36]  # the same tcmsg: lo, 7370:, root


@pytest.mark.parametrize("code, state", [(errno.ENOENT, kind_ask.ABSENT), (errno.EINVAL, kind_ask.PRESENT),
                                         (errno.EEXIST, kind_ask.NO_ANSWER)])
def test_one_request_and_no_delete_unless_accepted(code, state):
    s = FakeSock([code])
    assert REAL_ASK("fq", sock_factory=lambda: s).state == state and len(s.sent) == 1


def test_a_socket_that_cannot_open_is_no_answer():
    from shaperd.core.errors import KernelError

    def refuse():
        raise KernelError("open", "rtnetlink socket", "this namespace", "Operation not permitted", errno.EPERM)

    got = REAL_ASK("fq", sock_factory=refuse)
    assert got.state == kind_ask.NO_ANSWER and "Operation not permitted" in got.detail
