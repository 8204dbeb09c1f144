"""Netlink sockets and the request/replies exchange shared by shaperd's hand-built netlink clients.

``open_netlink`` is the one way to open a netlink socket (rtnetlink, RDMA
netlink, generic netlink), created inside the target namespace.

RDMA netlink (kernel/rdma_nl.py) and devlink over generic netlink
(kernel/devlink.py) send a request and read every reply to it until the
DONE or the NLMSG_ERROR (ack) that ends it, skipping late answers to earlier
requests that timed out, under one deadline for the whole answer (not per
recv, so replies trickling in cannot stretch it). The socket and the clock
are injectable, so clients run on recorded replies in tests.
"""

from __future__ import annotations

import errno as errno_mod
import socket
import time
from collections.abc import Callable, Iterator

from shaperd.core.errors import KernelError
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
    def __init__(self, sock, where: str, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 seq: int = 0):
        self.sock = sock
        self.where = where
        self.timeout_s = timeout_s
        self.clock = clock
        self.seq = seq

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _replies(self, req: Callable[[int], bytes], what: str) -> Iterator[tuple[bytes, Message]]:
        """Send ``req(seq)``; yield every reply to it up to and including the DONE or NLMSG_ERROR ending it."""
        self.seq += 1
        seq = self.seq
        deadline = self.clock() + self.timeout_s
        try:
            self.sock.send(req(seq))
            while True:
                left = deadline - self.clock()
                if left <= 0:
                    raise socket.timeout()
                self.sock.settimeout(left)
                buf = self.sock.recv(RECV_BYTES)
                if not buf:
                    raise KernelError("read", what, self.where, "netlink socket closed", errno_mod.EPIPE)
                for m in nlmsg.messages(buf):
                    if m.seq != seq:
                        continue  # a late answer to an earlier request that timed out
                    yield buf, m
                    if m.type in (nlmsg.NLMSG_DONE, nlmsg.NLMSG_ERROR):
                        return
        except socket.timeout as e:
            raise KernelError("read", what, self.where, f"no complete answer from the kernel within "
                              f"{self.timeout_s:g} s", errno_mod.ETIMEDOUT) from e
        except OSError as e:
            raise KernelError("read", what, self.where, e.strerror or str(e), e.errno) from e
