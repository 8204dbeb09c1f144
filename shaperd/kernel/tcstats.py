"""Every read shaperd makes from the kernel, over a raw rtnetlink socket.

tc state (the reconciler reads each device before diffing, the metrics
sampler reads every class twice a second) and discovery's facts (links,
default routes, the route and bridge port of a pod IP). pyroute2 decodes
every attribute of every message into objects, which costs ~100 ms for 8
devices x 66 classes (bench/scrape.py) and ~35 ms for 500 filters
(bench/apply_perf.py), and 0.9 leaves the ack of every single-route request
in an unread queue (a leak per pod per reconcile, bench/pod_churn.py). This
module sends the same requests and unpacks only the fields shaperd uses with
``struct``. Writes stay in kernel/tc.py on pyroute2.

Read-only: it sends dump and get requests, nothing else.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
import socket
import struct

from ..errors import KernelError
from ..state import (
    HANDLE_MAJOR,
    PRIO_MARK_INGRESS,
    ROOT_HANDLE,
    TC_H_INGRESS_PARENT,
    DeviceState,
    LeafQdisc,
    ObservedClass,
    ObservedFilter,
    RootQdisc,
    U32Key,
)


@dataclass(frozen=True)
class RawLink:
    name: str
    ifindex: int
    kind: str
    mtu: int
    up: bool


@dataclass
class ClassStats:
    """Counters of one HTB class, as the kernel reports them."""

    classid: int
    parent: int
    rate_Bps: int
    ceil_Bps: int
    prio: int
    bytes: int
    packets: int
    drops: int
    overlimits: int
    backlog_bytes: int
    qlen: int
    borrows: int
    lends: int
    tokens: int
    ctokens: int

NETLINK_ROUTE = 0
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_GETLINK, RTM_GETQDISC, RTM_GETTCLASS, RTM_GETTFILTER = 18, 38, 42, 46
RTM_GETROUTE, RTM_GETNEIGH = 26, 30
IFLA_MTU, IFLA_LINKINFO, IFLA_INFO_KIND = 4, 18, 1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_MULTIPATH, RTA_TABLE, RTA_VIA = 1, 4, 5, 6, 9, 15, 18
RT_TABLE_MAIN, RTN_UNICAST = 254, 1
NDA_DST, NDA_LLADDR, NDA_MASTER = 1, 2, 9
_RTMSG = struct.Struct("=BBBBBBBBI")
_NDMSG = struct.Struct("=BBHiHBB")
TCA_HTB_INIT = 2
TCA_FQ_CODEL_LIMIT = 2
TCA_U32_CLASSID, TCA_U32_DIVISOR, TCA_U32_SEL, TCA_U32_MARK = 1, 4, 5, 10
TCA_BPF_CLASSID, TCA_BPF_NAME = 3, 7
_U32_SEL_HEAD = 16  # struct tc_u32_sel before its keys
_U32_KEY = struct.Struct("!II")  # mask, val (network order); then off, offmask in host order
_I32 = struct.Struct("=i")
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


def _rta(typ: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return _RTA.pack(length, typ) + data + b"\0" * (((length + 3) & ~3) - length)


def _str(buf: bytes, span) -> str:
    if span is None:
        return ""
    return bytes(buf[span[0]:span[1]]).rstrip(b"\0").decode(errors="replace")


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

    def _exchange(self, mtype: int, flags: int, body: bytes, what: str, device: str):
        """Send one request; yield (type, buffer, payload offset, message end) of each reply to it."""
        self.seq += 1
        seq = self.seq
        hdr = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), mtype, NLM_F_REQUEST | flags, seq, 0)
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
                        yield typ, buf, off + _NLMSGHDR.size, off + length
                    off += (length + 3) & ~3
        except OSError as e:
            raise KernelError("read", what, device, e.strerror or str(e), e.errno) from e

    def _dump(self, mtype: int, body: bytes, what: str, device: str):
        """Yield (buffer, payload offset, message end) of each message of a dump."""
        for typ, buf, off, end in self._exchange(mtype, NLM_F_DUMP, body, what, device):
            if typ == NLMSG_DONE:
                return
            if typ == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", buf, off)
                if err:
                    raise KernelError("dump", what, device, os.strerror(-err), -err)
                return
            yield buf, off, end

    def _request(self, mtype: int, body: bytes, what: str, device: str):
        """One non-dump request (no ack asked): (buf, payload offset, end) of the reply, or None on a kernel error."""
        for typ, buf, off, end in self._exchange(mtype, 0, body, what, device):
            return None if typ == NLMSG_ERROR else (buf, off, end)  # an error is e.g. ENETUNREACH: no route
        return None

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

    def _htb_classes(self, device: str, ifindex: int):
        """Yield (buf, top-level attrs, handle, parent, info, HTB fields) for shaperd's classes on a device.

        HTB fields: (rate_Bps, ceil_Bps, buffer_ticks, cbuffer_ticks, quantum, prio) from
        struct tc_htb_opt, with the 64-bit rates where the kernel sends them.
        """
        req = _TCMSG.pack(0, 0, 0, ifindex, 0, 0, 0)
        for buf, off, end in self._dump(RTM_GETTCLASS, req, "classes", device):
            _f, _p1, _p2, index, handle, parent, info = _TCMSG.unpack_from(buf, off)
            if index != ifindex or handle >> 16 != HANDLE_MAJOR:
                continue
            a = _attrs(buf, off + _TCMSG.size, end)
            if _str(buf, a.get(TCA_KIND)) != "htb" or TCA_OPTIONS not in a:
                continue
            o = _attrs(buf, *a[TCA_OPTIONS])
            if TCA_HTB_PARMS not in o:
                continue
            p = o[TCA_HTB_PARMS][0]
            rate, ceil = _U32.unpack_from(buf, p + 8)[0], _U32.unpack_from(buf, p + 20)[0]
            buffer, cbuffer, quantum, _level, prio = struct.unpack_from("=IIIII", buf, p + 24)
            if TCA_HTB_RATE64 in o:
                rate = _U64.unpack_from(buf, o[TCA_HTB_RATE64][0])[0]
            if TCA_HTB_CEIL64 in o:
                ceil = _U64.unpack_from(buf, o[TCA_HTB_CEIL64][0])[0]
            yield buf, a, handle, parent, info, (rate, ceil, buffer, cbuffer, quantum, prio)

    def classes(self, device: str, ifindex: int) -> dict[int, ClassStats]:
        out = {}
        for buf, a, handle, parent, _info, (rate, ceil, _b, _cb, _q, prio) in self._htb_classes(device, ifindex):
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

    # -- the reconciler's reads -------------------------------------------------
    def qdiscs(self, ifindex: int = 0, device: str = "node"):
        """[(ifindex, handle, parent, kind, limit, default_minor)] for every qdisc (of one device)."""
        out = []
        for buf, off, end in self._dump(RTM_GETQDISC, _TCMSG.pack(0, 0, 0, ifindex, 0, 0, 0), "qdiscs", device):
            _f, _p1, _p2, index, handle, parent, _info = _TCMSG.unpack_from(buf, off)
            if ifindex and index != ifindex:
                continue
            a = _attrs(buf, off + _TCMSG.size, end)
            kind = _str(buf, a.get(TCA_KIND))
            limit = default_minor = 0
            if TCA_OPTIONS in a:
                s, e = a[TCA_OPTIONS]
                if kind in ("bfifo", "pfifo") and e - s >= 4:
                    limit = _U32.unpack_from(buf, s)[0]  # struct tc_fifo_qopt, not nested
                elif kind == "fq_codel":
                    o = _attrs(buf, s, e)
                    if TCA_FQ_CODEL_LIMIT in o:
                        limit = _U32.unpack_from(buf, o[TCA_FQ_CODEL_LIMIT][0])[0]
                elif kind == "htb":
                    o = _attrs(buf, s, e)
                    if TCA_HTB_INIT in o:
                        default_minor = _U32.unpack_from(buf, o[TCA_HTB_INIT][0] + 8)[0]  # tc_htb_glob.defcls
            out.append((index, handle, parent, kind, limit, default_minor))
        return out

    def device_state(self, device: str, ifindex: int, qdiscs=None) -> DeviceState:
        """Root qdisc, shaperd's classes, leaves and filters on one device (three dumps at most)."""
        st = DeviceState(device=device, ifindex=ifindex, root=None)
        for index, handle, parent, kind, limit, default_minor in (qdiscs if qdiscs is not None else self.qdiscs(ifindex, device)):
            if index != ifindex:
                continue
            if parent == TC_H_ROOT:
                st.root = RootQdisc(kind=kind, handle=handle, default_minor=default_minor)
            elif parent >> 16 == HANDLE_MAJOR:
                st.leaves[parent] = LeafQdisc(parent=parent, handle=handle, kind=kind, limit=limit)
        if not st.owned:
            return st  # nothing under a foreign or default root is ours to read
        for _buf, _a, handle, parent, info, (rate, ceil, buffer, cbuffer, quantum, prio) in \
                self._htb_classes(device, ifindex):
            # A top-level class reports TC_H_ROOT as parent; shaperd creates it under the qdisc handle.
            st.classes[handle] = ObservedClass(
                classid=handle, parent=ROOT_HANDLE if parent == TC_H_ROOT else parent, rate_Bps=rate,
                ceil_Bps=ceil, buffer_ticks=buffer, cbuffer_ticks=cbuffer, quantum_bytes=quantum, prio=prio,
                leaf_handle=info,
            )
        st.filters = self.filters(device, ifindex, ROOT_HANDLE)
        return st

    def filters(self, device: str, ifindex: int, parent: int) -> list[ObservedFilter]:
        out = []
        req = _TCMSG.pack(0, 0, 0, ifindex, 0, parent, 0)
        for buf, off, end in self._dump(RTM_GETTFILTER, req, "filters", device):
            _f, _p1, _p2, index, handle, fparent, info = _TCMSG.unpack_from(buf, off)
            if index != ifindex or handle == 0:
                continue
            a = _attrs(buf, off + _TCMSG.size, end)
            kind = _str(buf, a.get(TCA_KIND))
            base = dict(kind=kind, prio=info >> 16, protocol=socket.ntohs(info & 0xFFFF), handle=handle, parent=fparent)
            o = _attrs(buf, *a[TCA_OPTIONS]) if TCA_OPTIONS in a else {}
            if kind == "u32":
                # Hash tables (node id 0) and divisor entries are structure, not filters.
                if handle & 0xFFF == 0 or TCA_U32_DIVISOR in o:
                    continue
                cid = _U32.unpack_from(buf, o[TCA_U32_CLASSID][0])[0] if TCA_U32_CLASSID in o else 0
                keys: tuple[U32Key, ...] = ()
                if TCA_U32_SEL in o:
                    s0, _e0 = o[TCA_U32_SEL]
                    nkeys = buf[s0 + 2]
                    ks = []
                    for i in range(nkeys):
                        k = s0 + _U32_SEL_HEAD + 16 * i
                        mask, val = _U32_KEY.unpack_from(buf, k)
                        ks.append(U32Key(val, mask, _I32.unpack_from(buf, k + 8)[0]))
                    keys = tuple(sorted(ks, key=lambda x: x.offset))
                mark = None
                if TCA_U32_MARK in o:
                    mv, mm = struct.unpack_from("=II", buf, o[TCA_U32_MARK][0])
                    mark = (mv, mm) if (mv or mm) else None
                out.append(ObservedFilter(**base, classid=cid, keys=keys, mark=mark))
            elif kind == "bpf":
                cid = _U32.unpack_from(buf, o[TCA_BPF_CLASSID][0])[0] if TCA_BPF_CLASSID in o else 0
                out.append(ObservedFilter(**base, classid=cid, name=_str(buf, o.get(TCA_BPF_NAME))))
            else:
                out.append(ObservedFilter(**base))
        return out

    def owned(self, qdiscs=None) -> set[int]:
        """Devices whose root qdisc is shaperd's."""
        return {i for i, h, p, k, _l, _d in (qdiscs if qdiscs is not None else self.qdiscs())
                if p == TC_H_ROOT and h == ROOT_HANDLE and k == "htb"}

    def marks(self, qdiscs=None) -> tuple[dict[int, ObservedFilter], set[int]]:
        """shaperd's mark programs on host-side interfaces, and the devices that have a clsact qdisc."""
        clsact = {i for i, _h, _p, k, _l, _d in (qdiscs if qdiscs is not None else self.qdiscs()) if k == "clsact"}
        found: dict[int, ObservedFilter] = {}
        for idx in sorted(clsact):
            try:
                filters = self.filters(str(idx), idx, TC_H_INGRESS_PARENT)
            except KernelError:
                continue  # the interface went away between the two dumps: nothing to do there
            for f in filters:
                if f.kind == "bpf" and f.prio == PRIO_MARK_INGRESS and f.name.startswith("shpdm_"):
                    found[idx] = f
        return found, clsact

    # -- discovery's reads: links, routes, neighbours ---------------------------
    def link_list(self) -> list[RawLink]:
        """Every link: name, index, kind (IFLA_INFO_KIND), MTU, administratively up."""
        out = []
        for buf, off, end in self._dump(RTM_GETLINK, _IFINFOMSG.pack(0, 0, 0, 0, 0, 0), "links", "node"):
            _fam, _pad, _type, index, flags, _change = _IFINFOMSG.unpack_from(buf, off)
            a = _attrs(buf, off + _IFINFOMSG.size, end)
            kind = ""
            if IFLA_LINKINFO in a:
                kind = _str(buf, _attrs(buf, *a[IFLA_LINKINFO]).get(IFLA_INFO_KIND))
            mtu = _U32.unpack_from(buf, a[IFLA_MTU][0])[0] if IFLA_MTU in a else 1500
            out.append(RawLink(name=_str(buf, a.get(IFLA_IFNAME)), ifindex=index, kind=kind, mtu=mtu, up=bool(flags & 1)))
        return out

    def default_route_ifindexes(self) -> list[int]:
        """Output devices of the main table's default routes (IPv4 first, then IPv6), by metric."""
        found: list[tuple[int, int, int]] = []
        for n, family in enumerate((socket.AF_INET, socket.AF_INET6)):
            req = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
            for buf, off, end in self._dump(RTM_GETROUTE, req, "routes", "node"):
                fam, dst_len, _sl, _tos, table, _proto, _scope, rtype, _flags = _RTMSG.unpack_from(buf, off)
                a = _attrs(buf, off + _RTMSG.size, end)
                if RTA_TABLE in a:
                    table = _U32.unpack_from(buf, a[RTA_TABLE][0])[0]
                if fam != family or dst_len != 0 or table != RT_TABLE_MAIN or rtype != RTN_UNICAST:
                    continue
                metric = _U32.unpack_from(buf, a[RTA_PRIORITY][0])[0] if RTA_PRIORITY in a else 0
                if RTA_OIF in a:
                    found.append((n, metric, _U32.unpack_from(buf, a[RTA_OIF][0])[0]))
                if RTA_MULTIPATH in a:  # struct rtnexthop { u16 len; u8 flags; u8 hops; s32 ifindex; } + attrs
                    pos, stop = a[RTA_MULTIPATH]
                    while pos + 8 <= stop:
                        nh_len, _f, _h, nh_if = struct.unpack_from("=HBBi", buf, pos)
                        found.append((n, metric, nh_if))
                        if nh_len < 8:
                            break
                        pos += (nh_len + 3) & ~3
        return list(dict.fromkeys(i for _, _, i in sorted(found)))

    def route_oif(self, ip: str) -> int | None:
        """Interface a local endpoint is reached on directly (no gateway), or None.

        A single RTM_GETROUTE request without an ack: pyroute2 0.9 leaves the
        ack of every such request in an unread queue (a leak per pod per
        reconcile, found by bench/pod_churn.py).
        """
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        addr = socket.inet_pton(family, ip)
        body = _RTMSG.pack(family, len(addr) * 8, 0, 0, 0, 0, 0, 0, 0) + _rta(RTA_DST, addr)
        reply = self._request(RTM_GETROUTE, body, f"route to {ip}", "node")
        if reply is None:
            return None
        buf, off, end = reply
        a = _attrs(buf, off + _RTMSG.size, end)
        if RTA_GATEWAY in a or RTA_VIA in a or RTA_OIF not in a:
            return None
        return _U32.unpack_from(buf, a[RTA_OIF][0])[0]

    def bridge_port_of(self, bridge_ifindex: int, ip: str) -> int | None:
        """The bridge port behind which ``ip`` lives: neighbour entry (IP -> MAC), then FDB (MAC -> port)."""
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        want = socket.inet_pton(family, ip)
        mac = None
        for buf, off, end in self._dump(RTM_GETNEIGH, _NDMSG.pack(family, 0, 0, bridge_ifindex, 0, 0, 0),
                                        "neighbours", str(bridge_ifindex)):
            _f, _p1, _p2, index, _state, _flags, _t = _NDMSG.unpack_from(buf, off)
            a = _attrs(buf, off + _NDMSG.size, end)
            if index == bridge_ifindex and NDA_DST in a and bytes(buf[slice(*a[NDA_DST])]) == want and NDA_LLADDR in a:
                mac = bytes(buf[slice(*a[NDA_LLADDR])])
                break
        if mac is None:
            return None
        for buf, off, end in self._dump(RTM_GETNEIGH, _NDMSG.pack(socket.AF_BRIDGE, 0, 0, 0, 0, 0, 0),
                                        "bridge fdb", str(bridge_ifindex)):
            _f, _p1, _p2, index, _state, _flags, _t = _NDMSG.unpack_from(buf, off)
            a = _attrs(buf, off + _NDMSG.size, end)
            if (NDA_LLADDR in a and bytes(buf[slice(*a[NDA_LLADDR])]) == mac and NDA_MASTER in a
                    and _U32.unpack_from(buf, a[NDA_MASTER][0])[0] == bridge_ifindex):
                return index
        return None

    def sample(self) -> dict[tuple[str, int], ClassStats]:
        """{(device, classid): ClassStats} for every shaperd class on every shaped device."""
        names = self.links()
        out = {}
        for idx in sorted(self.owned_ifindexes()):
            dev = names.get(idx, str(idx))
            for cid, st in self.classes(dev, idx).items():
                out[(dev, cid)] = st
        return out
