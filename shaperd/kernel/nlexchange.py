"""One request, its replies, one deadline: the exchange shared by shaperd's hand-built netlink clients.

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

from ..errors import KernelError
from . import nlmsg
from .nlmsg import Message

RECV_BYTES = 1 << 16


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
