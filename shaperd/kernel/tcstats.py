"""Fast read-only tc class counters over a raw rtnetlink socket (for sampling).

The metrics sampler reads every shaperd class on every shaped device twice a
second. pyroute2 decodes every attribute of every message into objects,
which costs ~100 ms for 8 devices x 66 classes (bench/scrape.py); this
module sends the same three dumps (links, qdiscs, classes per device) and
unpacks only the fields ClassStats needs with ``struct``, about 50x faster.
Writes and full reads (diffing) stay in kernel/tc.py on pyroute2.

Read-only: it never sends anything but dump requests.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

from ..errors import KernelError
from ..state import HANDLE_MAJOR, ROOT_HANDLE
from .tc import ClassStats

NETLINK_ROUTE = 0
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_GETLINK, RTM_GETQDISC, RTM_GETTCLASS = 18, 38, 42
IFLA_IFNAME = 3
TCA_KIND, TCA_OPTIONS, TCA_STATS2 = 1, 2, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE, TCA_STATS_APP = 1, 3, 4
TCA_HTB_PARMS, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 6, 7
TC_H_ROOT = 0xFFFFFFFF
NLA_TYPE_MASK = 0x3FFF

_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BBHiII")
_TCMSG = struct.Struct("=BBHiIII")
_RTA = struct.Struct("=HH")
_BASIC = struct.Struct("=QI")
_QUEUE = struct.Struct("=IIIII")  # qlen, backlog, drops, requeues, overlimits
_HTB_XSTATS = struct.Struct("=IIIii")  # lends, borrows, giants, tokens, ctokens
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_CLONE_NEWNET = 0x40000000


def _attrs(buf: bytes, off: int, end: int) -> dict[int, tuple[int, int]]:
    """{type: (start, end)} of the attributes in buf[off:end] (last one wins)."""
    out = {}
    while off + 4 <= end:
        length, typ = _RTA.unpack_from(buf, off)
        if length < 4:
            break
        out[typ & NLA_TYPE_MASK] = (off + 4, off + length)
        off += (length + 3) & ~3
    return out


def _socket_in(netns: str | None) -> socket.socket:
    if not netns:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    libc = ctypes.CDLL(None, use_errno=True)
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            try:
                return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
            finally:
                libc.setns(here, _CLONE_NEWNET)  # a socket keeps the namespace it was made in
        finally:
            os.close(target)
    finally:
        os.close(here)


class StatsReader:
    """One raw rtnetlink socket; ``sample()`` reads every shaperd class on every shaped device."""

    def __init__(self, netns: str | None = None):
        try:
            self.sock = _socket_in(netns)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self.sock.bind((0, 0))
        except OSError as e:
            raise KernelError("open", "rtnetlink socket", netns or "this namespace", e.strerror or str(e), e.errno) from e
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def _dump(self, mtype: int, body: bytes, what: str, device: str):
        """Yield (buffer, payload offset, message end) of each reply message."""
        self.seq += 1
        seq = self.seq
        hdr = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), mtype, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
        try:
            self.sock.send(hdr + body)
            while True:
                buf = self.sock.recv(1 << 16)
                off = 0
                while off + _NLMSGHDR.size <= len(buf):
                    length, typ, _flags, mseq, _pid = _NLMSGHDR.unpack_from(buf, off)
                    if length < _NLMSGHDR.size:
                        return
                    if mseq == seq:
                        if typ == NLMSG_DONE:
                            return
                        if typ == NLMSG_ERROR:
                            (err,) = struct.unpack_from("=i", buf, off + _NLMSGHDR.size)
                            if err:
                                raise KernelError("dump", what, device, os.strerror(-err), -err)
                            return
                        yield buf, off + _NLMSGHDR.size, off + length
                    off += (length + 3) & ~3
        except OSError as e:
            raise KernelError("dump", what, device, e.strerror or str(e), e.errno) from e

    def links(self) -> dict[int, str]:
        out = {}
        for buf, off, end in self._dump(RTM_GETLINK, _IFINFOMSG.pack(0, 0, 0, 0, 0, 0), "links", "node"):
            index = _IFINFOMSG.unpack_from(buf, off)[3]
            a = _attrs(buf, off + _IFINFOMSG.size, end)
            if IFLA_IFNAME in a:
                s, e = a[IFLA_IFNAME]
                out[index] = bytes(buf[s:e]).rstrip(b"\0").decode()
        return out

    def owned_ifindexes(self) -> set[int]:
        out = set()
        for buf, off, end in self._dump(RTM_GETQDISC, _TCMSG.pack(0, 0, 0, 0, 0, 0, 0), "qdiscs", "node"):
            _f, _p1, _p2, index, handle, parent, _info = _TCMSG.unpack_from(buf, off)
            if parent != TC_H_ROOT or handle != ROOT_HANDLE:
                continue
            a = _attrs(buf, off + _TCMSG.size, end)
            if TCA_KIND in a and bytes(buf[a[TCA_KIND][0]:a[TCA_KIND][1]]).rstrip(b"\0") == b"htb":
                out.add(index)
        return out

    def classes(self, device: str, ifindex: int) -> dict[int, ClassStats]:
        out = {}
        req = _TCMSG.pack(0, 0, 0, ifindex, 0, 0, 0)
        for buf, off, end in self._dump(RTM_GETTCLASS, req, "classes", device):
            _f, _p1, _p2, index, handle, parent, _info = _TCMSG.unpack_from(buf, off)
            if index != ifindex or handle >> 16 != HANDLE_MAJOR:
                continue
            a = _attrs(buf, off + _TCMSG.size, end)
            if TCA_KIND not in a or bytes(buf[a[TCA_KIND][0]:a[TCA_KIND][1]]).rstrip(b"\0") != b"htb":
                continue
            if TCA_OPTIONS not in a:
                continue
            o = _attrs(buf, *a[TCA_OPTIONS])
            if TCA_HTB_PARMS not in o:
                continue
            p = o[TCA_HTB_PARMS][0]
            rate, ceil = _U32.unpack_from(buf, p + 8)[0], _U32.unpack_from(buf, p + 20)[0]
            prio = _U32.unpack_from(buf, p + 40)[0]
            if TCA_HTB_RATE64 in o:
                rate = _U64.unpack_from(buf, o[TCA_HTB_RATE64][0])[0]
            if TCA_HTB_CEIL64 in o:
                ceil = _U64.unpack_from(buf, o[TCA_HTB_CEIL64][0])[0]
            nbytes = packets = qlen = backlog = drops = overlimits = lends = borrows = tokens = ctokens = 0
            if TCA_STATS2 in a:
                s = _attrs(buf, *a[TCA_STATS2])
                if TCA_STATS_BASIC in s:
                    nbytes, packets = _BASIC.unpack_from(buf, s[TCA_STATS_BASIC][0])
                if TCA_STATS_QUEUE in s:
                    qlen, backlog, drops, _req, overlimits = _QUEUE.unpack_from(buf, s[TCA_STATS_QUEUE][0])
                if TCA_STATS_APP in s and s[TCA_STATS_APP][1] - s[TCA_STATS_APP][0] >= _HTB_XSTATS.size:
                    lends, borrows, _giants, tokens, ctokens = _HTB_XSTATS.unpack_from(buf, s[TCA_STATS_APP][0])
            out[handle] = ClassStats(
                classid=handle, parent=parent, rate_Bps=rate, ceil_Bps=ceil, prio=prio, bytes=nbytes,
                packets=packets, drops=drops, overlimits=overlimits, backlog_bytes=backlog, qlen=qlen,
                borrows=borrows, lends=lends, tokens=tokens, ctokens=ctokens,
            )
        return out

    def sample(self) -> dict[tuple[str, int], ClassStats]:
        """{(device, classid): ClassStats} for every shaperd class on every shaped device."""
        names = self.links()
        out = {}
        for idx in sorted(self.owned_ifindexes()):
            dev = names.get(idx, str(idx))
            for cid, st in self.classes(dev, idx).items():
                out[(dev, cid)] = st
        return out
