"""Kernel change notifications: an rtnetlink socket subscribed to link and tc events.

The daemon only needs to know *that* links or tc objects changed (it then
reads, diffs and writes as on any resync), so this is a raw non-blocking
socket whose messages are counted by type, not parsed.
"""

from __future__ import annotations

import socket
import struct

NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1
RTMGRP_TC = 0x8
RTM_NEWLINK, RTM_DELLINK = 16, 17
_NLMSGHDR = struct.Struct("=IHHII")


class KernelEvents:
    def __init__(self, netns: str | None = None) -> None:
        if netns:
            # A socket belongs to the namespace it was created in; only this thread switches.
            from pyroute2 import netns as nsmod

            nsmod.pushns(netns)
            try:
                self.sock = self._open()
            finally:
                nsmod.popns()
        else:
            self.sock = self._open()

    @staticmethod
    def _open() -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, NETLINK_ROUTE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((0, RTMGRP_LINK | RTMGRP_TC))
        return sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> tuple[int, int]:
        """Read everything pending: (link events, tc events). An overrun counts as both."""
        links = tcs = 0
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return links, tcs
            except OSError:  # ENOBUFS: we missed events; treat as "everything changed"
                links += 1
                tcs += 1
                continue
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                length, mtype, _, _, _ = _NLMSGHDR.unpack_from(data, off)
                if mtype in (RTM_NEWLINK, RTM_DELLINK):
                    links += 1
                else:
                    tcs += 1
                if length < _NLMSGHDR.size:
                    break
                off += (length + 3) & ~3

    def close(self) -> None:
        self.sock.close()
