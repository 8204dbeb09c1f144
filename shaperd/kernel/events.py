"""Kernel change notifications: an rtnetlink socket subscribed to link and tc events.

The daemon only needs to know *that* links or tc objects changed (it then
reads, diffs and writes as on any resync), so messages are counted by type,
not parsed. When the socket overflows (ENOBUFS: the kernel dropped events
we did not read in time) that is reported as ``overflow``: some change may
be unknown, so the caller does a full resync. Any other socket error is a
KernelError, not a silent retry.
"""

from __future__ import annotations

import errno as errno_mod
from dataclasses import dataclass

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg
from shaperd.kernel.rtnl import open_socket

RTMGRP_LINK = 0x1
RTMGRP_TC = 0x8
RTM_NEWLINK, RTM_DELLINK = 16, 17
# Bound one drain: under an event storm the loop must get back to its other work.
MAX_READS_PER_DRAIN = 256
# After an overflow everything queued is obsolete (a full resync follows): read it all now, still bounded,
# so it does not trigger a second resync (measured: 2 resyncs per overflowing burst before, 1 after).
MAX_READS_AFTER_OVERFLOW = 8192


@dataclass(frozen=True)
class Drained:
    links: int = 0
    tcs: int = 0
    overflow: bool = False  # events were lost: resync everything

    @property
    def any(self) -> bool:
        return bool(self.links or self.tcs or self.overflow)


class KernelEvents:
    def __init__(self, netns: str | None = None, run_root: str = "/run", *, sock=None) -> None:
        self.sock = sock if sock is not None else open_socket(netns, run_root, RTMGRP_LINK | RTMGRP_TC,
                                                                nonblocking=True)
        self.where = netns or "this namespace"

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> Drained:
        """Read what is pending (at most MAX_READS_PER_DRAIN datagrams)."""
        links = tcs = 0
        overflow = False
        reads = 0
        while reads < (MAX_READS_AFTER_OVERFLOW if overflow else MAX_READS_PER_DRAIN):
            reads += 1
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno_mod.ENOBUFS:
                    overflow = True
                    continue  # the socket is usable again after reporting the overrun
                raise KernelError("read", "kernel events", self.where, e.strerror or str(e), e.errno) from e
            for m in nlmsg.messages(data):
                if m.type in (RTM_NEWLINK, RTM_DELLINK):
                    links += 1
                else:
                    tcs += 1
        return Drained(links, tcs, overflow)

    def close(self) -> None:
        self.sock.close()
