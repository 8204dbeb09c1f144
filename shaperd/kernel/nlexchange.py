"""Netlink sockets and the request/replies exchange shared by shaperd's hand-built netlink clients.

``open_netlink`` is the one way to open a netlink socket (rtnetlink, RDMA
netlink, generic netlink), created inside the target namespace.

``NetlinkExchange`` is the one receive loop: the rtnetlink reader
(kernel/rtnl.py), RDMA netlink (kernel/rdma_nl.py), devlink and ethtool over
generic netlink (kernel/devlink.py, kernel/ethtool_features.py) and the
qdisc-kind probe send a request and read every reply to it until the DONE or
the NLMSG_ERROR (ack) that ends it, skipping late answers to earlier
requests that timed out, under deadlines (see the class). The socket and the
clock are injectable, so clients run on recorded replies in tests.
"""

from __future__ import annotations

import errno as errno_mod
import socket
import time
from collections.abc import Callable, Iterator

from shaperd.core.errors import KernelError
from shaperd.kernel import faults
from shaperd.kernel import netns as netns_mod
from shaperd.kernel import nlmsg
from shaperd.kernel.nlmsg import Message

RECV_BYTES = 1 << 16
RCVBUF_BYTES = 1 << 20
SOL_NETLINK = 270
NETLINK_CAP_ACK, NETLINK_EXT_ACK = 10, 11


def open_netlink(protocol: int, label: str, netns: str | None = None, run_root: str = "/run", *, groups: int = 0,
                 nonblocking: bool = False, ext_ack: bool = False) -> socket.socket:
    """A raw netlink socket of ``protocol`` in ``netns`` (bound to multicast ``groups``).

    ``label`` names it in errors ("rtnetlink socket"). ``ext_ack``: ask for the kernel's error
    messages and capped acks (older kernels without them still work, errors then carry no text).
    The OSError of socket() is chained, so callers can map an errno (a missing protocol) to their own type.
    """
    where = netns or "this namespace"
    flags = socket.SOCK_RAW | socket.SOCK_CLOEXEC | (socket.SOCK_NONBLOCK if nonblocking else 0)
    with netns_mod.entered(netns, run_root):
        try:
            sock = socket.socket(socket.AF_NETLINK, flags, protocol)
        except OSError as e:
            raise KernelError("open", label, where, e.strerror or str(e), e.errno) from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        if ext_ack:
            for opt in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
                try:
                    sock.setsockopt(SOL_NETLINK, opt, 1)
                except OSError:
                    pass
        sock.bind((0, groups))
    except OSError as e:
        sock.close()
        raise KernelError("bind", label, where, e.strerror or str(e), e.errno) from e
    return sock


class NetlinkExchange:
    """One netlink socket's requests and the loop that reads each one's answer.

    ``_answer`` is the one receive loop of shaperd's netlink readers: it sends ``req(seq)`` and yields,
    per datagram, the messages answering that request (late answers to an earlier request that timed
    out are skipped), up to and including the NLMSG_DONE or NLMSG_ERROR that ends the answer. What the
    messages mean (rows, errnos, extended-ack text, a dump read again because it was interrupted) is
    the caller's.

    Deadlines: without ``answer_cap_s``, ``timeout_s`` bounds the whole answer (not each recv, so
    replies trickling in cannot stretch it). With it, ``timeout_s`` bounds the wait for each datagram of
    the answer (a kernel that stopped answering) and ``answer_cap_s`` the whole (a dump of 50,000
    filters on a loaded node takes seconds). The socket and the clock are injectable, so readers run on
    recorded replies in tests.
    """

    # A message without NLM_F_MULTI also ends the answer (rtnetlink's gets: one reply, no ack asked).
    single_reply_ends = False
    # Replies pass through the test fault seam (kernel/faults.py; its predicates read rtnetlink requests).
    fault_seam = False

    def __init__(self, sock, where: str, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 seq: int = 0, *, answer_cap_s: float | None = None):
        self.sock = sock
        self.where = where
        self.timeout_s = timeout_s
        self.clock = clock
        self.seq = seq
        self.answer_cap_s = answer_cap_s

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _replies(self, req: Callable[[int], bytes], what: str) -> Iterator[tuple[bytes, Message]]:
        """``_answer``, one message at a time: for the short answers of RDMA netlink and generic netlink."""
        for buf, msgs in self._answer(req, what):
            for m in msgs:
                yield buf, m

    def _answer(self, req: Callable[[int], bytes], what: str,
                where: str | None = None) -> Iterator[tuple[bytes, list[Message]]]:
        """Send ``req(seq)``; yield (datagram, its messages answering this request) until the one ending it.

        Per datagram, not per message: a resync reads hundreds of messages and a generator step each
        showed in the sampler's cost. ``where`` names the device in errors (default: ``self.where``)."""
        where = self.where if where is None else where
        self.seq += 1
        seq = self.seq
        data = req(seq)
        fault = None
        if self.fault_seam:
            plan = faults.ACTIVE  # None outside tests: one attribute read
            fault = plan.reading(data, where) if plan is not None else None
        single = self.single_reply_ends
        done, error, multi = nlmsg.NLMSG_DONE, nlmsg.NLMSG_ERROR, nlmsg.NLM_F_MULTI
        clock, sock = self.clock, self.sock
        start = clock()
        capped = self.answer_cap_s is not None
        cap_s = max(self.timeout_s, self.answer_cap_s) if capped else self.timeout_s
        idle_until, cap = start + self.timeout_s, start + cap_s
        cap_bound = not capped
        try:
            sock.send(data)
            while True:
                cap_bound = cap_bound or cap < idle_until
                left = (cap if cap_bound else idle_until) - clock()
                if left <= 0:
                    raise socket.timeout()
                sock.settimeout(left)
                buf = sock.recv(RECV_BYTES)
                if not buf:
                    raise KernelError("read", what, where, "netlink socket closed", errno_mod.EPIPE)
                if fault is not None:
                    if fault == "silent":
                        continue
                    buf = faults.mark_dump_intr(buf)
                mine = []
                last = False
                for m in nlmsg.messages(buf):
                    if m.seq != seq:
                        continue  # a late answer to an earlier request that timed out
                    mine.append(m)
                    if m.type == done or m.type == error or (single and not m.flags & multi):
                        last = True
                        break
                if mine:
                    idle_until = clock() + self.timeout_s
                    yield buf, mine
                if last:
                    return
        except socket.timeout as e:
            cause = (f"no complete answer from the kernel within {cap_s:g} s" if cap_bound else
                     f"no answer from the kernel within {self.timeout_s:g} s")
            raise KernelError("read", what, where, cause, errno_mod.ETIMEDOUT) from e
        except OSError as e:
            raise KernelError("read", what, where, e.strerror or str(e), e.errno) from e
