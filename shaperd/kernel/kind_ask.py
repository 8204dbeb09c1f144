"""Ask the running kernel whether it knows a qdisc kind, with a request it must refuse. Changes nothing.

Without CAP_SYS_ADMIN there is no throwaway namespace to try a qdisc in, and
the kernel's files (kernel/qdisc_kinds.py) may say nothing (no /lib/modules,
no config). The kernel itself can still answer, with CAP_NET_ADMIN only:
RTM_NEWQDISC for ``kind`` on the loopback device of the caller's namespace,
NLM_F_CREATE | NLM_F_EXCL, never NLM_F_REPLACE, a handle no one uses
(7370:), and options the kind's own init must refuse. The kernel looks the
kind up first (``qdisc_create``: autoloading its module, as the first real
apply would), then runs its init on the refused options, and grafts nothing:

- ENOENT "Specified qdisc kind is unknown": the kind is absent;
- the kind's refusal of the options (EINVAL, or ERANGE from policy checks):
  present. For sch_fq the options are ``TCA_FQ_BUCKETS_LOG = 0`` (fq_change:
  "1 <= buckets_log <= 18, else -EINVAL"; Debian 6.1 answers so in the QEMU tier); for
  htb (used by the tests, a kind every node has) no options at all (htb_init:
  "hey, probably you opened qdisc with no options", -EINVAL);
- anything else (EEXIST: lo already carries a root qdisc of someone's, which
  this request never replaces; EPERM; a timeout): no answer; the caller keeps
  what it had (unknown: verified at apply, backends/edt/refusals.py).

If a future kernel ever accepted the options, the qdisc it grafted on lo is
deleted at once and the answer is still "present" (said in the note).
Every exchange has a deadline (NetlinkExchange).
"""

from __future__ import annotations

import errno as errno_mod
import struct
from collections.abc import Callable
from dataclasses import dataclass

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg
from shaperd.kernel.nlexchange import NetlinkExchange, open_netlink
from shaperd.kernel.nlwriter import ext_ack_text

NETLINK_ROUTE = 0
RTM_NEWQDISC, RTM_DELQDISC = 36, 37
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_FQ_BUCKETS_LOG = 8  # uapi pkt_sched.h enum TCA_FQ_*
TC_H_ROOT = 0xFFFFFFFF
LOOPBACK_IFINDEX = 1  # every network namespace's lo
ASK_HANDLE = 0x73700000  # 7370: ("sp"), beside shaperd's 7365: and 7368:, used by nothing
TIMEOUT_S = 2.0
TCMSG = struct.Struct("=BxxxiIII")  # family, 3 pad bytes, ifindex, handle, parent, info

PRESENT, ABSENT, NO_ANSWER = "present", "absent", "no answer"
# kind -> options (TCA_OPTIONS payload, or None for no TCA_OPTIONS) its init refuses.
REFUSED_OPTIONS: dict[str, bytes | None] = {
    "fq": nlmsg.rta(TCA_FQ_BUCKETS_LOG, struct.pack("=I", 0)),
    "htb": None,
}
KNOWN_REFUSALS = (errno_mod.EINVAL, errno_mod.ERANGE)


@dataclass(frozen=True)
class KindAnswer:
    kind: str
    state: str  # PRESENT | ABSENT | NO_ANSWER
    detail: str  # the kernel's errno and message, for the probe's note

    def __str__(self) -> str:
        return f"{self.kind}: {self.state} ({self.detail})"


def request(kind: str, options: bytes | None, seq: int, msg_type: int = RTM_NEWQDISC,
            flags: int = NLM_F_CREATE | NLM_F_EXCL) -> bytes:
    body = TCMSG.pack(0, LOOPBACK_IFINDEX, ASK_HANDLE, TC_H_ROOT, 0) + nlmsg.rta(TCA_KIND, kind.encode() + b"\0")
    if options is not None:
        body += nlmsg.rta(TCA_OPTIONS, options)
    return nlmsg.header(nlmsg.HDR.size + len(body), msg_type, nlmsg.NLM_F_REQUEST | nlmsg.NLM_F_ACK | flags,
                        seq) + body


class _Exchange(NetlinkExchange):
    def ack(self, req: Callable[[int], bytes], what: str) -> tuple[int, str]:
        """(errno, kernel message) of the request's ack; 0 for success."""
        for buf, m in self._replies(req, what):
            if m.type == nlmsg.NLMSG_ERROR:
                code = nlmsg.error_code(buf, m)
                return code, ext_ack_text(buf, m) if code else ""
        raise KernelError("read", what, self.where, "no ack from the kernel", errno_mod.EPROTO)


def answer(kind: str, code: int, text: str) -> KindAnswer:
    """The meaning of the kernel's ack to the refused request (pure: tested on every errno)."""
    said = f"{errno_mod.errorcode.get(code, code)}{': ' + text if text else ''}" if code else "accepted"
    if code == errno_mod.ENOENT:
        return KindAnswer(kind, ABSENT, f"the kernel answered {said} to a request for it")
    if code in KNOWN_REFUSALS:
        return KindAnswer(kind, PRESENT, f"the kernel knows it: it refused the probe's invalid options ({said})")
    return KindAnswer(kind, NO_ANSWER, f"the kernel answered {said}, which does not tell")


def ask(kind: str, timeout_s: float = TIMEOUT_S, sock_factory=None) -> KindAnswer:
    """Whether the kernel knows qdisc ``kind`` (a key of REFUSED_OPTIONS), in the caller's namespace."""
    options = REFUSED_OPTIONS[kind]
    what = f"probe request for qdisc kind {kind} on lo"
    try:
        sock = (sock_factory or (lambda: open_netlink(NETLINK_ROUTE, "rtnetlink socket", ext_ack=True)))()
        with _Exchange(sock, "this namespace", timeout_s) as ex:
            code, text = ex.ack(lambda s: request(kind, options, s), what)
            got = answer(kind, code, text)
            if code == 0:  # the options were accepted after all: take the qdisc off lo again at once
                dcode, dtext = ex.ack(lambda s: request(kind, None, s, RTM_DELQDISC, 0), f"delete {what}")
                gone = "removed again" if dcode == 0 else f"NOT removed ({errno_mod.errorcode.get(dcode, dcode)} {dtext})"
                return KindAnswer(kind, PRESENT, f"the kernel accepted the probe's options; the qdisc on lo was {gone}")
            return got
    except KernelError as e:
        return KindAnswer(kind, NO_ANSWER, str(e))
