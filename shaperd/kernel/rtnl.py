"""The rtnetlink reader: every read shaperd makes of links, routes, neighbours and tc state.

One raw NETLINK_ROUTE socket, created inside the target namespace
(kernel/netns.py), sending dump and get requests and decoding the replies
into typed rows (kernel/rtnl_rows.py). Read-only: it sends no write.

Every exchange has a deadline (``timeout_s``; the receive loop is
kernel/nlexchange.py's); a dump the kernel marks as interrupted
(NLM_F_DUMP_INTR: the table changed while it was being dumped) is read
again; an error reply is a KernelError naming what was read and where, never
an empty answer. The socket is injectable, so the decoders run
on recorded replies in tests (tests/unit/fixtures/netlink/).
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import time

from collections.abc import Callable, Iterator
from typing import TypeVar

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg
from shaperd.kernel.nlexchange import NetlinkExchange, open_netlink
from shaperd.kernel import rtnl_rows as rows
from shaperd.kernel.nlmsg import Message

NETLINK_ROUTE = 0
RTM_GETLINK, RTM_GETROUTE, RTM_GETNEIGH = 18, 26, 30
RTM_GETQDISC, RTM_GETTCLASS, RTM_GETTFILTER = 38, 42, 46
DEFAULT_TIMEOUT_S = 5.0
ANSWER_CAP_S = 300.0
# A dump interrupted this many times in a row means the table changes faster than it can be read.
DUMP_ATTEMPTS = 4
# Pauses before reading an interrupted dump again.
DUMP_RETRY_S = (0.01, 0.05, 0.2)
# Answers to a route lookup that mean "no route", not "could not ask".
NO_ROUTE_ERRNOS = frozenset({errno_mod.ENETUNREACH, errno_mod.EHOSTUNREACH, errno_mod.ENETDOWN,
                             errno_mod.ESRCH})

T = TypeVar("T")


def open_socket(netns: str | None = None, run_root: str = "/run", groups: int = 0,
                nonblocking: bool = False) -> socket.socket:
    """A NETLINK_ROUTE socket in ``netns`` (bound to multicast ``groups``)."""
    return open_netlink(NETLINK_ROUTE, "rtnetlink socket", netns, run_root, groups=groups, nonblocking=nonblocking)


class RtnlReader(NetlinkExchange):
    """Typed reads over one raw rtnetlink socket (``sock`` injectable for recorded replies)."""

    single_reply_ends = True  # a get is answered by one message, and no ack is asked for
    fault_seam = True

    def __init__(self, netns: str | None = None, *, sock=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 run_root: str = "/run", sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        # timeout_s without any datagram for a request (a kernel that stopped answering), ANSWER_CAP_S
        # for the whole answer (a dump of 50,000 filters on a loaded node takes seconds).
        super().__init__(sock if sock is not None else open_socket(netns, run_root), netns or "node", timeout_s,
                         clock, answer_cap_s=ANSWER_CAP_S)
        self.netns = netns
        self.sleep = sleep
        self.sock.settimeout(timeout_s)

    def __enter__(self) -> "RtnlReader":
        return self

    # -- the exchange ----------------------------------------------------------
    def _request(self, mtype: int, flags: int, body: bytes, what: str,
                 device: str) -> Iterator[tuple[bytes, list[Message]]]:
        """Send one request; yield (datagram, its messages answering this request) until DONE or an error/ack
        (NetlinkExchange._answer)."""
        size, flags = nlmsg.HDR.size + len(body), nlmsg.NLM_F_REQUEST | flags
        return self._answer(lambda seq: nlmsg.header(size, mtype, flags, seq) + body, what, device)

    def _dump(self, mtype: int, body: bytes, decode: Callable[[bytes, Message], T | None], what: str,
              device: str) -> list[T]:
        """Every row of a dump; an interrupted dump is read again, an error reply raises."""
        done, error = nlmsg.NLMSG_DONE, nlmsg.NLMSG_ERROR
        for attempt in range(DUMP_ATTEMPTS):
            if attempt:
                self.sleep(DUMP_RETRY_S[min(attempt, len(DUMP_RETRY_S)) - 1])  # let the change settle
            out: list[T] = []
            interrupted = 0
            for buf, msgs in self._request(mtype, nlmsg.NLM_F_DUMP, body, what, device):
                for m in msgs:
                    interrupted |= m.flags & nlmsg.NLM_F_DUMP_INTR
                    if m.type == error or m.type == done:
                        # A dump the kernel cannot start is an NLMSG_ERROR; one that fails once started
                        # ends in an NLMSG_DONE carrying the errno (netlink_dump_done), rows so far or none.
                        code = nlmsg.error_code(buf, m)
                        if code:
                            raise KernelError("dump", what, device, os.strerror(code), code)
                    else:
                        row = decode(buf, m)
                        if row is not None:
                            out.append(row)
            if not interrupted:
                return out
        raise KernelError("dump", what, device, f"interrupted {DUMP_ATTEMPTS} times in a row (the table kept changing)",
                          errno_mod.EINTR)

    def _get(self, mtype: int, body: bytes, decode: Callable[[bytes, Message], T], what: str, device: str,
             absent: frozenset[int] = frozenset()) -> T | None:
        """One get request: its row, None when the kernel answers with an errno in ``absent``, else raise."""
        for buf, msgs in self._request(mtype, 0, body, what, device):
            if not msgs:
                continue
            m = msgs[0]
            if m.type == nlmsg.NLMSG_ERROR:
                code = nlmsg.error_code(buf, m)
                if code in absent:
                    return None
                raise KernelError("get", what, device, os.strerror(code) if code else "acked without an answer", code)
            return decode(buf, m)
        return None

    # -- reads -----------------------------------------------------------------
    def links(self) -> list[rows.LinkRow]:
        return self._dump(RTM_GETLINK, rows.IFINFOMSG.pack(0, 0, 0, 0, 0, 0), rows.link, "links", "node")

    def routes(self, family: int) -> list[rows.RouteRow]:
        req = rows.RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        return [r for r in self._dump(RTM_GETROUTE, req, rows.route, "routes", "node") if r.family == family]

    def route_to(self, ip: str) -> rows.RouteRow | None:
        """The route the kernel would use to reach ``ip``; None when it has none."""
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        addr = socket.inet_pton(family, ip)
        body = rows.RTMSG.pack(family, len(addr) * 8, 0, 0, 0, 0, 0, 0, 0) + nlmsg.rta(rows.RTA_DST, addr)
        return self._get(RTM_GETROUTE, body, rows.route, f"route to {ip}", "node", NO_ROUTE_ERRNOS)

    def neighbours(self, family: int, ifindex: int = 0, device: str = "node") -> list[rows.NeighRow]:
        """Neighbour entries on ``ifindex`` (0: every device; AF_BRIDGE: the bridge forwarding database)."""
        what = "bridge fdb" if family == socket.AF_BRIDGE else "neighbours"
        req = rows.NDMSG.pack(family, 0, 0, ifindex, 0, 0, 0)
        out = self._dump(RTM_GETNEIGH, req, rows.neigh, what, device)
        # The kernel does not filter a dump on ndm_ifindex (only on an NDA_IFINDEX attribute): every device's
        # entries come back, so they are filtered here, as for qdiscs.
        return [n for n in out if n.ifindex == ifindex] if ifindex else out

    def qdiscs(self, ifindex: int = 0, device: str = "node") -> list[rows.QdiscRow]:
        req = rows.TCMSG.pack(0, 0, 0, ifindex, 0, 0, 0)
        out = self._dump(RTM_GETQDISC, req, rows.qdisc, "qdiscs", device)
        return [q for q in out if q.ifindex == ifindex] if ifindex else out

    def root_qdiscs(self) -> list[rows.QdiscRow]:
        """Every device's root qdisc (one dump; the leaves are skipped before decoding)."""
        return self._dump(RTM_GETQDISC, rows.TCMSG.pack(0, 0, 0, 0, 0, 0, 0), rows.root_qdisc, "qdiscs", "node")

    def htb_classes(self, ifindex: int, device: str) -> list[rows.HtbClassRow]:
        req = rows.TCMSG.pack(0, 0, 0, ifindex, 0, 0, 0)
        return [c for c in self._dump(RTM_GETTCLASS, req, rows.htb_class, "classes", device) if c.ifindex == ifindex]

    def filters(self, ifindex: int, parent: int, device: str) -> list[rows.FilterRow]:
        req = rows.TCMSG.pack(0, 0, 0, ifindex, 0, parent, 0)
        return [f for f in self._dump(RTM_GETTFILTER, req, rows.tc_filter, "filters", device) if f.ifindex == ifindex]


class CachedReads:
    """One reconcile's view of the reader: the node-wide qdisc dump is read once and shared by backends."""

    def __init__(self, reader: RtnlReader):
        self.reader = reader
        self._qdiscs: list[rows.QdiscRow] | None = None

    def all_qdiscs(self) -> list[rows.QdiscRow]:
        if self._qdiscs is None:
            self._qdiscs = self.reader.qdiscs()
        return self._qdiscs

    def __getattr__(self, name: str):
        return getattr(self.reader, name)


